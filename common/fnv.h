// File: common/fnv.h
// A 64-bit FNV-1a digest of a sequence of byte strings, each followed by a 0xFF separator (a
// byte no UTF-8 text holds), so ("ab", "c") and ("a", "bc") differ. Deterministic across
// processes and builds (absl::Hash is not), for digests that processes compare.
#pragma once

#include <cstdint>
#include <string_view>

namespace tinyserve {

class Fnv1a {
 public:
  void Add(std::string_view bytes) {
    for (unsigned char c : bytes) Byte(c);
    Byte(0xff);
  }
  uint64_t value() const { return h_; }

 private:
  void Byte(unsigned char c) { h_ = (h_ ^ c) * 0x100000001B3ull; }
  uint64_t h_ = 0xCBF29CE484222325ull;
};

}  // namespace tinyserve
