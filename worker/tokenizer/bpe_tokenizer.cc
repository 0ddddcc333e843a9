// File: worker/tokenizer/bpe_tokenizer.cc
#include "worker/tokenizer/bpe_tokenizer.h"

#include <deque>
#include <queue>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/tokenizer/byte_level.h"
#include "worker/tokenizer/token_text.h"
#include "worker/tokenizer/unicode.h"

namespace tinyserve {
namespace {

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

BpeTokenizer::BpeTokenizer(TokenizerData data) : Tokenizer(std::move(data)), splitter_(data_) {}

absl::StatusOr<std::unique_ptr<Tokenizer>> BpeTokenizer::Create(TokenizerData data) {
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer(std::move(data)));
  TS_RETURN_IF_ERROR(tok->Init());
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

int32_t BpeTokenizer::Intern(const std::string& s) {
  auto [it, inserted] =
      symbol_ids_.try_emplace(s, static_cast<int32_t>(data_.tokens.size() + extra_symbols_.size()));
  if (inserted) extra_symbols_.push_back(s);
  return it->second;
}

absl::Status BpeTokenizer::Init() {
  TS_ASSIGN_OR_RETURN(pre_kind_, PreTokenizerFromName(data_.pre));
  const int32_t n_vocab = vocab_size();
  symbol_ids_.reserve(n_vocab * 2);
  for (int32_t id = 0; id < n_vocab; ++id) {
    symbol_ids_[data_.tokens[id]] = id;  // a repeated text maps to its last id, as in llama.cpp
  }
  merges_.reserve(data_.merges.size() * 2);
  for (size_t rank = 0; rank < data_.merges.size(); ++rank) {
    const std::string& m = data_.merges[rank];
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: merge ", rank, " ('", m, "') has no space separator"));
    }
    const std::string left = m.substr(0, space);
    const std::string right = m.substr(space + 1);
    const int32_t l = Intern(left);
    const int32_t r = Intern(right);
    const int32_t result = Intern(left + right);
    // The first (lowest-rank) entry for a pair wins.
    merges_.try_emplace(PairKey(l, r), Merge{static_cast<int32_t>(rank), result});
  }
  for (int b = 0; b < 256; ++b) {
    auto it = symbol_ids_.find(EncodeUtf8(ByteToCodepoint(static_cast<uint8_t>(b))));
    byte_symbol_[b] = it == symbol_ids_.end() ? -1 : it->second;
  }
  token_bytes_.resize(n_vocab);
  for (int32_t id = 0; id < n_vocab; ++id) {
    const TokenType type = data_.types.empty() ? TokenType::kNormal : data_.types[id];
    token_bytes_[id] = TokenTextToBytes(data_.tokens[id], type, TokenEscape::kByteLevel);
  }
  return absl::OkStatus();
}

void BpeTokenizer::AppendFallback(int32_t symbol, std::vector<int32_t>* out) const {
  const std::string& text = extra_symbols_[symbol - vocab_size()];
  size_t offset = 0;
  while (offset < text.size()) {
    const size_t start = offset;
    DecodeUtf8(text, &offset);
    auto it = symbol_ids_.find(text.substr(start, offset - start));
    if (it != symbol_ids_.end() && it->second < vocab_size()) out->push_back(it->second);
  }
}

void BpeTokenizer::EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
  struct Symbol {
    int32_t id;  // symbol id; -1 for a byte whose character is unknown (never merges)
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  struct Later {  // lowest rank first, then leftmost
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };

  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_symbol_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1,
                  true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, Later> queue;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t l = symbols[left].id, r = symbols[right].id;
    if (l < 0 || r < 0) return;
    auto it = merges_.find(PairKey(l, r));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, right, l, r, it->second.result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.left];
    Symbol& right = symbols[c.right];
    // Skip candidates made stale by an earlier merge.
    if (!left.alive || !right.alive || left.next != c.right || left.id != c.left_id ||
        right.id != c.right_id) {
      continue;
    }
    left.id = c.result;
    left.next = right.next;
    right.alive = false;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }

  for (int32_t i = 0; i >= 0 && i < n; i = symbols[i].next) {
    const int32_t id = symbols[i].id;
    if (id >= 0 && id < vocab_size()) {
      out->push_back(id);
    } else if (id >= vocab_size()) {
      AppendFallback(id, out);
    }
    // id < 0: a byte with no token at all; llama.cpp drops it too.
  }
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool parse_special,
                                          bool add_bos) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && data_.add_bos && data_.bos_id >= 0) out.push_back(data_.bos_id);
  // Pieces repeat a lot in natural text; remember each one's ids for this call.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> cache;
  std::vector<int32_t> cached_ids;
  std::deque<std::string> normalized;  // NFC copies of fragments (the cache's keys point in)
  for (const TextFragment& fragment : splitter_.Split(text, parse_special)) {
    if (fragment.token >= 0) {
      out.push_back(fragment.token);
      continue;
    }
    // As Hugging Face tokenizers: special tokens are cut out first, the rest normalized.
    std::string_view fragment_text = fragment.text;
    if (data_.normalize_nfc) {
      std::string nfc;
      if (NormalizeNfc(fragment_text, &nfc))
        fragment_text = normalized.emplace_back(std::move(nfc));
    }
    for (std::string_view piece : PreTokenize(fragment_text, pre_kind_)) {
      auto it = cache.find(piece);
      if (it == cache.end()) {
        const size_t begin = cached_ids.size();
        EncodePiece(piece, &cached_ids);
        it = cache.emplace(piece, std::make_pair(begin, cached_ids.size() - begin)).first;
      }
      out.insert(out.end(), cached_ids.begin() + it->second.first,
                 cached_ids.begin() + it->second.first + it->second.second);
    }
  }
  return out;
}

std::string BpeTokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[id];
}

std::string BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size()) out += token_bytes_[id];
  }
  return out;
}

}  // namespace tinyserve
