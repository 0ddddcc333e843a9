#include "worker/gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tinyserve {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kDefaultAlignment = 32;
constexpr int kMaxDims = 4;
// Arrays of arrays deeper than this are refused: real files nest at most once, and unbounded
// recursion would let a file exhaust the stack.
constexpr int kMaxArrayDepth = 8;

// Smallest encoding of one value of each type, used to refuse counts the remaining bytes could
// never hold before anything is allocated for them.
uint64_t MinEncodedSize(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16: return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32: return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
    case GgufValueType::kString: return 8;  // the length
    case GgufValueType::kArray: return 12;  // element type and count
  }
  return 1;
}

bool IsKnownValueType(uint32_t code) { return code <= static_cast<uint32_t>(GgufValueType::kF64); }

// A bounds-checked little-endian cursor over the file. Every read names the field it is for,
// so that errors say what was being read and where.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }

  absl::Status Error(size_t at, std::string_view field, std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("gguf: ", std::string(field), " at byte ", at, ": ", std::string(what)));
  }

  absl::Status Need(uint64_t n, std::string_view field) const {
    if (n > remaining())
      return Error(pos_, field,
                   absl::StrCat("needs ", n, " bytes but only ", remaining(),
                                " remain (file truncated?)"));
    return absl::OkStatus();
  }

  template <typename T>
  absl::StatusOr<T> Read(std::string_view field) {
    TS_RETURN_IF_ERROR(Need(sizeof(T), field));
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  absl::StatusOr<std::string> ReadString(std::string_view field) {
    const size_t at = pos_;
    TS_ASSIGN_OR_RETURN(const uint64_t len, Read<uint64_t>(field));
    if (len > remaining()) {
      pos_ = at;
      return Error(at, field,
                   absl::StrCat("string length ", len, " exceeds the ", remaining() - 8,
                                " bytes that remain"));
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

absl::StatusOr<GgufValue> ReadValue(Reader& r, GgufValueType type, const std::string& field,
                                    int depth);

absl::StatusOr<GgufValue> ReadScalar(Reader& r, GgufValueType type, const std::string& field) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufValueType::kU8: {
      TS_ASSIGN_OR_RETURN(uint8_t x, r.Read<uint8_t>(field));
      v.value = uint64_t{x};
      break;
    }
    case GgufValueType::kI8: {
      TS_ASSIGN_OR_RETURN(int8_t x, r.Read<int8_t>(field));
      v.value = int64_t{x};
      break;
    }
    case GgufValueType::kU16: {
      TS_ASSIGN_OR_RETURN(uint16_t x, r.Read<uint16_t>(field));
      v.value = uint64_t{x};
      break;
    }
    case GgufValueType::kI16: {
      TS_ASSIGN_OR_RETURN(int16_t x, r.Read<int16_t>(field));
      v.value = int64_t{x};
      break;
    }
    case GgufValueType::kU32: {
      TS_ASSIGN_OR_RETURN(uint32_t x, r.Read<uint32_t>(field));
      v.value = uint64_t{x};
      break;
    }
    case GgufValueType::kI32: {
      TS_ASSIGN_OR_RETURN(int32_t x, r.Read<int32_t>(field));
      v.value = int64_t{x};
      break;
    }
    case GgufValueType::kU64: {
      TS_ASSIGN_OR_RETURN(uint64_t x, r.Read<uint64_t>(field));
      v.value = x;
      break;
    }
    case GgufValueType::kI64: {
      TS_ASSIGN_OR_RETURN(int64_t x, r.Read<int64_t>(field));
      v.value = x;
      break;
    }
    case GgufValueType::kF32: {
      TS_ASSIGN_OR_RETURN(float x, r.Read<float>(field));
      v.value = double{x};
      break;
    }
    case GgufValueType::kF64: {
      TS_ASSIGN_OR_RETURN(double x, r.Read<double>(field));
      v.value = x;
      break;
    }
    case GgufValueType::kBool: {
      const size_t at = r.pos();
      TS_ASSIGN_OR_RETURN(uint8_t x, r.Read<uint8_t>(field));
      if (x > 1)
        return r.Error(at, field, absl::StrCat("invalid bool byte ", x, " (must be 0 or 1)"));
      v.value = x == 1;
      break;
    }
    case GgufValueType::kString: {
      TS_ASSIGN_OR_RETURN(std::string s, r.ReadString(field));
      v.value = std::move(s);
      break;
    }
    case GgufValueType::kArray:
      return absl::InternalError("ReadScalar called for an array");
  }
  return v;
}

absl::StatusOr<GgufValue> ReadArray(Reader& r, const std::string& field, int depth) {
  if (depth >= kMaxArrayDepth)
    return r.Error(r.pos(), field,
                   absl::StrCat("arrays nested deeper than ", kMaxArrayDepth, " levels"));
  const size_t type_at = r.pos();
  TS_ASSIGN_OR_RETURN(const uint32_t elem_code, r.Read<uint32_t>(field + " element type"));
  if (!IsKnownValueType(elem_code))
    return r.Error(type_at, field + " element type",
                   absl::StrCat("unknown value type ", elem_code));
  const auto elem_type = static_cast<GgufValueType>(elem_code);
  const size_t count_at = r.pos();
  TS_ASSIGN_OR_RETURN(const uint64_t count, r.Read<uint64_t>(field + " array length"));
  if (count > r.remaining() / MinEncodedSize(elem_type))
    return r.Error(count_at, field + " array length",
                   absl::StrCat("array length ", count, " of ", std::string(GgufValueTypeName(elem_type)),
                                " cannot fit in the ", r.remaining(), " bytes that remain"));
  std::vector<GgufValue> elems;
  elems.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    TS_ASSIGN_OR_RETURN(GgufValue e, ReadValue(r, elem_type, field, depth + 1));
    elems.push_back(std::move(e));
  }
  GgufValue v;
  v.type = GgufValueType::kArray;
  v.value = std::move(elems);
  return v;
}

