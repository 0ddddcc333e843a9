// File: kernels/cpu/aligned_scratch.h
// A 64-byte aligned, growable scratch buffer, meant as a thread_local of the CPU kernels
// (quantized activations, repacked rows, packed weight tiles). Contents are not kept on growth.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/log.h"

namespace tinyserve {

class AlignedScratch {
 public:
  AlignedScratch() = default;
  AlignedScratch(const AlignedScratch&) = delete;
  AlignedScratch& operator=(const AlignedScratch&) = delete;
  ~AlignedScratch() { std::free(data_); }

  uint8_t* Get(size_t bytes) {
    if (bytes > capacity_) {
      std::free(data_);
      capacity_ = (bytes + 4095) / 4096 * 4096;
      data_ = static_cast<uint8_t*>(std::aligned_alloc(64, capacity_));
      TS_CHECK(data_ != nullptr);
    }
    return data_;
  }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace tinyserve
