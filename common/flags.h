// File: common/flags.h
// A small command-line parser for the subcommands: `--name value`, `--name=value`, boolean
// `--name`, and positional arguments. Each command declares its flags with help text, so
// `--help` prints them and an unknown flag is an error naming it.
//
//   FlagSet flags("generate", "Generate text from a prompt.");
//   std::string model = DefaultModelPath();
//   int max_tokens = 128;
//   flags.String("model", &model, "GGUF file or Hugging Face folder");
//   flags.Int("max-tokens", &max_tokens, "tokens to generate");
//   if (auto s = flags.Parse(argc, argv); !s.ok()) ...
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tinyserve {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  void String(const std::string& name, std::string* value, const std::string& help);
  void Int(const std::string& name, int* value, const std::string& help);
  void Int64(const std::string& name, int64_t* value, const std::string& help);
  void Float(const std::string& name, float* value, const std::string& help);
  void Double(const std::string& name, double* value, const std::string& help);
  void Bool(const std::string& name, bool* value, const std::string& help);
  // A flag that may be given several times; each occurrence appends.
  void StringList(const std::string& name, std::vector<std::string>* value,
                  const std::string& help);

  // Parses args (without the program and command names). InvalidArgument names the flag on
  // an unknown flag, a missing value or a value that does not parse.
  absl::Status Parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_; }
  const std::vector<std::string>& positional() const { return positional_; }
  bool WasSet(const std::string& name) const;
  std::string Usage() const;

 private:
  struct Flag {
    std::string name, help, default_text;
    bool is_bool = false;
    std::function<absl::Status(const std::string&)> set;
  };
  void Add(Flag flag);

  std::string command_, summary_;
  std::vector<Flag> flags_;
  std::vector<std::string> set_;
  std::vector<std::string> positional_;
  bool help_ = false;
};

}  // namespace tinyserve
