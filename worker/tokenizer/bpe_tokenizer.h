// File: worker/tokenizer/bpe_tokenizer.h
// Byte-level BPE (TokenizerData::model == "gpt2"), as llama.cpp's llm_tokenizer_bpe_session
// and Hugging Face's ByteLevel BPE do it:
//   1. special-token text is cut out (special_tokens.h);
//   2. each raw fragment is pre-tokenized (pre_tokenizer.h);
//   3. each piece's bytes are mapped through bytes_to_unicode (byte_level.h), one symbol per
//      byte, and the adjacent pair of lowest merge rank is merged until none is left (ties:
//      leftmost first);
//   4. each final symbol is its token; one missing from the vocabulary falls back to the
//      tokens of its single characters.
// Merge ranks are looked up on interned symbol ids, so a piece costs O(n log n) integer work.
// Encode keeps a per-call cache of pieces already seen.
//
// Thread safety: immutable after Create.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/pre_tokenizer.h"
#include "worker/tokenizer/special_tokens.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {

class BpeTokenizer final : public Tokenizer {
 public:
  // REQUIRES: data.model == "gpt2" and data already checked by Tokenizer::Create.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerData data);

  std::vector<int32_t> Encode(std::string_view text, bool parse_special,
                              bool add_bos) const override;
  std::string TokenBytes(int32_t id) const override;
  std::string Decode(const std::vector<int32_t>& ids) const override;

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // symbol id of the merged string
  };

  explicit BpeTokenizer(TokenizerData data);
  absl::Status Init();
  int32_t Intern(const std::string& s);
  void EncodePiece(std::string_view piece, std::vector<int32_t>* out) const;
  void AppendFallback(int32_t symbol, std::vector<int32_t>* out) const;

  PreTokenizerKind pre_kind_ = PreTokenizerKind::kGpt2;
  SpecialTokenSplitter splitter_;
  // Symbol ids: [0, vocab_size) are the tokens; higher ids are strings that occur in merges
  // but are not tokens (their text is extra_symbols_[id - vocab_size]).
  std::unordered_map<std::string, int32_t> symbol_ids_;
  std::vector<std::string> extra_symbols_;
  std::unordered_map<uint64_t, Merge> merges_;  // key: left << 32 | right
  std::array<int32_t, 256> byte_symbol_{};      // symbol of each byte's mapped character
  std::vector<std::string> token_bytes_;        // TokenBytes of every id
};

}  // namespace tinyserve
