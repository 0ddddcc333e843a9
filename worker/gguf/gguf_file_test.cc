#include "worker/gguf/gguf_file.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/paths.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/gguf/gguf_test_util.h"

namespace tinyserve {
namespace {

using ::testing::HasSubstr;
using testing_gguf::GgufBuilder;

absl::StatusOr<std::unique_ptr<GgufFile>> ParseBytes(const std::vector<uint8_t>& bytes) {
  return GgufFile::Parse(bytes.data(), bytes.size());
}

// A valid file with one KV and one tensor, for the malformed cases to break.
GgufBuilder Minimal() {
  GgufBuilder b;
  b.AddString("general.architecture", "llama");
  b.AddTensor("w", GgmlType::kF32, {4, 2});
  return b;
}

// Asserts InvalidArgument whose message holds every one of `parts`.
void ExpectInvalid(const std::vector<uint8_t>& bytes, std::vector<std::string> parts) {
  auto r = ParseBytes(bytes);
  ASSERT_FALSE(r.ok()) << "parsed a malformed file";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  for (const std::string& p : parts) EXPECT_THAT(std::string(r.status().message()), HasSubstr(p));
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

TEST(GgufFileTest, ParsesMinimalFile) {
  const std::vector<uint8_t> bytes = Minimal().Build();
  auto r = ParseBytes(bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.tensors().size(), 1u);
  const GgufTensorInfo* t = f.FindTensor("w");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->ne, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(t->NumElements(), 8);
  EXPECT_EQ(t->nbytes, 32u);
  EXPECT_EQ(t->data, bytes.data() + f.data_offset());
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.FindTensor("x"), nullptr);
}

TEST(GgufFileTest, AcceptsVersion2) {
  GgufBuilder b = Minimal();
  b.version = 2;
  auto r = ParseBytes(b.Build());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->version(), 2u);
}

TEST(GgufFileTest, EmptyFileIsAnError) {
  ExpectInvalid({}, {"magic", "byte 0"});
}

TEST(GgufFileTest, BadMagic) {
  GgufBuilder b = Minimal();
  b.magic = 0x46554746;
  ExpectInvalid(b.Build(), {"magic", "byte 0"});
}

TEST(GgufFileTest, UnsupportedVersion) {
  for (uint32_t v : {0u, 1u, 4u, 0xFFFFFFFFu}) {
    GgufBuilder b = Minimal();
    b.version = v;
    ExpectInvalid(b.Build(), {"version", "byte 4", std::to_string(v)});
  }
}

TEST(GgufFileTest, AbsurdTensorCount) {
  GgufBuilder b = Minimal();
  b.tensor_count = uint64_t{1} << 60;
  ExpectInvalid(b.Build(), {"tensor count", "byte 8"});
}

TEST(GgufFileTest, AbsurdKvCount) {
  GgufBuilder b = Minimal();
  b.kv_count = 0xFFFFFFFFFFFFull;
  ExpectInvalid(b.Build(), {"kv count", "byte 16"});
}

TEST(GgufFileTest, AbsurdArrayLength) {
  GgufBuilder b;
  testing_gguf::ByteWriter w;
  w.Put<uint32_t>(testing_gguf::Code(GgufValueType::kU32));
  w.Put<uint64_t>(uint64_t{1} << 40);
  w.Put<uint32_t>(7);
  b.AddRaw("big", testing_gguf::Code(GgufValueType::kArray), w.bytes());
  ExpectInvalid(b.Build(), {"kv 'big'", "array length", "byte "});
}

TEST(GgufFileTest, AbsurdStringLength) {
  GgufBuilder b;
  b.AddRaw("s", testing_gguf::Code(GgufValueType::kString), GgufBuilder::Le<uint64_t>(1000));
  ExpectInvalid(b.Build(), {"kv 's'", "string length 1000", "byte 37"});
}

TEST(GgufFileTest, AbsurdKeyLength) {
  GgufBuilder b;
  testing_gguf::ByteWriter w;
  w.Put<uint64_t>(~uint64_t{0});
  b.AddRaw("k", 0, w.bytes());
  b.kv_count = 1;
  // The first KV's key is fine ("k"); corrupt its length in place instead.
  std::vector<uint8_t> bytes = b.Build();
  const uint64_t huge = ~uint64_t{0} >> 1;
  std::memcpy(bytes.data() + 24, &huge, 8);
  ExpectInvalid(bytes, {"key of kv 0", "byte 24", "string length"});
}

TEST(GgufFileTest, NDimsZeroOrAboveFour) {
  for (uint32_t n : {0u, 5u}) {
    GgufBuilder b = Minimal();
    b.tensors()[0].n_dims = n;
    ExpectInvalid(b.Build(), {"tensor 'w'", "n_dims", std::to_string(n)});
  }
}

TEST(GgufFileTest, NegativeDimension) {
  GgufBuilder b = Minimal();
  b.tensors()[0].ne[1] = static_cast<uint64_t>(int64_t{-3});
  ExpectInvalid(b.Build(), {"tensor 'w'", "ne[1]", "negative"});
}

TEST(GgufFileTest, ElementCountOverflow) {
  GgufBuilder b = Minimal();
  b.tensors()[0].ne = {uint64_t{1} << 31, uint64_t{1} << 31, 4};
  ExpectInvalid(b.Build(), {"tensor 'w'", "ne[2]", "overflow"});
}

TEST(GgufFileTest, SizeLargerThanFile) {
  GgufBuilder b = Minimal();
  b.tensors()[0].ne = {uint64_t{1} << 40, 1};
  ExpectInvalid(b.Build(), {"tensor 'w'", "more bytes than the file"});
}

TEST(GgufFileTest, RowLengthNotMultipleOfBlock) {
  GgufBuilder b;
  b.AddTensor("q", GgmlType::kQ4_0, {48, 2}, std::vector<uint8_t>(64, 0));
  ExpectInvalid(b.Build(), {"tensor 'q'", "ne[0]", "48", "Q4_0 block size 32"});
}

TEST(GgufFileTest, UnknownTensorType) {
  for (uint32_t code : {4u, 16u, 99u}) {  // 4: removed from ggml; 16: IQ2_XXS
    GgufBuilder b;
    b.AddTensorCode("odd", code, {32}, std::vector<uint8_t>(32, 0));
    ExpectInvalid(b.Build(), {"tensor 'odd'", "type code " + std::to_string(code)});
  }
}

TEST(GgufFileTest, UnknownValueType) {
  GgufBuilder b;
  b.AddRaw("weird", 13, {0, 0, 0, 0});
  ExpectInvalid(b.Build(), {"kv 'weird'", "value type", "13", "byte 37"});
}

TEST(GgufFileTest, UnknownArrayElementType) {
  GgufBuilder b;
  testing_gguf::ByteWriter w;
  w.Put<uint32_t>(77);
  w.Put<uint64_t>(0);
  b.AddRaw("arr", testing_gguf::Code(GgufValueType::kArray), w.bytes());
  ExpectInvalid(b.Build(), {"kv 'arr'", "element type", "77"});
}

TEST(GgufFileTest, InvalidBoolByte) {
  GgufBuilder b;
  b.AddBoolByte("flag", 2);
  ExpectInvalid(b.Build(), {"kv 'flag'", "bool", "byte 40"});
}

TEST(GgufFileTest, DuplicateKey) {
  GgufBuilder b;
  b.AddU32("a.b", 1);
  b.AddU32("a.b", 2);
  ExpectInvalid(b.Build(), {"kv 'a.b'", "duplicate key"});
}

TEST(GgufFileTest, DuplicateTensorName) {
  GgufBuilder b = Minimal();
  b.AddTensor("w", GgmlType::kF32, {4});
  ExpectInvalid(b.Build(), {"tensor 'w'", "duplicate tensor name"});
}

TEST(GgufFileTest, OffsetNotAligned) {
  GgufBuilder b = Minimal();
  b.tensors()[0].offset = 8;
  ExpectInvalid(b.Build(), {"tensor 'w' offset", "not a multiple of the alignment 32"});
}

TEST(GgufFileTest, OffsetDisagreesWithRunningTotal) {
  GgufBuilder b = Minimal();
  b.AddTensor("v", GgmlType::kF32, {8});
  b.tensors()[1].offset = 64;  // should be 32: tensor w takes 32 bytes
  std::vector<uint8_t> bytes = b.Build();
  bytes.resize(bytes.size() + 64, 0);  // enough bytes that only the offset rule fails
  ExpectInvalid(bytes, {"tensor 'v' offset", "64", "disagrees with 32"});
}

TEST(GgufFileTest, DataPastEndOfFile) {
  GgufBuilder b = Minimal();
  std::vector<uint8_t> bytes = b.Build();
  bytes.resize(bytes.size() - 4);
  ExpectInvalid(bytes, {"tensor 'w'", "runs past the end of the file"});
}

TEST(GgufFileTest, EveryTruncationFailsCleanly) {
  GgufBuilder b = testing_gguf::TinyLlama();
  const std::vector<uint8_t> bytes = b.Build();
  ASSERT_TRUE(ParseBytes(bytes).ok());
  for (size_t n = 0; n < bytes.size(); n += 7) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
    auto r = ParseBytes(cut);
    EXPECT_FALSE(r.ok()) << "prefix of " << n << " bytes parsed";
  }
}

