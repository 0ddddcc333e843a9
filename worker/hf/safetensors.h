// File: worker/hf/safetensors.h
// A reader for Hugging Face safetensors files and sharded checkpoints, over read-only memory
// maps. Format (shared/reference/model-formats.md §8): an 8-byte little-endian header length N,
// N bytes of JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
// (plus an optional "__metadata__" object, ignored), then the raw row-major data; offsets count
// from the end of the header.
//
// Parsing never trusts the file: the header length, the JSON, every dtype, shape and offset
// pair are checked (in range, no overflow, end - begin == elements * dtype size), and a bad file
// is InvalidArgument naming the file, the tensor and the field, e.g.
//   "safetensors 'm.safetensors': tensor 'wte.weight': data_offsets [0, 96) hold 96 bytes but
//    shape [4, 8] of F32 needs 128".
// Supported dtypes: F32, F16, BF16; any other is InvalidArgument naming the tensor and dtype.
//
// Sharded checkpoints: model.safetensors.index.json holds {"weight_map": {tensor: file}};
// SafetensorsCheckpoint opens either that or a single model.safetensors.
//
// Thread safety: immutable after Open/Parse; any thread may read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

enum class SafetensorsDtype { kF32, kF16, kBF16 };

// "F32", "F16", "BF16".
std::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
size_t SafetensorsDtypeSize(SafetensorsDtype dtype);
// The ggml type of the same encoding (F32, F16, BF16).
GgmlType SafetensorsToGgml(SafetensorsDtype dtype);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;     // HF (row-major) order: shape.back() varies fastest
  const uint8_t* data = nullptr;  // into the mapping; valid while the file lives
  size_t nbytes = 0;
  int64_t NumElements() const;
};

class SafetensorsFile {
 public:
  // Maps the file read-only and parses it. NotFound naming the path if it does not exist.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses bytes that the caller keeps alive for the life of the result; `label` names the
  // file in errors.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(const uint8_t* data, size_t size,
                                                                std::string label);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return label_; }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(std::string_view name) const;

 private:
  SafetensorsFile() = default;
  absl::Status ParseImpl(const uint8_t* data, size_t size);

  std::string label_;
  void* map_ = nullptr;  // owned mmap, or nullptr for Parse()
  size_t map_size_ = 0;
  std::map<std::string, SafetensorsTensor> tensors_;
};

// Parses model.safetensors.index.json text: the "weight_map" object, tensor name -> file name.
// File names must be plain names (no '/' or ".."). `label` names the file in errors.
absl::StatusOr<std::map<std::string, std::string>> ParseSafetensorsIndex(std::string_view json,
                                                                         const std::string& label);

// All tensors of a checkpoint folder: model.safetensors.index.json and its shards if the index
// exists, else model.safetensors. Every tensor the index names must be in the shard it names.
class SafetensorsCheckpoint {
 public:
  // NotFound naming the folder if it has neither file.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  const std::map<std::string, const SafetensorsTensor*>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(std::string_view name) const;
  // The files opened, in name order (one for an unsharded checkpoint).
  std::vector<std::string> files() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsTensor*> tensors_;
};

}  // namespace tinyserve
