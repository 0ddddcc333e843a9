// File: worker/gguf/gguf_test_util.h
// A tiny in-memory GGUF writer for tests and fuzz seeds. It writes well-formed files by default
// and lets a test break exactly one thing: the magic, the version, a count, a value type code,
// a tensor's n_dims, ne, type code or offset, or append raw bytes.
//
//   GgufBuilder b;
//   b.AddString("general.architecture", "llama");
//   b.AddU32("llama.block_count", 1);
//   b.AddTensor("token_embd.weight", GgmlType::kF32, {8, 4});
//   std::vector<uint8_t> bytes = b.Build();
//
// Header-only and free of GoogleTest so that the libFuzzer seed writer can use it too.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/ggml_types.h"
#include "worker/gguf/gguf_file.h"

namespace tinyserve {
namespace testing_gguf {

// Little-endian byte sink.
class ByteWriter {
 public:
  template <typename T>
  void Put(T v) {
    uint8_t b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    bytes_.insert(bytes_.end(), b, b + sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
  }
  void PutBytes(const std::vector<uint8_t>& b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  void PadTo(uint64_t alignment) {
    while (bytes_.size() % alignment != 0) bytes_.push_back(0);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

inline uint32_t Code(GgufValueType t) { return static_cast<uint32_t>(t); }

class GgufBuilder {
 public:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type = 0;
    std::optional<uint32_t> n_dims;  // override the written n_dims (default ne.size())
    std::optional<uint64_t> offset;  // override the computed offset
    std::vector<uint8_t> data;       // written in the data section
  };

  // Header fields a test may break.
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;  // override the true counts
  std::optional<uint64_t> kv_count;
  uint64_t alignment = 32;  // layout alignment; add general.alignment yourself to declare it
  uint64_t truncate_to = UINT64_MAX;  // cut the built file to this many bytes

  // Metadata. `AddRaw` writes type code and payload as given.
  void AddRaw(const std::string& key, uint32_t type_code, const std::vector<uint8_t>& payload) {
    ByteWriter w;
    w.PutString(key);
    w.Put<uint32_t>(type_code);
    w.PutBytes(payload);
    kvs_.push_back(std::move(w.bytes()));
  }
  template <typename T>
  static std::vector<uint8_t> Le(T v) {
    ByteWriter w;
    w.Put<T>(v);
    return std::move(w.bytes());
  }
  void AddU8(const std::string& k, uint8_t v) { AddRaw(k, Code(GgufValueType::kU8), Le(v)); }
  void AddI8(const std::string& k, int8_t v) { AddRaw(k, Code(GgufValueType::kI8), Le(v)); }
  void AddU16(const std::string& k, uint16_t v) { AddRaw(k, Code(GgufValueType::kU16), Le(v)); }
  void AddI16(const std::string& k, int16_t v) { AddRaw(k, Code(GgufValueType::kI16), Le(v)); }
  void AddU32(const std::string& k, uint32_t v) { AddRaw(k, Code(GgufValueType::kU32), Le(v)); }
  void AddI32(const std::string& k, int32_t v) { AddRaw(k, Code(GgufValueType::kI32), Le(v)); }
  void AddU64(const std::string& k, uint64_t v) { AddRaw(k, Code(GgufValueType::kU64), Le(v)); }
  void AddI64(const std::string& k, int64_t v) { AddRaw(k, Code(GgufValueType::kI64), Le(v)); }
  void AddF32(const std::string& k, float v) { AddRaw(k, Code(GgufValueType::kF32), Le(v)); }
  void AddF64(const std::string& k, double v) { AddRaw(k, Code(GgufValueType::kF64), Le(v)); }
  void AddBool(const std::string& k, bool v) { AddBoolByte(k, v ? 1 : 0); }
  void AddBoolByte(const std::string& k, uint8_t b) {
    AddRaw(k, Code(GgufValueType::kBool), {b});
  }
  void AddString(const std::string& k, const std::string& v) {
    ByteWriter w;
    w.PutString(v);
    AddRaw(k, Code(GgufValueType::kString), w.bytes());
  }
  void AddStringArray(const std::string& k, const std::vector<std::string>& v) {
    ByteWriter w;
    w.Put<uint32_t>(Code(GgufValueType::kString));
    w.Put<uint64_t>(v.size());
    for (const std::string& s : v) w.PutString(s);
    AddRaw(k, Code(GgufValueType::kArray), w.bytes());
  }
  template <typename T>
  void AddArray(const std::string& k, GgufValueType elem, const std::vector<T>& v) {
    ByteWriter w;
    w.Put<uint32_t>(Code(elem));
    w.Put<uint64_t>(v.size());
    for (const T& x : v) w.Put<T>(x);
    AddRaw(k, Code(GgufValueType::kArray), w.bytes());
  }

  // Tensors, laid out in order with the running padded offsets unless overridden. `data`
  // defaults to zeros of the right size (for supported types).
  Tensor& AddTensor(const std::string& name, GgmlType type, const std::vector<uint64_t>& ne,
                    std::vector<uint8_t> data = {}) {
    return AddTensorCode(name, static_cast<uint32_t>(type), ne, std::move(data));
  }
  Tensor& AddTensorCode(const std::string& name, uint32_t type, const std::vector<uint64_t>& ne,
                        std::vector<uint8_t> data = {}) {
    Tensor t;
    t.name = name;
    t.ne = ne;
    t.type = type;
    if (data.empty()) {
      if (const GgmlTypeInfo* info = GetGgmlTypeInfo(type); info != nullptr) {
        uint64_t n = 1;
        for (uint64_t d : ne) n *= d;
        data.assign(n / info->block_size * info->block_bytes, 0);
      }
    }
    t.data = std::move(data);
    tensors_.push_back(std::move(t));
    return tensors_.back();
  }

  std::vector<Tensor>& tensors() { return tensors_; }

  std::vector<uint8_t> Build() const {
    ByteWriter w;
    w.Put<uint32_t>(magic);
    w.Put<uint32_t>(version);
    w.Put<uint64_t>(tensor_count.value_or(tensors_.size()));
    w.Put<uint64_t>(kv_count.value_or(kvs_.size()));
    for (const auto& kv : kvs_) w.PutBytes(kv);
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      w.PutString(t.name);
      w.Put<uint32_t>(t.n_dims.value_or(static_cast<uint32_t>(t.ne.size())));
      for (uint64_t d : t.ne) w.Put<uint64_t>(d);
      w.Put<uint32_t>(t.type);
      w.Put<uint64_t>(t.offset.value_or(offset));
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    w.PadTo(alignment);
    for (const Tensor& t : tensors_) {
      w.PutBytes(t.data);
      w.PadTo(alignment);
    }
    std::vector<uint8_t> out = std::move(w.bytes());
    if (out.size() > truncate_to) out.resize(truncate_to);
    return out;
  }

 private:
  std::vector<std::vector<uint8_t>> kvs_;
  std::vector<Tensor> tensors_;
};

inline bool WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(f);
}

// A complete, tiny llama model: 2 layers, dim 16, 4 heads / 2 KV heads (head_dim 4), FFN 32,
// a SentencePiece-style vocabulary of 8 tokens, F32 norms and mixed-type matrices. Tests
// change it with `tweak` before the file is built.
struct TinyLlamaOptions {
  bool with_output = false;      // an untied output.weight
  bool with_freq_base = true;    // llama.rope.freq_base = 500000
  bool with_vocab_size = false;  // llama.vocab_size
  std::string arch = "llama";
};

inline GgufBuilder TinyLlama(const TinyLlamaOptions& o = {}) {
  constexpr uint64_t kDim = 32, kHeads = 4, kKvHeads = 2, kHd = 8, kFfn = 64, kVocab = 8;
  GgufBuilder b;
  b.AddString("general.architecture", o.arch);
  b.AddString("general.name", "tiny");
  const std::string a = o.arch;
  b.AddU32(a + ".context_length", 128);
  b.AddU32(a + ".embedding_length", kDim);
  b.AddU32(a + ".block_count", 2);
  b.AddU32(a + ".feed_forward_length", kFfn);
  b.AddU32(a + ".attention.head_count", kHeads);
  b.AddU32(a + ".attention.head_count_kv", kKvHeads);
  b.AddF32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  if (o.with_freq_base) b.AddF32(a + ".rope.freq_base", 500000.0f);
  if (o.with_vocab_size) b.AddU32(a + ".vocab_size", kVocab);
  b.AddString("tokenizer.ggml.model", "llama");
  b.AddStringArray("tokenizer.ggml.tokens",
                   {"<unk>", "<s>", "</s>", "<|im_end|>", "\xe2\x96\x81" "a", "b", "<|endoftext|>",
                    "c"});
  b.AddArray<float>("tokenizer.ggml.scores", GgufValueType::kF32,
                    {0, 0, 0, 0, -1, -2, -3, -4});
  // <|im_end|> is CONTROL (an end of generation); <|endoftext|> is NORMAL here (not one).
  b.AddArray<int32_t>("tokenizer.ggml.token_type", GgufValueType::kI32,
                      {2, 3, 3, 3, 1, 1, 1, 1});
  b.AddU32("tokenizer.ggml.bos_token_id", 1);
  b.AddU32("tokenizer.ggml.eos_token_id", 2);
  b.AddU32("tokenizer.ggml.unknown_token_id", 0);
  b.AddU32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
  b.AddTensor("token_embd.weight", GgmlType::kQ8_0, {kDim, kVocab});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    b.AddTensor(p + "attn_norm.weight", GgmlType::kF32, {kDim});
    b.AddTensor(p + "attn_q.weight", GgmlType::kQ4_1, {kDim, kHeads * kHd});
    b.AddTensor(p + "attn_k.weight", GgmlType::kQ4_0, {kDim, kKvHeads * kHd});
    b.AddTensor(p + "attn_v.weight", GgmlType::kQ5_0, {kDim, kKvHeads * kHd});
    b.AddTensor(p + "attn_output.weight", GgmlType::kF16, {kHeads * kHd, kDim});
    b.AddTensor(p + "ffn_norm.weight", GgmlType::kF32, {kDim});
    b.AddTensor(p + "ffn_gate.weight", GgmlType::kQ5_1, {kDim, kFfn});
    b.AddTensor(p + "ffn_up.weight", GgmlType::kBF16, {kDim, kFfn});
    b.AddTensor(p + "ffn_down.weight", GgmlType::kQ8_0, {kFfn, kDim});
  }
  b.AddTensor("output_norm.weight", GgmlType::kF32, {kDim});
  if (o.with_output) b.AddTensor("output.weight", GgmlType::kQ8_0, {kDim, kVocab});
  return b;
}

}  // namespace testing_gguf
}  // namespace tinyserve
