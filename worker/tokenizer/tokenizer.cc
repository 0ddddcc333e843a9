// File: worker/tokenizer/tokenizer.cc
// Tokenizer::Create (checks the data, picks the implementation), the shared queries, and the
// UTF-8 helpers declared in tokenizer.h.
#include "worker/tokenizer/tokenizer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "worker/tokenizer/bpe_tokenizer.h"
#include "worker/tokenizer/spm_tokenizer.h"
#include "worker/tokenizer/unicode.h"

namespace tinyserve {
namespace {

absl::Status CheckId(const char* field, int32_t id, size_t n_vocab) {
  if (id < -1 || id >= static_cast<int64_t>(n_vocab)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", field, " ", id, " is outside the vocabulary of ", n_vocab));
  }
  return absl::OkStatus();
}

absl::Status CheckData(const TokenizerData& data) {
  const size_t n = data.tokens.size();
  if (n == 0) return absl::InvalidArgumentError("tokenizer: the vocabulary is empty");
  if (!data.types.empty() && data.types.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", data.types.size(), " token types for ", n, " tokens"));
  }
  if (!data.scores.empty() && data.scores.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", data.scores.size(), " token scores for ", n, " tokens"));
  }
  for (auto [field, id] : {std::pair{"bos_id", data.bos_id}, std::pair{"eos_id", data.eos_id},
                           std::pair{"unk_id", data.unk_id}, std::pair{"pad_id", data.pad_id}}) {
    if (absl::Status s = CheckId(field, id, n); !s.ok()) return s;
  }
  for (int32_t id : data.eog_ids) {
    if (absl::Status s = CheckId("eog id", id, n); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerData data) {
  if (absl::Status s = CheckData(data); !s.ok()) return s;
  if (data.model == "gpt2") {
    if (data.pre.empty()) data.pre = "default";
    return BpeTokenizer::Create(std::move(data));
  }
  if (data.model == "llama") return SpmTokenizer::Create(std::move(data));
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer: unsupported model '", data.model, "' (supported: gpt2, llama)"));
}

bool Tokenizer::IsEog(int32_t id) const {
  if (id < 0) return false;
  return id == data_.eos_id ||
         std::find(data_.eog_ids.begin(), data_.eog_ids.end(), id) != data_.eog_ids.end();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  if (id < 0 || id >= vocab_size() || data_.types.empty()) return false;
  const TokenType t = data_.types[id];
  return t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown;
}

bool Tokenizer::IsControl(int32_t id) const {
  return id >= 0 && id < vocab_size() && !data_.types.empty() &&
         data_.types[id] == TokenType::kControl;
}

bool IsValidUtf8(std::string_view s) {
  size_t offset = 0;
  while (offset < s.size()) {
    const size_t start = offset;
    const uint32_t cp = DecodeUtf8(s, &offset);
    // DecodeUtf8 advances one byte on an invalid sequence; a real U+FFFD takes three.
    if (cp == kReplacementChar && offset - start != 3) return false;
  }
  return true;
}

std::string Utf8StreamDecoder::Push(std::string_view bytes) {
  pending_.append(bytes);
  // Hold back a trailing sequence whose lead byte announces more bytes than have arrived.
  size_t keep_from = pending_.size();
  const size_t lookback = std::min<size_t>(pending_.size(), 4);
  for (size_t k = 1; k <= lookback; ++k) {
    const size_t pos = pending_.size() - k;
    const uint8_t b = static_cast<uint8_t>(pending_[pos]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    if (b >= 0xC0 && pos + Utf8SequenceLength(b) > pending_.size()) keep_from = pos;
    break;
  }
  std::string ready = pending_.substr(0, keep_from);
  pending_.erase(0, keep_from);
  return ready;
}

std::string Utf8StreamDecoder::Flush() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace tinyserve
