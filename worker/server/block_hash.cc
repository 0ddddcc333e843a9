#include "worker/server/block_hash.h"

#include <string>
#include <string_view>

namespace tinyserve {
namespace {

// splitmix64's finaliser: a cheap, well-mixed 64-bit permutation.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a over the bytes, seeded with the parent hash and the block kind.
uint64_t HashBlock(uint64_t parent, uint64_t kind, std::string_view bytes) {
  uint64_t h = 0xCBF29CE484222325ull ^ Mix(parent ^ kind);
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return Mix(h);
}

constexpr uint64_t kTextKind = 0x7465787400000000ull;   // "text"
constexpr uint64_t kTokenKind = 0x746F6B6E00000000ull;  // "tokn"

constexpr uint64_t kSaltKind = 0x73616C7400000000ull;  // "salt"
constexpr uint64_t kLoraKind = 0x6C6F726100000000ull;  // "lora"

std::vector<uint64_t> HashText(std::string_view text, uint64_t parent) {
  std::vector<uint64_t> out;
  for (size_t off = 0; off + kTextBlockBytes <= text.size(); off += kTextBlockBytes) {
    parent = HashBlock(parent, kTextKind, text.substr(off, kTextBlockBytes));
    out.push_back(parent);
  }
  return out;
}

}  // namespace

uint64_t CacheSaltSeed(std::string_view salt) {
  return salt.empty() ? 0 : HashBlock(0, kSaltKind, salt);
}

std::vector<uint64_t> PromptBlockHashes(const tinyserve::v1::GenerateRequest& request) {
  uint64_t seed = CacheSaltSeed(request.cache_salt());
  if (!request.lora_adapter().empty()) seed = HashBlock(seed, kLoraKind, request.lora_adapter());
  switch (request.prompt_case()) {
    case tinyserve::v1::GenerateRequest::kText:
      return HashText(request.text(), seed);
    case tinyserve::v1::GenerateRequest::kChat: {
      std::string text;
      for (const auto& m : request.chat().messages()) {
        text += m.role();
        text += '\x1f';
        text += m.content();
        text += '\x1e';
      }
      return HashText(text, seed);
    }
    case tinyserve::v1::GenerateRequest::kTokenIds: {
      std::vector<uint64_t> out;
      const auto& ids = request.token_ids().ids();
      uint64_t parent = seed;
      for (int off = 0; off + kTokenBlockSize <= ids.size(); off += kTokenBlockSize) {
        std::string_view bytes(reinterpret_cast<const char*>(ids.data() + off),
                               kTokenBlockSize * sizeof(int32_t));
        parent = HashBlock(parent, kTokenKind, bytes);
        out.push_back(parent);
      }
      return out;
    }
    default:
      return {};
  }
}

}  // namespace tinyserve
