// File: kernels/cpu/amx_tiles.h
// The tile configuration shared by the AMX kernels (include only from files compiled with
// -mamx-tile): all eight tiles 16 rows x 64 bytes, which is 16 x 16 fp32 for the C tiles and
// 16 x 32 bf16 for A and B. Static, like simd512.h: each file has its own copy.
#pragma once

#include <cstdint>

namespace tinyserve {

struct AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads the configuration into this thread's tile state (pair with _tile_release()).
static inline void LoadAmxTileConfig() {
  alignas(64) AmxTileConfig cfg;
  for (int i = 0; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;
  // Not _tile_loadconfig: GCC 12's asm for it declares only 8 bytes read, so the stores above
  // could be dropped as dead.
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

}  // namespace tinyserve