absl::StatusOr<GgufValue> ReadValue(Reader& r, GgufValueType type, const std::string& field,
                                    int depth) {
  if (type == GgufValueType::kArray) return ReadArray(r, field, depth);
  return ReadScalar(r, type, field);
}

bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

uint64_t PadTo(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kU8: return "u8";
    case GgufValueType::kI8: return "i8";
    case GgufValueType::kU16: return "u16";
    case GgufValueType::kI16: return "i16";
    case GgufValueType::kU32: return "u32";
    case GgufValueType::kI32: return "i32";
    case GgufValueType::kF32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "u64";
    case GgufValueType::kI64: return "i64";
    case GgufValueType::kF64: return "f64";
  }
  return "unknown";
}

// ---- GgufValue ----

std::optional<int64_t> GgufValue::AsInt() const {
  if (const auto* u = std::get_if<uint64_t>(&value)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  return std::nullopt;
}

std::optional<double> GgufValue::AsDouble() const {
  if (const auto* d = std::get_if<double>(&value)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&value)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&value)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<bool> GgufValue::AsBool() const {
  if (const auto* b = std::get_if<bool>(&value)) return *b;
  return std::nullopt;
}

const std::string* GgufValue::AsString() const { return std::get_if<std::string>(&value); }

const std::vector<GgufValue>* GgufValue::AsArray() const {
  return std::get_if<std::vector<GgufValue>>(&value);
}

int64_t GgufTensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // the parser has checked that this cannot overflow
  return n;
}

// ---- GgufFile ----

void GgufFile::DropPages(const void* data, size_t bytes) const {
  const auto* p = static_cast<const uint8_t*>(data);
  const auto* base = static_cast<const uint8_t*>(map_);
  if (map_ == nullptr || p < base || bytes > map_size_ ||
      p - base > static_cast<ptrdiff_t>(map_size_ - bytes))
    return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / page * page;
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
}

GgufFile::~GgufFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO is refused below instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("gguf: cannot open '", path, "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::Status(absl::ErrnoToStatusCode(err), msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("gguf: '", path, "' is not a regular file"));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > 0) {
    void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::Status(absl::ErrnoToStatusCode(err),
                          absl::StrCat("gguf: cannot map '", path, "': ", std::strerror(err)));
    }
    file->map_ = map;
    file->map_size_ = size;
  }
  ::close(fd);
  const absl::Status st_parse = file->ParseImpl(static_cast<const uint8_t*>(file->map_), size);
  if (!st_parse.ok())
    return absl::Status(st_parse.code(), absl::StrCat(st_parse.message(), " [", path, "]"));
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  TS_RETURN_IF_ERROR(file->ParseImpl(data, size));
  return file;
}

