// File: worker/gguf/gguf_file.h
// A GGUF v3 (and v2) reader: metadata of every value type and tensor infos, over a read-only
// memory map of the file. Format: shared/reference/model-formats.md §3.
//
// Parsing never trusts the file: every count, length and offset is checked against the bytes
// that remain before anything is allocated, and a malformed file returns InvalidArgument naming
// the field and its byte offset, e.g. "gguf: tensor 'w' ne[1] at byte 90: negative dimension -3"
// or "gguf: tensor 'blk.0.attn_q.weight': data [1024, 9000) runs past the end of the file (8192
// bytes)". Checked: magic; version 2 or 3; tensor, KV, array and string counts against the
// remaining bytes; value type codes; bool bytes (0 or 1); array nesting (at most 8 deep);
// duplicate keys and tensor names; general.alignment (a power of two, default 32); n_dims in
// [1, 4]; ne[j] >= 0 without overflow; ne[0] a multiple of the block size; known ggml type
// codes; offsets aligned and equal to the running total of padded sizes (llama.cpp's rule);
// tensor data inside the file. It never crashes (gguf_fuzz.cc; gguf_file_test MutationSmoke).
//
// Thread safety: immutable after Open/Parse; any thread may read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/ggml_types.h"

namespace tinyserve {

enum class GgufValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// "u8", "string", "array", ...: for error messages.
std::string_view GgufValueTypeName(GgufValueType type);

// One metadata value. Integers of every width are held widened; `type` keeps the stored type.
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> value;

  // Conversions that accept any compatible stored type (u8..i64 for integers; f32, f64 for
  // floats; integers also convert to double). nullopt when the type does not fit.
  std::optional<int64_t> AsInt() const;
  std::optional<double> AsDouble() const;
  std::optional<bool> AsBool() const;
  const std::string* AsString() const;
  const std::vector<GgufValue>* AsArray() const;
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;  // ne[0] is the fastest-varying dimension (the row length)
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;      // from the start of the data section
  const uint8_t* data = nullptr;  // into the mapping
  size_t nbytes = 0;
  int64_t NumElements() const;
};

class GgufFile {
 public:
  // Maps the file read-only and parses it. NotFound if the path does not exist.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes that the caller keeps alive for the life of the result (tests, fuzzing).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  // Byte offset of the data section from the start of the file.
  uint64_t data_offset() const { return data_offset_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  const GgufValue* Find(std::string_view key) const;
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // Typed lookups: NotFound naming the key if absent; InvalidArgument naming the key and the
  // stored type if it has the wrong type.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<double>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<std::vector<int64_t>> GetIntArray(std::string_view key) const;

  // Lets the kernel drop this process's pages of [data, data + bytes) (the whole pages inside
  // it) when the range lies in the file's read-only mapping: a later read brings them back from
  // the file. For tensors copied at load (repacked, converted), whose mapped pages would
  // otherwise stay counted in the process's memory. Anything else (Parse's caller-owned bytes)
  // is left alone.
  void DropPages(const void* data, size_t bytes) const;

 private:
  GgufFile() = default;
  absl::Status ParseImpl(const uint8_t* data, size_t size);

  void* map_ = nullptr;
  size_t map_size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace tinyserve