TEST(GgufFileTest, Alignment) {
  GgufBuilder b = Minimal();
  b.AddU32("general.alignment", 64);
  b.alignment = 64;
  b.AddTensor("v", GgmlType::kF32, {3});
  auto r = ParseBytes(b.Build());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->alignment(), 64u);
  EXPECT_EQ((*r)->FindTensor("v")->offset, 64u);
  EXPECT_EQ((*r)->data_offset() % 64, 0u);
}

TEST(GgufFileTest, AlignmentMustBePowerOfTwo) {
  for (uint32_t a : {0u, 48u}) {
    GgufBuilder b = Minimal();
    b.AddU32("general.alignment", a);
    ExpectInvalid(b.Build(), {"general.alignment", "power of two"});
  }
  GgufBuilder b = Minimal();
  b.AddString("general.alignment", "32");
  ExpectInvalid(b.Build(), {"general.alignment", "string"});
}

TEST(GgufFileTest, AllValueTypesAndAccessors) {
  GgufBuilder b;
  b.AddU8("u8", 200);
  b.AddI8("i8", -100);
  b.AddU16("u16", 60000);
  b.AddI16("i16", -30000);
  b.AddU32("u32", 4000000000u);
  b.AddI32("i32", -2000000000);
  b.AddU64("u64", ~uint64_t{0});
  b.AddI64("i64", -(int64_t{1} << 62));
  b.AddF32("f32", 0.25f);
  b.AddF64("f64", 1e300);
  b.AddBool("yes", true);
  b.AddBool("no", false);
  b.AddString("s", "héllo");
  b.AddStringArray("strs", {"a", "", "ccc"});
  b.AddArray<float>("floats", GgufValueType::kF32, {1.5f, -2});
  b.AddArray<int32_t>("ints", GgufValueType::kI32, {7, -7});
  // An array of two arrays of u8.
  testing_gguf::ByteWriter w;
  w.Put<uint32_t>(testing_gguf::Code(GgufValueType::kArray));
  w.Put<uint64_t>(2);
  for (int k = 0; k < 2; ++k) {
    w.Put<uint32_t>(testing_gguf::Code(GgufValueType::kU8));
    w.Put<uint64_t>(k + 1);
    for (int j = 0; j <= k; ++j) w.Put<uint8_t>(static_cast<uint8_t>(10 * k + j));
  }
  b.AddRaw("nested", testing_gguf::Code(GgufValueType::kArray), w.bytes());
  const std::vector<uint8_t> bytes = b.Build();
  auto r = ParseBytes(bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  const GgufFile& f = **r;
  EXPECT_EQ(f.metadata().size(), 17u);
  EXPECT_EQ(*f.GetInt("u8"), 200);
  EXPECT_EQ(*f.GetInt("i8"), -100);
  EXPECT_EQ(*f.GetInt("u16"), 60000);
  EXPECT_EQ(*f.GetInt("i16"), -30000);
  EXPECT_EQ(*f.GetInt("u32"), 4000000000);
  EXPECT_EQ(*f.GetInt("i32"), -2000000000);
  EXPECT_FALSE(f.Find("u64")->AsInt().has_value());  // does not fit in int64
  EXPECT_EQ(std::get<uint64_t>(f.Find("u64")->value), ~uint64_t{0});
  EXPECT_EQ(*f.GetInt("i64"), -(int64_t{1} << 62));
  EXPECT_EQ(*f.GetFloat("f32"), 0.25);
  EXPECT_EQ(*f.GetFloat("f64"), 1e300);
  EXPECT_EQ(*f.GetFloat("u8"), 200.0);  // integers convert to double
  EXPECT_EQ(f.Find("f32")->type, GgufValueType::kF32);
  EXPECT_EQ(f.Find("yes")->AsBool(), std::optional<bool>(true));
  EXPECT_EQ(f.Find("no")->AsBool(), std::optional<bool>(false));
  EXPECT_EQ(*f.GetString("s"), "héllo");
  EXPECT_EQ(*f.GetStringArray("strs"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(*f.GetFloatArray("floats"), (std::vector<double>{1.5, -2}));
  EXPECT_EQ(*f.GetIntArray("ints"), (std::vector<int64_t>{7, -7}));
  const auto* nested = f.Find("nested")->AsArray();
  ASSERT_NE(nested, nullptr);
  ASSERT_EQ(nested->size(), 2u);
  ASSERT_EQ((*nested)[1].AsArray()->size(), 2u);
  EXPECT_EQ(*(*(*nested)[1].AsArray())[1].AsInt(), 11);

  // Wrong types name the key and the stored type; absent keys are NotFound naming the key.
  auto s = f.GetInt("s");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("'s' holds string"));
  auto ia = f.GetStringArray("ints");
  EXPECT_THAT(std::string(ia.status().message()), HasSubstr("'ints' holds array of i32"));
  auto missing = f.GetString("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'nope'"));
  EXPECT_EQ(f.GetFloat("s").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetFloatArray("strs").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetIntArray("floats").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GgufFileTest, DeeplyNestedArraysAreRefused) {
  GgufBuilder b;
  testing_gguf::ByteWriter w;
  for (int i = 0; i < 100; ++i) {
    w.Put<uint32_t>(testing_gguf::Code(GgufValueType::kArray));
    w.Put<uint64_t>(1);
  }
  w.Put<uint32_t>(0);
  w.Put<uint64_t>(0);
  b.AddRaw("deep", testing_gguf::Code(GgufValueType::kArray), w.bytes());
  ExpectInvalid(b.Build(), {"kv 'deep'", "nested deeper"});
}

TEST(GgufFileTest, OpenMissingFileIsNotFound) {
  auto r = GgufFile::Open("/nonexistent/dir/model.gguf");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("/nonexistent/dir/model.gguf"));
}

TEST(GgufFileTest, OpenNamesThePathInParseErrors) {
  const std::string path = ::testing::TempDir() + "/gguf_bad_magic.gguf";
  ASSERT_TRUE(testing_gguf::WriteFile(path, {'G', 'G', 'U', 'X', 3, 0, 0, 0}));
  auto r = GgufFile::Open(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("magic"));
}

TEST(GgufFileTest, Stories260k) {
  auto r = GgufFile::Open(Stories260kPath());
  ASSERT_TRUE(r.ok()) << r.status();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 19u);
  EXPECT_EQ(f.tensors().size(), 48u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset(), 14176u);
  EXPECT_EQ(f.Find("general.alignment"), nullptr);
  for (const GgufTensorInfo& t : f.tensors()) EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(*f.GetInt("llama.context_length"), 2048);
  EXPECT_EQ(*f.GetInt("llama.embedding_length"), 64);
  EXPECT_EQ(*f.GetInt("llama.feed_forward_length"), 172);
  EXPECT_EQ(*f.GetInt("llama.attention.head_count"), 8);
  EXPECT_EQ(*f.GetInt("llama.attention.head_count_kv"), 4);
  EXPECT_EQ(*f.GetInt("llama.block_count"), 5);
  EXPECT_EQ(*f.GetInt("llama.rope.dimension_count"), 8);
  EXPECT_FLOAT_EQ(static_cast<float>(*f.GetFloat("llama.attention.layer_norm_rms_epsilon")),
                  1e-5f);
  EXPECT_EQ(f.Find("llama.rope.freq_base"), nullptr);
  EXPECT_EQ(f.Find("llama.vocab_size"), nullptr);
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.tokens")->size(), 512u);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.padding_token_id"), 0xFFFFFFFF);
  const GgufTensorInfo* q = f.FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->ne, (std::vector<int64_t>{64, 64}));
  const GgufTensorInfo* k = f.FindTensor("blk.4.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->ne, (std::vector<int64_t>{64, 32}));
  const GgufTensorInfo* last = &f.tensors().back();
  EXPECT_EQ(f.data_offset() + last->offset + last->nbytes, 1185376u);
}

