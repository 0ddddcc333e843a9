// File: worker/tokenizer/spm_tokenizer.h
// SentencePiece-style BPE (TokenizerData::model == "llama"), as llama.cpp's
// llm_tokenizer_spm_session does it (model-formats.md §6.4):
//   1. special-token text is cut out (special_tokens.h);
//   2. each raw fragment that opens the text or follows a special token gets a " " prefix
//      when add_space_prefix is set; every space becomes "▁" (U+2581);
//   3. the fragment is split into UTF-8 characters, and the adjacent pair whose concatenation
//      is the vocabulary entry of highest score is merged until none is left (ties: leftmost);
//   4. each final symbol is its token; one missing from the vocabulary falls back to its
//      bytes' <0xNN> tokens (or UNK when a byte token is missing).
// A character that occurs in no multi-character vocabulary entry can never merge, so the text
// is cut around such characters (newlines, for stories260K) and the pieces are merged
// separately: the same result, with smaller queues.
// Decode strips one leading space from the first token's bytes when add_space_prefix is set.
//
// Thread safety: immutable after Create.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/special_tokens.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {

class SpmTokenizer final : public Tokenizer {
 public:
  // REQUIRES: data.model == "llama" and data already checked by Tokenizer::Create.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerData data);

  std::vector<int32_t> Encode(std::string_view text, bool parse_special,
                              bool add_bos) const override;
  std::string TokenBytes(int32_t id) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;

 private:
  explicit SpmTokenizer(TokenizerData data);
  void Init();
  int32_t Find(std::string_view text) const;
  float Score(int32_t id) const;
  void EncodeFragment(std::string_view text, std::vector<int32_t>* out) const;
  void MergeSegment(std::string_view text, std::vector<int32_t>* out) const;

  SpecialTokenSplitter splitter_;
  std::unordered_map<std::string_view, int32_t> token_ids_;  // views into data_.tokens
  std::array<int32_t, 256> byte_tokens_{};                   // <0xNN> ids, -1 if absent
  std::unordered_set<std::string> mergeable_chars_;          // chars of multi-character entries
  std::vector<std::string> token_bytes_;
};

}  // namespace tinyserve
