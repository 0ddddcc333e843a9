// Writes jinja_fuzz's seed corpus: each template of tests/golden/chat/chat_templates.json as a
// file in the directory given (run from the repository root).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "nlohmann/json.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: jinja_fuzz_seeds DIR\n";
    return 2;
  }
  std::ifstream in("tests/golden/chat/chat_templates.json");
  if (!in) {
    std::cerr << "jinja_fuzz_seeds: tests/golden/chat/chat_templates.json not found\n";
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  const auto golden = nlohmann::json::parse(text.str());
  std::filesystem::create_directories(argv[1]);
  int n = 0;
  for (const auto& [name, source] : golden["templates"].items()) {
    std::ofstream(std::filesystem::path(argv[1]) / ("seed" + std::to_string(n++))) << source.get<std::string>();
  }
  std::cout << n << " seeds in " << argv[1] << "\n";
  return 0;
}
