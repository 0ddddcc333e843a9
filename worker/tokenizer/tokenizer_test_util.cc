// File: worker/tokenizer/tokenizer_test_util.cc
#include "worker/tokenizer/tokenizer_test_util.h"

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "common/status.h"
#include "worker/gguf/gguf_file.h"

namespace tinyserve {
namespace {

absl::StatusOr<int32_t> OptionalId(const GgufFile& f, const char* key) {
  if (f.Find(key) == nullptr) return -1;
  TS_ASSIGN_OR_RETURN(int64_t v, f.GetInt(key));
  return v >= 0 && v < (int64_t{1} << 31) ? static_cast<int32_t>(v) : -1;
}

bool OptionalBool(const GgufFile& f, const char* key, bool fallback) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr || !v->AsBool().has_value()) return fallback;
  return *v->AsBool();
}

// SHA-256 (FIPS 180-4), enough for golden digests.
class Sha256 {
 public:
  void Update(const uint8_t* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      block_[fill_++] = data[i];
      if (fill_ == 64) {
        Compress();
        fill_ = 0;
      }
    }
    bits_ += uint64_t{n} * 8;
  }
  std::string HexDigest() {
    const uint64_t bits = bits_;
    const uint8_t pad = 0x80, zero = 0;
    Update(&pad, 1);
    while (fill_ != 56) Update(&zero, 1);
    for (int i = 7; i >= 0; --i) {
      const uint8_t b = static_cast<uint8_t>(bits >> (i * 8));
      Update(&b, 1);
    }
    std::string hex;
    char buf[9];
    for (uint32_t v : h_) {
      std::snprintf(buf, sizeof(buf), "%08x", v);
      hex += buf;
    }
    return hex;
  }

 private:
  static uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void Compress() {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i) {
      w[i] = (uint32_t{block_[4 * i]} << 24) | (uint32_t{block_[4 * i + 1]} << 16) |
             (uint32_t{block_[4 * i + 2]} << 8) | block_[4 * i + 3];
    }
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 =
          h + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
    h_[4] += e;
    h_[5] += f;
    h_[6] += g;
    h_[7] += h;
  }

  std::array<uint32_t, 8> h_ = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, 64> block_{};
  size_t fill_ = 0;
  uint64_t bits_ = 0;
};

}  // namespace

absl::StatusOr<TokenizerData> LoadGgufTokenizerData(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::Open(path));
  TokenizerData t;
  TS_ASSIGN_OR_RETURN(t.model, f->GetString("tokenizer.ggml.model"));
  if (f->Find("tokenizer.ggml.pre") != nullptr) {
    TS_ASSIGN_OR_RETURN(t.pre, f->GetString("tokenizer.ggml.pre"));
  }
  TS_ASSIGN_OR_RETURN(t.tokens, f->GetStringArray("tokenizer.ggml.tokens"));
  if (f->Find("tokenizer.ggml.scores") != nullptr) {
    TS_ASSIGN_OR_RETURN(std::vector<double> scores, f->GetFloatArray("tokenizer.ggml.scores"));
    t.scores.assign(scores.begin(), scores.end());
  }
  if (f->Find("tokenizer.ggml.token_type") != nullptr) {
    TS_ASSIGN_OR_RETURN(std::vector<int64_t> types, f->GetIntArray("tokenizer.ggml.token_type"));
    for (int64_t v : types) t.types.push_back(static_cast<TokenType>(v));
  }
  if (f->Find("tokenizer.ggml.merges") != nullptr) {
    TS_ASSIGN_OR_RETURN(t.merges, f->GetStringArray("tokenizer.ggml.merges"));
  }
  TS_ASSIGN_OR_RETURN(t.bos_id, OptionalId(*f, "tokenizer.ggml.bos_token_id"));
  TS_ASSIGN_OR_RETURN(t.eos_id, OptionalId(*f, "tokenizer.ggml.eos_token_id"));
  TS_ASSIGN_OR_RETURN(t.unk_id, OptionalId(*f, "tokenizer.ggml.unknown_token_id"));
  TS_ASSIGN_OR_RETURN(t.pad_id, OptionalId(*f, "tokenizer.ggml.padding_token_id"));
  const bool is_llama = t.model == "llama";
  t.add_bos = OptionalBool(*f, "tokenizer.ggml.add_bos_token", is_llama);
  t.add_space_prefix = OptionalBool(*f, "tokenizer.ggml.add_space_prefix", is_llama);
  if (t.eos_id >= 0) t.eog_ids.push_back(t.eos_id);
  if (f->Find("tokenizer.chat_template") != nullptr) {
    TS_ASSIGN_OR_RETURN(t.chat_template, f->GetString("tokenizer.chat_template"));
  }
  return t;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string IdsSha256(const std::vector<int32_t>& ids) {
  Sha256 sha;
  for (int32_t id : ids) {
    const uint32_t v = static_cast<uint32_t>(id);
    const uint8_t le[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8),
                           static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 24)};
    sha.Update(le, 4);
  }
  return sha.HexDigest();
}

}  // namespace tinyserve