TEST(GgufFileTest, SmolLm2) {
  const std::string path = DefaultModelPath();
  if (!FileExists(path)) GTEST_SKIP() << "no " << path;
  auto r = GgufFile::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  const GgufFile& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.metadata().size(), 33u);
  EXPECT_EQ(f.tensors().size(), 272u);
  std::map<GgmlType, int> by_type;
  for (const GgufTensorInfo& t : f.tensors()) ++by_type[t.type];
  EXPECT_EQ(by_type[GgmlType::kQ4_1], 210);
  EXPECT_EQ(by_type[GgmlType::kQ8_0], 1);
  EXPECT_EQ(by_type[GgmlType::kF32], 61);
  const GgufTensorInfo* e = f.FindTensor("token_embd.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->type, GgmlType::kQ8_0);
  EXPECT_EQ(e->ne, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(e->nbytes, 30081024u);
  EXPECT_EQ(f.FindTensor("output.weight"), nullptr);
  EXPECT_EQ(*f.GetInt("general.file_type"), 3);
  EXPECT_EQ(*f.GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.merges")->front(), "Ġ t");
}

// Mutates a real header (stories260K: 19 KVs, 512-token arrays, 48 tensor infos) and a small
// mixed-type file 20000 times and parses each: no crash, no hang, no out-of-bounds read (run
// under TINYSERVE_SANITIZE=ON to have ASan check the last). A plain-GoogleTest stand-in for the
// libFuzzer target gguf_fuzz.cc, which needs clang.
TEST(GgufFileTest, MutationSmoke) {
  std::vector<uint8_t> stories = ReadAll(Stories260kPath());
  ASSERT_GT(stories.size(), 14176u);
  const std::vector<uint8_t> stories_header(stories.begin(), stories.begin() + 14176);
  const std::vector<uint8_t> tiny_orig = testing_gguf::TinyLlama().Build();
  std::vector<uint8_t> tiny = tiny_orig;

  std::mt19937_64 rng(12345);
  auto uniform = [&rng](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  const uint64_t kInteresting[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 30, 32, 64, 0x7F, 0x80, 0xFF,
                                   0xFFFF, 0xFFFFFFFF, 0x7FFFFFFFFFFFFFFFull, ~uint64_t{0},
                                   uint64_t{1} << 32, uint64_t{1} << 62};
  int parsed_ok = 0;
  constexpr int kIterations = 20000;
  for (int it = 0; it < kIterations; ++it) {
    const bool use_stories = it % 2 == 0;
    std::vector<uint8_t>& buf = use_stories ? stories : tiny;
    const size_t header = use_stories ? stories_header.size() : tiny.size();
    const int n_mutations = 1 + static_cast<int>(uniform(4));
    for (int m = 0; m < n_mutations; ++m) {
      const size_t pos = uniform(header);
      switch (uniform(4)) {
        case 0: buf[pos] ^= static_cast<uint8_t>(1u << uniform(8)); break;
        case 1: buf[pos] = static_cast<uint8_t>(uniform(256)); break;
        case 2: {
          const uint64_t v = kInteresting[uniform(std::size(kInteresting))];
          const size_t width = size_t{1} << uniform(4);  // 1, 2, 4 or 8 bytes
          if (pos + width <= header) std::memcpy(buf.data() + pos, &v, width);
          break;
        }
        case 3: {  // copy a chunk from elsewhere (shifts structure)
          const size_t from = uniform(header), len = 1 + uniform(16);
          if (from + len <= header && pos + len <= header)
            std::memmove(buf.data() + pos, buf.data() + from, len);
          break;
        }
      }
    }
    size_t size = buf.size();
    if (uniform(8) == 0) size = uniform(size + 1);  // truncate too
    // Parse a copy of exactly `size` bytes so that ASan sees any read past the end.
    std::vector<uint8_t> exact(buf.begin(), buf.begin() + size);
    auto r = GgufFile::Parse(exact.data(), exact.size());
    if (r.ok()) {
      ++parsed_ok;
      for (const GgufTensorInfo& t : (*r)->tensors()) {
        ASSERT_GE(t.data, exact.data());
        ASSERT_LE(t.data + t.nbytes, exact.data() + exact.size());
      }
    } else {
      ASSERT_FALSE(r.status().message().empty());
    }
    // Restore the pristine header.
    if (use_stories)
      std::copy(stories_header.begin(), stories_header.end(), stories.begin());
    else
      tiny = tiny_orig;
  }
  // Some mutations hit bytes that do not matter (token text, tensor data).
  EXPECT_GT(parsed_ok, 0);
  EXPECT_LT(parsed_ok, kIterations);
}

}  // namespace
}  // namespace tinyserve
