// File: worker/tokenizer/spm_tokenizer.cc
#include "worker/tokenizer/spm_tokenizer.h"

#include <algorithm>
#include <queue>

#include "worker/tokenizer/token_text.h"
#include "worker/tokenizer/unicode.h"

namespace tinyserve {

SpmTokenizer::SpmTokenizer(TokenizerData data) : Tokenizer(std::move(data)), splitter_(data_) {}

absl::StatusOr<std::unique_ptr<Tokenizer>> SpmTokenizer::Create(TokenizerData data) {
  std::unique_ptr<SpmTokenizer> tok(new SpmTokenizer(std::move(data)));
  tok->Init();
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

void SpmTokenizer::Init() {
  const int32_t n_vocab = vocab_size();
  token_ids_.reserve(n_vocab * 2);
  for (int32_t id = 0; id < n_vocab; ++id) {
    token_ids_[data_.tokens[id]] = id;  // a repeated text maps to its last id, as in llama.cpp
  }
  byte_tokens_.fill(-1);
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char text[7] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>', 0};
    byte_tokens_[b] = Find(text);
  }
  for (const std::string& t : data_.tokens) {
    size_t offset = 0, chars = 0;
    while (offset < t.size()) {
      offset +=
          std::min<size_t>(Utf8SequenceLength(static_cast<uint8_t>(t[offset])), t.size() - offset);
      ++chars;
    }
    if (chars < 2) continue;
    for (offset = 0; offset < t.size();) {
      const size_t len =
          std::min<size_t>(Utf8SequenceLength(static_cast<uint8_t>(t[offset])), t.size() - offset);
      mergeable_chars_.insert(t.substr(offset, len));
      offset += len;
    }
  }
  token_bytes_.resize(n_vocab);
  for (int32_t id = 0; id < n_vocab; ++id) {
    const TokenType type = data_.types.empty() ? TokenType::kNormal : data_.types[id];
    token_bytes_[id] = TokenTextToBytes(data_.tokens[id], type, TokenEscape::kSentencePiece);
  }
}

int32_t SpmTokenizer::Find(std::string_view text) const {
  auto it = token_ids_.find(text);
  return it == token_ids_.end() ? -1 : it->second;
}

float SpmTokenizer::Score(int32_t id) const {
  return data_.scores.empty() ? 0.0f : data_.scores[id];
}

void SpmTokenizer::EncodeFragment(std::string_view text, std::vector<int32_t>* out) const {
  size_t segment_start = 0;
  for (size_t offset = 0; offset < text.size();) {
    const size_t len = std::min<size_t>(Utf8SequenceLength(static_cast<uint8_t>(text[offset])),
                                        text.size() - offset);
    if (mergeable_chars_.count(std::string(text.substr(offset, len))) == 0) {
      if (offset > segment_start) {
        MergeSegment(text.substr(segment_start, offset - segment_start), out);
      }
      MergeSegment(text.substr(offset, len), out);
      segment_start = offset + len;
    }
    offset += len;
  }
  if (segment_start < text.size()) MergeSegment(text.substr(segment_start), out);
}

void SpmTokenizer::MergeSegment(std::string_view view, std::vector<int32_t>* out) const {
  struct Symbol {
    size_t start;
    size_t n;  // bytes; 0 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    float score;
    int32_t left;
    int32_t right;
    size_t size;
  };
  struct Later {  // highest score first, then leftmost
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };

  std::vector<Symbol> symbols;
  symbols.reserve(view.size());
  for (size_t offset = 0; offset < view.size();) {
    const size_t len = std::min<size_t>(Utf8SequenceLength(static_cast<uint8_t>(view[offset])),
                                        view.size() - offset);
    const int32_t index = static_cast<int32_t>(symbols.size());
    symbols.push_back({offset, len, index - 1, offset + len == view.size() ? -1 : index + 1});
    offset += len;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, Later> queue;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols[left].n + symbols[right].n;
    const int32_t id = Find(view.substr(symbols[left].start, size));
    if (id < 0) return;
    queue.push({Score(id), left, right, size});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) consider(i - 1, i);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    Symbol& right = symbols[c.right];
    // A merge since this candidate was queued changed one side's length.
    if (left.n == 0 || right.n == 0 || left.n + right.n != c.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = view.substr(symbols[i].start, symbols[i].n);
    const int32_t id = Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    for (char ch : piece) {
      const int32_t byte_id = byte_tokens_[static_cast<uint8_t>(ch)];
      if (byte_id >= 0) {
        out->push_back(byte_id);
      } else if (data_.unk_id >= 0) {
        out->push_back(data_.unk_id);
      }
    }
  }
}

std::vector<int32_t> SpmTokenizer::Encode(std::string_view text, bool parse_special,
                                          bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 2 + 2);
  if (add_bos && data_.add_bos && data_.bos_id >= 0) out.push_back(data_.bos_id);
  bool after_special = true;  // the text's start counts as following a special token
  for (const TextFragment& fragment : splitter_.Split(text, parse_special)) {
    if (fragment.token >= 0) {
      out.push_back(fragment.token);
      after_special = true;
      continue;
    }
    std::string raw;
    if (data_.add_space_prefix && after_special) raw = " ";
    raw.append(fragment.text);
    EncodeFragment(EscapeSpaces(raw), &out);
    after_special = false;
  }
  return out;
}

std::string SpmTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[id];
}

std::string SpmTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size()) continue;
    std::string_view bytes = token_bytes_[id];
    if (i == 0 && data_.add_space_prefix && !bytes.empty() && bytes[0] == ' ') {
      bytes.remove_prefix(1);
    }
    out += bytes;
  }
  return out;
}

}  // namespace tinyserve
