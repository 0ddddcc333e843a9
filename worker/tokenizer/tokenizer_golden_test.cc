// File: worker/tokenizer/tokenizer_golden_test.cc
// Every golden of tests/golden/tokenizer (made by scripts/make_tokenizer_goldens.py from
// llama.cpp, cross-checked with Hugging Face tokenizers) must match id for id, and
// Decode(Encode(x)) == x must hold on every text. SmolLM2 tests skip when its GGUF is absent.
// qwen2 is Qwen's real 151,646-token vocabulary (its llama.cpp ids cross-checked with tiktoken,
// Qwen's own tokenizer): the qwen2 pre-tokenizer at scale.
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>

#include "common/paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/tokenizer/pre_tokenizer.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_test_util.h"

namespace tinyserve {
namespace {

using nlohmann::json;
using ::testing::ElementsAreArray;

struct Fixture {
  std::unique_ptr<Tokenizer> tokenizer;
  json golden;
};

std::string ModelPath(const std::string& name) {
  if (name == "qwen2") {
    // Written by the CTest fixture qwen_vocab (scripts/make_qwen_vocab.py).
    const char* env = std::getenv("TINYSERVE_QWEN_VOCAB");
    return env != nullptr ? env : "build/test-models/qwen2-vocab.gguf";
  }
  return name == "smollm2" ? DefaultModelPath() : Stories260kPath();
}

// Loads each model and golden once per process; nullptr tokenizer when the model is absent.
const Fixture& Load(const std::string& name) {
  static std::map<std::string, Fixture> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  Fixture& f = cache[name];
  const std::string path = ModelPath(name);
  if (!FileExists(path)) return f;
  absl::StatusOr<TokenizerData> data = LoadGgufTokenizerData(path);
  EXPECT_TRUE(data.ok()) << data.status();
  if (!data.ok()) return f;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Create(*std::move(data));
  EXPECT_TRUE(tok.ok()) << tok.status();
  if (!tok.ok()) return f;
  absl::StatusOr<std::string> text = ReadWholeFile("tests/golden/tokenizer/" + name + ".json");
  EXPECT_TRUE(text.ok()) << text.status();
  if (!text.ok()) return f;
  f.golden = json::parse(*text);
  f.tokenizer = *std::move(tok);
  return f;
}

class TokenizerGoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    fixture_ = &Load(GetParam());
    if (fixture_->tokenizer == nullptr) {
      GTEST_SKIP() << GetParam() << " model not found at " << ModelPath(GetParam());
    }
  }
  const Tokenizer& tok() const { return *fixture_->tokenizer; }
  const json& golden() const { return fixture_->golden; }
  const Fixture* fixture_ = nullptr;
};

TEST_P(TokenizerGoldenTest, TextFilesMatchLlamaCpp) {
  for (const auto& [file, want] : golden()["texts"].items()) {
    absl::StatusOr<std::string> text = ReadWholeFile(DataDir() + "/text/" + file);
    ASSERT_TRUE(text.ok()) << text.status();
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok().Encode(*text, /*parse_special=*/false,
                                                  /*add_bos=*/false);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("[ %s ] %s: %zu bytes -> %zu tokens in %.1f ms\n", GetParam().c_str(), file.c_str(),
                text->size(), ids.size(), ms);
    const std::vector<int32_t> first = want["first_ids"].get<std::vector<int32_t>>();
    ASSERT_GE(ids.size(), first.size()) << file;
    EXPECT_THAT(std::vector<int32_t>(ids.begin(), ids.begin() + first.size()),
                ElementsAreArray(first))
        << file;
    EXPECT_EQ(ids.size(), want["count"].get<size_t>()) << file;
    EXPECT_EQ(IdsSha256(ids), want["sha256"].get<std::string>()) << file;
    EXPECT_EQ(tok().Decode(ids), *text) << file << ": Decode(Encode(x)) != x";
    EXPECT_LT(ms, 3000.0) << file << " took too long";
  }
}

TEST_P(TokenizerGoldenTest, CasesMatchLlamaCpp) {
  for (const json& c : golden()["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const bool parse_special = c["parse_special"].get<bool>();
    const bool add_bos = c["add_bos"].get<bool>();
    const std::vector<int32_t> ids = tok().Encode(text, parse_special, add_bos);
    EXPECT_THAT(ids, ElementsAreArray(c["ids"].get<std::vector<int32_t>>()))
        << "text '" << text << "' parse_special=" << parse_special << " add_bos=" << add_bos;
  }
}

TEST_P(TokenizerGoldenTest, DecodeMatchesLlamaCppDetokenize) {
  for (const json& c : golden()["cases"]) {
    EXPECT_EQ(tok().Decode(c["ids"].get<std::vector<int32_t>>()), c["decoded"].get<std::string>())
        << "text '" << c["text"].get<std::string>() << "'";
  }
}

TEST_P(TokenizerGoldenTest, DecodeInvertsEncode) {
  for (const json& c : golden()["cases"]) {
    if (c["parse_special"].get<bool>() || c["add_bos"].get<bool>()) continue;
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok().Decode(tok().Encode(text, false, false)), text);
  }
}

