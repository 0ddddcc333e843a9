// OpenWeightSource: a directory is a Hugging Face checkpoint folder (worker/hf), a file is GGUF.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/model/weight_source.h"

namespace tinyserve {

absl::StatusOr<std::unique_ptr<WeightSource>> OpenWeightSource(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    const std::string msg =
        absl::StrCat("model path '", path, "' cannot be opened: ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
    return absl::Status(absl::ErrnoToStatusCode(err), msg);
  }
  if (S_ISDIR(st.st_mode)) {
#ifdef TINYSERVE_HAVE_HF
    return OpenHfWeightSource(path);
#else
    return absl::UnimplementedError(absl::StrCat(
        "model path '", path, "' is a directory, and this build cannot read Hugging Face "
        "folders (worker/hf is not built)"));
#endif
  }
  return OpenGgufWeightSource(path);
}

}  // namespace tinyserve
