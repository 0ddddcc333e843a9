// File: worker/tokenizer/tokenizer_test_util.h
// Test helpers: TokenizerData straight from a GGUF file's tokenizer.ggml.* metadata (so the
// tokenizer tests do not depend on the model loader), and golden-file access.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {

absl::StatusOr<TokenizerData> LoadGgufTokenizerData(const std::string& path);

// Reads a whole file; NotFound if absent.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// sha256 of the ids as int32 little-endian, lowercase hex.
std::string IdsSha256(const std::vector<int32_t>& ids);

}  // namespace tinyserve
