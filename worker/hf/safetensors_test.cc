#include "worker/hf/safetensors.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "common/fp16.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/hf/safetensors_test_util.h"

namespace tinyserve {
namespace {

using ::testing::HasSubstr;
using ::tinyserve::testing::FloatTensor;
using ::tinyserve::testing::MakeF32Safetensors;
using ::tinyserve::testing::SafetensorsFromHeader;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> ParseString(const std::string& bytes) {
  return SafetensorsFile::Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                "t.safetensors");
}

// Parses a file whose header is `header` and whose data section has `data_bytes` zero bytes;
// returns the error message (empty if it parsed).
std::string ErrorOf(const std::string& header, size_t data_bytes = 64) {
  const std::string bytes = SafetensorsFromHeader(header, std::string(data_bytes, '\0'));
  auto f = ParseString(bytes);
  if (f.ok()) return "";
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  return std::string(f.status().message());
}

float F32At(const SafetensorsTensor& t, size_t i) {
  float f;
  std::memcpy(&f, t.data + 4 * i, 4);
  return f;
}

TEST(SafetensorsTest, ParsesF32Tensors) {
  const std::string bytes = MakeF32Safetensors({
      {"a", {2, 3}, {1, 2, 3, 4, 5, 6}},
      {"b", {3}, {7, 8, 9}},
      {"scalar", {}, {10}},
  });
  auto f = ParseString(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ((*f)->tensors().size(), 3u);  // __metadata__ is not a tensor
  const SafetensorsTensor* a = (*f)->Find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, SafetensorsDtype::kF32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->NumElements(), 6);
  EXPECT_EQ(a->nbytes, 24u);
  EXPECT_EQ(F32At(*a, 5), 6.0f);
  const SafetensorsTensor* b = (*f)->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(F32At(*b, 0), 7.0f);
  const SafetensorsTensor* s = (*f)->Find("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->NumElements(), 1);
  EXPECT_EQ(F32At(*s, 0), 10.0f);
  EXPECT_EQ((*f)->Find("missing"), nullptr);
}

TEST(SafetensorsTest, ParsesHalfTypes) {
  const uint16_t h = FloatToFp16(1.5f), bf = FloatToBf16(-2.0f);
  std::string data(4, '\0');
  std::memcpy(&data[0], &h, 2);
  std::memcpy(&data[2], &bf, 2);
  const std::string bytes =
      SafetensorsFromHeader(R"({"h":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},)"
                            R"("b":{"dtype":"BF16","shape":[1,1],"data_offsets":[2,4]}})",
                            data);
  auto f = ParseString(bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Find("h")->dtype, SafetensorsDtype::kF16);
  EXPECT_EQ((*f)->Find("b")->dtype, SafetensorsDtype::kBF16);
  uint16_t got;
  std::memcpy(&got, (*f)->Find("b")->data, 2);
  EXPECT_EQ(Bf16ToFloat(got), -2.0f);
  EXPECT_EQ(SafetensorsDtypeName(SafetensorsDtype::kBF16), "BF16");
}

TEST(SafetensorsTest, EmptyHeaderObjectIsAnEmptyFile) {
  auto f = ParseString(SafetensorsFromHeader("{}", ""));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE((*f)->tensors().empty());
}

TEST(SafetensorsTest, RejectsShortFileAndBadHeaderLength) {
  auto f = ParseString("abc");
  EXPECT_THAT(f.status().message(), HasSubstr("too short for the 8-byte header length"));
  EXPECT_THAT(f.status().message(), HasSubstr("t.safetensors"));

  std::string bytes = SafetensorsFromHeader("{}", "");
  bytes[0] = 100;  // claims 100 header bytes, has 2
  f = ParseString(bytes);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr("header length 100 runs past the end"));

  bytes = SafetensorsFromHeader("{}", "");
  bytes[7] = '\x80';  // 2^63 + 2
  f = ParseString(bytes);
  EXPECT_THAT(f.status().message(), HasSubstr("runs past the end"));
}

TEST(SafetensorsTest, RejectsBadJson) {
  EXPECT_THAT(ErrorOf(R"({"a": {"dtype": "F32",)"), HasSubstr("is not valid JSON"));
  EXPECT_THAT(ErrorOf("[1, 2]"), HasSubstr("header is not a JSON object"));
  EXPECT_THAT(ErrorOf(R"({"a": 5})"), HasSubstr("tensor 'a': entry is not an object"));
}

TEST(SafetensorsTest, RejectsBadDtype) {
  EXPECT_THAT(ErrorOf(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})"),
              HasSubstr("tensor 'w': field 'dtype' missing"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})"),
              HasSubstr("tensor 'w': dtype 'I64' is not supported"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": 3, "shape": [1], "data_offsets": [0, 8]}})"),
              HasSubstr("field 'dtype' missing or not a string"));
}

