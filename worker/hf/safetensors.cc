#include "worker/hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace tinyserve {
namespace {

using nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr size_t kMaxRank = 8;

bool ParseDtype(std::string_view s, SafetensorsDtype* dtype) {
  if (s == "F32") {
    *dtype = SafetensorsDtype::kF32;
  } else if (s == "F16") {
    *dtype = SafetensorsDtype::kF16;
  } else if (s == "BF16") {
    *dtype = SafetensorsDtype::kBF16;
  } else {
    return false;
  }
  return true;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status ReadWholeFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = std::move(ss).str();
  return absl::OkStatus();
}

}  // namespace

std::string_view SafetensorsDtypeName(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF32:
      return "F32";
    case SafetensorsDtype::kF16:
      return "F16";
    case SafetensorsDtype::kBF16:
      return "BF16";
  }
  return "?";
}

GgmlType SafetensorsToGgml(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF16:
      return GgmlType::kF16;
    case SafetensorsDtype::kBF16:
      return GgmlType::kBF16;
    case SafetensorsDtype::kF32:
      break;
  }
  return GgmlType::kF32;
}

size_t SafetensorsDtypeSize(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kF32 ? 4 : 2;
}

int64_t SafetensorsTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // (a FIFO: below)
  if (fd < 0) {
    if (errno == ENOENT)
      return absl::NotFoundError(absl::StrCat("safetensors: no file '", path, "'"));
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: cannot open '", path, "': ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: cannot stat '", path, "': ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors: '", path, "' is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: cannot map '", path, "': ", std::strerror(err)));
    }
  }
  ::close(fd);
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->label_ = path;
  file->map_ = map;
  file->map_size_ = size;
  TS_RETURN_IF_ERROR(file->ParseImpl(static_cast<const uint8_t*>(map), size));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(const uint8_t* data,
                                                                        size_t size,
                                                                        std::string label) {
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->label_ = std::move(label);
  TS_RETURN_IF_ERROR(file->ParseImpl(data, size));
  return file;
}

absl::Status SafetensorsFile::ParseImpl(const uint8_t* data, size_t size) {
  const std::string where = absl::StrCat("safetensors '", label_, "'");
  if (size < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": file has ", size, " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];  // little-endian
  if (header_len > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": header length ", header_len,
                                                   " runs past the end of the file (", size,
                                                   " bytes)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header length ", header_len, " exceeds ", kMaxHeaderBytes));
  }
  const char* header = reinterpret_cast<const char*>(data + 8);
  const json doc = json::parse(header, header + header_len, /*cb=*/nullptr,
                               /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": header (", header_len, " bytes) is not valid JSON"));
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": header is not a JSON object"));
  }
  const uint8_t* base = data + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;

  for (const auto& [name, info] : doc.items()) {
    if (name == "__metadata__") continue;
    const std::string at = absl::StrCat(where, ": tensor '", name, "'");
    if (!info.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": entry is not an object"));
    }
    // dtype
    auto it = info.find("dtype");
    if (it == info.end() || !it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": field 'dtype' missing or not a string"));
    }
    SafetensorsTensor t;
    t.name = name;
    const std::string& dtype = it->get_ref<const std::string&>();
    if (!ParseDtype(dtype, &t.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": dtype '", dtype, "' is not supported (F32, F16, BF16)"));
    }
    // shape
    it = info.find("shape");
    if (it == info.end() || !it->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": field 'shape' missing or not an array"));
    }
    if (it->size() > kMaxRank) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": shape has rank ", it->size(), ", more than ", kMaxRank));
    }
    uint64_t nbytes = SafetensorsDtypeSize(t.dtype);
    bool overflow = false;
    for (const json& d : *it) {
      if (!d.is_number_unsigned()) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": shape ", it->dump(), " has a non-integer or negative dimension"));
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(nbytes, dim, &nbytes)) {
        overflow = true;
      }
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    if (overflow) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": shape ", it->dump(), " overflows 64-bit byte counts"));
    }
    // data_offsets
    it = info.find("data_offsets");
    if (it == info.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_number_unsigned() ||
        !(*it)[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": field 'data_offsets' must be two non-negative integers [begin, end]"));
    }
    const uint64_t begin = (*it)[0].get<uint64_t>();
    const uint64_t end = (*it)[1].get<uint64_t>();
    if (begin > end) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": data_offsets [", begin, ", ", end, ") has begin > end"));
    }
    if (end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": data_offsets [", begin, ", ", end,
                                                     ") run past the end of the data section (",
                                                     data_size, " bytes)"));
    }
    if (end - begin != nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": data_offsets [", begin, ", ", end, ") hold ", end - begin, " bytes but shape ",
          ShapeString(t.shape), " of ", dtype, " needs ", nbytes));
    }
    t.data = base + begin;
    t.nbytes = static_cast<size_t>(nbytes);
    tensors_.emplace(name, std::move(t));
  }
  return absl::OkStatus();
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

// ---------------------------------------------------------------------------------------------
// Index and checkpoint

absl::StatusOr<std::map<std::string, std::string>> ParseSafetensorsIndex(std::string_view text,
                                                                         const std::string& label) {
  const std::string where = absl::StrCat("safetensors index '", label, "'");
  const json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  auto it = doc.find("weight_map");
  if (it == doc.end() || !it->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field 'weight_map' missing or not an object"));
  }
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : it->items()) {
    if (!file.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": weight_map['", name, "'] is not a string"));
    }
    const std::string& f = file.get_ref<const std::string&>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": weight_map['", name, "'] = '", f, "' is not a plain file name"));
    }
    map.emplace(name, f);
  }
  return map;
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("safetensors: no folder '", dir, "'"));
  }
  auto ckpt = std::make_unique<SafetensorsCheckpoint>();
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();

  if (fs::exists(index_path, ec)) {
    std::string text;
    TS_RETURN_IF_ERROR(ReadWholeFile(index_path, &text));
    TS_ASSIGN_OR_RETURN(auto weight_map, ParseSafetensorsIndex(text, index_path));
    std::map<std::string, const SafetensorsFile*> by_file;
    for (const auto& [name, file] : weight_map) by_file.emplace(file, nullptr);
    for (auto& [file, ptr] : by_file) {
      TS_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::Open((fs::path(dir) / file).string()));
      ptr = shard.get();
      ckpt->files_.push_back(std::move(shard));
    }
    for (const auto& [name, file] : weight_map) {
      const SafetensorsTensor* t = by_file.at(file)->Find(name);
      if (t == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("safetensors index '", index_path,
                                                       "': tensor '", name, "' is mapped to '",
                                                       file, "', which has no such tensor"));
      }
      ckpt->tensors_.emplace(name, t);
    }
    return ckpt;
  }
  if (fs::exists(single_path, ec)) {
    TS_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(single_path));
    for (const auto& [name, t] : file->tensors()) ckpt->tensors_.emplace(name, &t);
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }
  return absl::NotFoundError(absl::StrCat("safetensors: folder '", dir,
                                          "' has neither model.safetensors nor "
                                          "model.safetensors.index.json"));
}

const SafetensorsTensor* SafetensorsCheckpoint::Find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsCheckpoint::files() const {
  std::vector<std::string> out;
  for (const auto& f : files_) out.push_back(f->path());
  return out;
}

}  // namespace tinyserve