absl::Status GgufFile::ParseImpl(const uint8_t* data, size_t size) {
  static const uint8_t kEmpty[1] = {0};
  if (data == nullptr) data = kEmpty;
  Reader r(data, size);

  // Header.
  TS_ASSIGN_OR_RETURN(const uint32_t magic, r.Read<uint32_t>("magic"));
  if (magic != kGgufMagic)
    return r.Error(0, "magic", absl::StrCat("bad magic 0x", absl::Hex(magic, absl::kZeroPad8),
                                            " (expected \"GGUF\")"));
  TS_ASSIGN_OR_RETURN(version_, r.Read<uint32_t>("version"));
  if (version_ < 2 || version_ > 3)
    return r.Error(4, "version",
                   absl::StrCat("unsupported version ", version_, " (only 2 and 3 are read)"));
  TS_ASSIGN_OR_RETURN(const uint64_t n_tensors, r.Read<uint64_t>("tensor count"));
  TS_ASSIGN_OR_RETURN(const uint64_t n_kv, r.Read<uint64_t>("kv count"));
  // A tensor info takes at least 8 (name length) + 4 (n_dims) + 8 (ne[0]) + 4 + 8 bytes; a KV
  // pair at least 8 (key length) + 4 (type) + 1.
  if (n_tensors > r.remaining() / 32)
    return r.Error(8, "tensor count",
                   absl::StrCat("tensor count ", n_tensors, " cannot fit in the ", r.remaining(),
                                " bytes that remain"));
  if (n_kv > (r.remaining() - n_tensors * 32) / 13)
    return r.Error(16, "kv count",
                   absl::StrCat("kv count ", n_kv, " cannot fit in the ", r.remaining(),
                                " bytes that remain"));

  // Metadata.
  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t key_at = r.pos();
    TS_ASSIGN_OR_RETURN(std::string key, r.ReadString(absl::StrCat("key of kv ", i)));
    const std::string field = absl::StrCat("kv '", key, "'");
    if (metadata_.count(key) != 0) return r.Error(key_at, field, "duplicate key");
    const size_t type_at = r.pos();
    TS_ASSIGN_OR_RETURN(const uint32_t type_code, r.Read<uint32_t>(field + " value type"));
    if (!IsKnownValueType(type_code))
      return r.Error(type_at, field + " value type",
                     absl::StrCat("unknown value type ", type_code));
    TS_ASSIGN_OR_RETURN(GgufValue value,
                        ReadValue(r, static_cast<GgufValueType>(type_code), field, 0));
    metadata_.emplace(std::move(key), std::move(value));
  }

  // Alignment.
  alignment_ = kDefaultAlignment;
  if (const GgufValue* a = Find("general.alignment")) {
    const std::optional<int64_t> v = a->AsInt();
    if (!v || *v <= 0 || *v > std::numeric_limits<uint32_t>::max() || (*v & (*v - 1)) != 0)
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: kv 'general.alignment': must be a power of two that fits in u32, got ",
          v ? absl::StrCat(*v) : absl::StrCat("a ", std::string(GgufValueTypeName(a->type)))));
    alignment_ = static_cast<uint32_t>(*v);
  }

  // Tensor infos.
  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    const size_t name_at = r.pos();
    TS_ASSIGN_OR_RETURN(t.name, r.ReadString(absl::StrCat("name of tensor ", i)));
    const std::string field = absl::StrCat("tensor '", t.name, "'");
    if (tensor_index_.count(t.name) != 0) return r.Error(name_at, field, "duplicate tensor name");
    const size_t dims_at = r.pos();
    TS_ASSIGN_OR_RETURN(const uint32_t n_dims, r.Read<uint32_t>(field + " n_dims"));
    if (n_dims == 0 || n_dims > kMaxDims)
      return r.Error(dims_at, field + " n_dims",
                     absl::StrCat("n_dims ", n_dims, " is not in [1, ", kMaxDims, "]"));
    uint64_t n_elements = 1;
    for (uint32_t j = 0; j < n_dims; ++j) {
      const size_t ne_at = r.pos();
      const std::string ne_field = absl::StrCat(field, " ne[", j, "]");
      TS_ASSIGN_OR_RETURN(const uint64_t raw, r.Read<uint64_t>(ne_field));
      const int64_t ne = static_cast<int64_t>(raw);
      if (ne < 0) return r.Error(ne_at, ne_field, absl::StrCat("negative dimension ", ne));
      if (!CheckedMul(n_elements, raw, &n_elements) ||
          n_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        return r.Error(ne_at, ne_field, "element count overflows int64");
      t.ne.push_back(ne);
    }
    const size_t type_at = r.pos();
    TS_ASSIGN_OR_RETURN(const uint32_t type_code, r.Read<uint32_t>(field + " type"));
    const GgmlTypeInfo* info = GetGgmlTypeInfo(type_code);
    if (info == nullptr)
      return r.Error(type_at, field + " type",
                     absl::StrCat("unknown or unsupported ggml type code ", type_code));
    t.type = static_cast<GgmlType>(type_code);
    if (t.ne[0] % info->block_size != 0)
      return r.Error(dims_at, field + " ne[0]",
                     absl::StrCat("row length ", t.ne[0], " is not a multiple of the ",
                                  std::string(info->name), " block size ", info->block_size));
    const size_t offset_at = r.pos();
    TS_ASSIGN_OR_RETURN(t.offset, r.Read<uint64_t>(field + " offset"));
    if (t.offset % alignment_ != 0)
      return r.Error(offset_at, field + " offset",
                     absl::StrCat("offset ", t.offset, " is not a multiple of the alignment ",
                                  alignment_));
    uint64_t nbytes = 0;
    if (!CheckedMul(n_elements / info->block_size, info->block_bytes, &nbytes) ||
        nbytes > r.size())
      return r.Error(dims_at, field,
                     absl::StrCat(n_elements, " elements of ", std::string(info->name),
                                  " need more bytes than the file holds (", r.size(), ")"));
    t.nbytes = static_cast<size_t>(nbytes);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Data section: starts at the next multiple of the alignment after the tensor infos.
  const uint64_t data_start = PadTo(r.pos(), alignment_);
  if (n_tensors > 0 && data_start > size)
    return r.Error(r.pos(), "data section",
                   absl::StrCat("starts at byte ", data_start, ", past the end of the file (",
                                size, " bytes)"));
  data_offset_ = data_start;
  // Tensors are packed in info order, each padded to the alignment (llama.cpp's rule).
  uint64_t expected = 0;
  for (GgufTensorInfo& t : tensors_) {
    const std::string field = absl::StrCat("tensor '", t.name, "' offset");
    if (t.offset != expected)
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: ", field, ": offset ", t.offset, " disagrees with ", expected,
          ", the padded size of the tensors before it"));
    const uint64_t avail = size - data_start;
    if (t.offset > avail || t.nbytes > avail - t.offset)
      return absl::InvalidArgumentError(absl::StrCat(
          "gguf: tensor '", t.name, "': data [", data_start + t.offset, ", ",
          data_start + t.offset + t.nbytes, ") runs past the end of the file (", size,
          " bytes)"));
    t.data = data + data_start + t.offset;
    expected = PadTo(t.offset + t.nbytes, alignment_);
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(std::string(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::Status WrongType(std::string_view key, const GgufValue& v, std::string_view wanted) {
  std::string stored(GgufValueTypeName(v.type));
  if (const auto* arr = v.AsArray(); arr != nullptr && !arr->empty())
    stored = absl::StrCat("array of ", std::string(GgufValueTypeName((*arr)[0].type)));
  return absl::InvalidArgumentError(
      absl::StrCat("gguf: kv '", std::string(key), "' holds ", stored, ", expected ",
                   std::string(wanted)));
}

}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("gguf: no kv '", std::string(key), "'"));
  if (auto i = v->AsInt()) return *i;
  return WrongType(key, *v, "an integer");
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("gguf: no kv '", std::string(key), "'"));
  if (auto d = v->AsDouble()) return *d;
  return WrongType(key, *v, "a number");
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("gguf: no kv '", std::string(key), "'"));
  if (const std::string* s = v->AsString()) return *s;
  return WrongType(key, *v, "a string");
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("gguf: no kv '", std::string(key), "'"));
  const auto* arr = v->AsArray();
  if (arr == nullptr) return WrongType(key, *v, "an array of string");
  std::vector<std::string> out;
  out.reserve(arr->size());
  for (const GgufValue& e : *arr) {
    const std::string* s = e.AsString();
    if (s == nullptr) return WrongType(key, *v, "an array of string");
    out.push_back(*s);
  }
  return out;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("gguf: no kv '", std::string(key), "'"));
  const auto* arr = v->AsArray();
  if (arr == nullptr) return WrongType(key, *v, "an array of numbers");
  std::vector<double> out;
  out.reserve(arr->size());
  for (const GgufValue& e : *arr) {
    const std::optional<double> d = e.AsDouble();
    if (!d) return WrongType(key, *v, "an array of numbers");
    out.push_back(*d);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return absl::NotFoundError(absl::StrCat("gguf: no kv '", std::string(key), "'"));
  const auto* arr = v->AsArray();
  if (arr == nullptr) return WrongType(key, *v, "an array of integers");
  std::vector<int64_t> out;
  out.reserve(arr->size());
  for (const GgufValue& e : *arr) {
    const std::optional<int64_t> i = e.AsInt();
    if (!i) return WrongType(key, *v, "an array of integers");
    out.push_back(*i);
  }
  return out;
}

}  // namespace tinyserve