TEST(SafetensorsTest, RejectsBadShape) {
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})"),
              HasSubstr("tensor 'w': field 'shape' missing"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "F32", "shape": [2, -1], "data_offsets": [0, 4]}})"),
              HasSubstr("tensor 'w': shape [2,-1] has a non-integer or negative dimension"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})"),
              HasSubstr("non-integer"));
  EXPECT_THAT(
      ErrorOf(
          R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}})"),
      HasSubstr("tensor 'w': shape [4294967296,4294967296] overflows"));
}

TEST(SafetensorsTest, RejectsBadOffsets) {
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "F32", "shape": [1]}})"),
              HasSubstr("tensor 'w': field 'data_offsets' must be two"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})"),
              HasSubstr("field 'data_offsets'"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})"),
              HasSubstr("field 'data_offsets'"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})"),
              HasSubstr("tensor 'w': data_offsets [8, 4) has begin > end"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [60, 76]}})", 64),
              HasSubstr("tensor 'w': data_offsets [60, 76) run past the end of the data "
                        "section (64 bytes)"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "F32", "shape": [4, 8], "data_offsets": [0, 96]}})", 128),
              HasSubstr("tensor 'w': data_offsets [0, 96) hold 96 bytes but shape [4, 8] of F32 "
                        "needs 128"));
  EXPECT_THAT(ErrorOf(R"({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 12]}})"),
              HasSubstr("shape [3] of BF16 needs 6"));
}

class SafetensorsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ts_safetensors_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(SafetensorsFileTest, OpensAMappedFile) {
  const std::string path = Write("m.safetensors", MakeF32Safetensors({{"x", {2}, {3, 4}}}));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->path(), path);
  EXPECT_EQ(F32At(*(*f)->Find("x"), 1), 4.0f);

  auto missing = SafetensorsFile::Open((dir_ / "nope.safetensors").string());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.safetensors"));

  auto empty = SafetensorsFile::Open(Write("empty.safetensors", ""));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("empty.safetensors"));
}

TEST_F(SafetensorsFileTest, IndexParsing) {
  auto map = ParseSafetensorsIndex(
      R"({"metadata": {"total_size": 8},)"
      R"( "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}})",
      "idx.json");
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->at("b"), "s2.safetensors");

  EXPECT_THAT(ParseSafetensorsIndex("{", "idx.json").status().message(),
              HasSubstr("'idx.json': not a JSON object"));
  EXPECT_THAT(ParseSafetensorsIndex(R"({"metadata": {}})", "idx.json").status().message(),
              HasSubstr("field 'weight_map' missing"));
  EXPECT_THAT(ParseSafetensorsIndex(R"({"weight_map": {"a": 1}})", "idx.json").status().message(),
              HasSubstr("weight_map['a'] is not a string"));
  EXPECT_THAT(ParseSafetensorsIndex(R"({"weight_map": {"a": "../x.safetensors"}})", "idx.json")
                  .status()
                  .message(),
              HasSubstr("weight_map['a'] = '../x.safetensors' is not a plain file name"));
}

TEST_F(SafetensorsFileTest, ShardedCheckpoint) {
  Write("model-1.safetensors", MakeF32Safetensors({{"a", {1}, {1}}, {"extra", {1}, {9}}}));
  Write("model-2.safetensors", MakeF32Safetensors({{"b", {2}, {2, 3}}}));
  Write("model.safetensors.index.json",
        R"({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}})");
  auto ckpt = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->files().size(), 2u);
  EXPECT_EQ((*ckpt)->tensors().size(), 2u);  // the index is the authority: "extra" is unlisted
  ASSERT_NE((*ckpt)->Find("b"), nullptr);
  EXPECT_EQ(F32At(*(*ckpt)->Find("b"), 1), 3.0f);
  EXPECT_EQ((*ckpt)->Find("extra"), nullptr);

  // The index names a tensor its shard does not hold.
  Write("model.safetensors.index.json",
        R"({"weight_map": {"a": "model-1.safetensors", "b": "model-1.safetensors"}})");
  auto bad = SafetensorsCheckpoint::Open(dir_.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("tensor 'b' is mapped to 'model-1.safetensors', which has no such tensor"));

  // A shard that does not exist.
  Write("model.safetensors.index.json", R"({"weight_map": {"a": "model-9.safetensors"}})");
  bad = SafetensorsCheckpoint::Open(dir_.string());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(bad.status().message(), HasSubstr("model-9.safetensors"));
}

TEST_F(SafetensorsFileTest, SingleFileAndMissingCheckpoint) {
  auto none = SafetensorsCheckpoint::Open(dir_.string());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("neither model.safetensors nor"));

  Write("model.safetensors", MakeF32Safetensors({{"a", {1}, {5}}}));
  auto ckpt = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->files().size(), 1u);
  EXPECT_EQ(F32At(*(*ckpt)->Find("a"), 0), 5.0f);

  auto no_dir = SafetensorsCheckpoint::Open((dir_ / "absent").string());
  EXPECT_EQ(no_dir.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tinyserve
