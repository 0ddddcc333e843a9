// File: worker/tokenizer/hf_tokenizer_json_test.cc
#include "worker/tokenizer/hf_tokenizer_json.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tinyserve {
namespace {

using ::testing::ElementsAre;

constexpr char kByteLevelJson[] = R"({
  "added_tokens": [{"id": 10, "content": "<|end|>", "special": true},
                   {"id": 11, "content": "<tool>", "special": false}],
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
      {"type": "Digits", "individual_digits": true},
      {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}]},
  "model": {"type": "BPE", "vocab": {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "he": 5,
                                     "ll": 6, "hell": 7, "hello": 8, "1": 9},
            "merges": MERGES}
})";

std::string WithMerges(const std::string& merges) {
  std::string json = kByteLevelJson;
  json.replace(json.find("MERGES"), 6, merges);
  return json;
}

// tokenizer.json of a Llama 3 or Qwen2 model: Split(regex) then ByteLevel(use_regex false).
std::string WithSplit(const std::string& pattern) {
  nlohmann::json j = nlohmann::json::parse(WithMerges(R"(["h e"])"));
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", pattern}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  return j.dump();
}

TEST(HfTokenizerJson, SplitPatternsOfLlama3AndQwen2) {
  const std::string qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  std::string llama3 = qwen2;
  llama3.replace(llama3.find("\\p{N}|"), 6, "\\p{N}{1,3}|");
  for (const auto& [pattern, want] : {std::pair{qwen2, "qwen2"}, std::pair{llama3, "llama-bpe"}}) {
    absl::StatusOr<TokenizerData> data = TokenizerDataFromHfJsonText(WithSplit(pattern), "{}");
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->pre, want);
  }
  // Any other regex would split text differently: refused, not read as GPT-2's.
  absl::StatusOr<TokenizerData> other = TokenizerDataFromHfJsonText(WithSplit("\\s+"), "{}");
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(), ::testing::HasSubstr("Split pattern"));
}

TEST(HfTokenizerJson, ByteLevelWithDigitsIsSmollm) {
  for (const std::string merges : {R"(["h e", "l l", "he ll", "hell o"])",
                                   R"([["h","e"], ["l","l"], ["he","ll"], ["hell","o"]])"}) {
    absl::StatusOr<TokenizerData> data = TokenizerDataFromHfJsonText(
        WithMerges(merges), R"({"eos_token": "<|end|>", "chat_template": "T"})");
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->model, "gpt2");
    EXPECT_EQ(data->pre, "smollm");
    EXPECT_THAT(data->merges, ElementsAre("h e", "l l", "he ll", "hell o"));
    EXPECT_EQ(data->types[10], TokenType::kControl);
    EXPECT_EQ(data->types[11], TokenType::kUserDefined);
    EXPECT_EQ(data->eos_id, 10);
    EXPECT_EQ(data->chat_template, "T");
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Create(*std::move(data));
    ASSERT_TRUE(tok.ok()) << tok.status();
    EXPECT_THAT((*tok)->Encode("hello hello1<|end|>", true, false), ElementsAre(8, 4, 8, 9, 10));
    EXPECT_EQ((*tok)->Decode({8, 4, 8, 9, 10}), "hello hello1<|end|>");
    EXPECT_TRUE((*tok)->IsEog(10));
  }
}

TEST(HfTokenizerJson, MetaspaceIsLlama) {
  const std::string json = R"({
    "added_tokens": [{"id": 0, "content": "<unk>", "special": true},
                     {"id": 1, "content": "<s>", "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"}, {"type": "Replace"}]},
    "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
              "vocab": {"<unk>": 0, "<s>": 1, "<0x0A>": 2, "▁": 3, "h": 4, "i": 5, "▁h": 6,
                        "▁hi": 7},
              "merges": ["▁ h", "▁h i"]}
  })";
  absl::StatusOr<TokenizerData> data = TokenizerDataFromHfJsonText(json, R"({"bos_token": "<s>"})");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->model, "llama");
  EXPECT_TRUE(data->add_space_prefix);
  EXPECT_TRUE(data->add_bos);
  EXPECT_EQ(data->types[2], TokenType::kByte);
  EXPECT_EQ(data->unk_id, 0);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::Create(*std::move(data));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT((*tok)->Encode("hi\n", false, true), ElementsAre(1, 7, 2));
  EXPECT_EQ((*tok)->Decode({7, 2}), "hi\n");
}

TEST(HfTokenizerJson, Errors) {
  EXPECT_EQ(TokenizerDataFromHfJson("/nonexistent/tokenizer.json").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenizerDataFromHfJsonText("{", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenizerDataFromHfJsonText(R"({"model": {"type": "Unigram"}})", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A normalizer TinyServe does not apply is refused by name (NFC is applied: the golden test
  // NfcNormalizerMatchesHfTokenizers in worker/hf).
  for (const char* type : {"NFKC", "Lowercase"}) {
    const std::string json = std::string(R"({"normalizer": {"type": "Sequence", "normalizers": [
        {"type": ")") + type +
                             R"("}]}, "pre_tokenizer": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})";
    const auto r = TokenizerDataFromHfJsonText(json, "");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << type;
    EXPECT_NE(r.status().message().find(type), std::string::npos) << r.status();
  }
  const auto nfc = TokenizerDataFromHfJsonText(
      R"({"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel"},
          "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})",
      "");
  ASSERT_TRUE(nfc.ok()) << nfc.status();
  EXPECT_TRUE(nfc->normalize_nfc);
}

}  // namespace
}  // namespace tinyserve