TEST_P(TokenizerGoldenTest, TokenBytesConcatenateToDecode) {
  const std::vector<int32_t> ids = tok().Encode("Hello world! 123\n", false, false);
  std::string joined;
  for (int32_t id : ids) joined += tok().TokenBytes(id);
  // Only the llama leading space differs between the two.
  EXPECT_EQ(tok().data().add_space_prefix ? joined.substr(1) : joined, tok().Decode(ids));
}

TEST_P(TokenizerGoldenTest, ChatRenderingMatchesTemplate) {
  if (!golden().contains("chat")) GTEST_SKIP() << "no chat template";
  const json& chat = golden()["chat"];
  std::vector<ChatMessage> messages;
  for (const json& m : chat["messages"]) {
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  const absl::StatusOr<std::string> rendered =
      RenderChat(tok().data(), messages, chat["add_generation_prompt"].get<bool>());
  ASSERT_TRUE(rendered.ok()) << rendered.status();
  const std::string& text = *rendered;
  EXPECT_EQ(text, chat["text"].get<std::string>());
  EXPECT_THAT(tok().Encode(text, /*parse_special=*/true, /*add_bos=*/false),
              ElementsAreArray(chat["ids"].get<std::vector<int32_t>>()));
}

// The Llama 3 and Qwen2 splitters against the pieces Hugging Face tokenizers' Split regex makes
// of the same texts (tests/golden/tokenizer/qwen2.json "pre_tokenizer"); needs no vocabulary.
TEST(PreTokenizerGolden, Llama3AndQwen2MatchHuggingFaceSplit) {
  absl::StatusOr<std::string> text = ReadWholeFile("tests/golden/tokenizer/qwen2.json");
  ASSERT_TRUE(text.ok()) << text.status();
  const json golden = json::parse(*text)["pre_tokenizer"];
  const std::vector<std::string> texts = golden["texts"].get<std::vector<std::string>>();
  ASSERT_GT(texts.size(), 100u);
  for (const auto& [name, kind] : {std::pair{"qwen2", PreTokenizerKind::kQwen2},
                                   std::pair{"llama-bpe", PreTokenizerKind::kLlama3}}) {
    ASSERT_EQ(*PreTokenizerFromName(name), kind);
    const json& want = golden[name];
    ASSERT_EQ(want.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      std::vector<std::string> got;
      for (std::string_view p : PreTokenize(texts[i], kind)) got.emplace_back(p);
      EXPECT_THAT(got, ElementsAreArray(want[i].get<std::vector<std::string>>()))
          << name << " on '" << texts[i] << "'";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TokenizerGoldenTest,
                         ::testing::Values("stories260K", "smollm2", "qwen2"));

// model-formats.md §6.3, stated here as well so that a regenerated golden cannot hide a drift.
TEST(TokenizerSpecVectors, SmolLm2) {
  const Fixture& f = Load("smollm2");
  if (f.tokenizer == nullptr) GTEST_SKIP() << "SmolLM2 model not found";
  const Tokenizer& tok = *f.tokenizer;
  EXPECT_THAT(tok.Encode("The capital of France is", false, false),
              ElementsAreArray({504, 3575, 282, 4649, 314}));
  EXPECT_THAT(tok.Encode("Hello world! 123", false, false),
              ElementsAreArray({19556, 905, 17, 216, 33, 34, 35}));
  EXPECT_THAT(tok.Encode("  multiple   spaces", false, false),
              ElementsAreArray({216, 2701, 256, 5600}));
  EXPECT_THAT(tok.Encode("Café déjà vu.", false, false),
              ElementsAreArray({51, 1939, 2756, 32564, 90, 16739, 386, 101, 30}));
  EXPECT_THAT(tok.Encode("\n", false, false), ElementsAreArray({198}));
  EXPECT_TRUE(tok.IsSpecial(1));
  EXPECT_FALSE(tok.IsSpecial(17));
  EXPECT_TRUE(tok.IsEog(2));
}

TEST(TokenizerSpecVectors, Stories260k) {
  const Fixture& f = Load("stories260K");
  ASSERT_NE(f.tokenizer, nullptr) << "stories260K must be present under " << DataDir();
  const Tokenizer& tok = *f.tokenizer;
  EXPECT_THAT(tok.Encode("Hello world! 123", false, false),
              ElementsAreArray({346, 306, 414, 263, 304, 341, 443, 410, 475, 479, 472}));
  EXPECT_THAT(tok.Encode("Lily's mom said, \"No.\"\n", false, false),
              ElementsAreArray({317, 439, 419, 357, 336, 432, 313, 458, 414, 426, 436, 13}));
  // §9: "Once upon a time" with BOS.
  EXPECT_THAT(tok.Encode("Once upon a time", false, true),
              ElementsAreArray({1, 403, 407, 261, 378}));
  EXPECT_EQ(tok.Decode({403, 407, 261, 378}), "Once upon a time");
}

}  // namespace
}  // namespace tinyserve
