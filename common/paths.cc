#include "common/paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tinyserve {

std::string DataDir() {
  if (const char* v = std::getenv("TINYSERVE_DATA"); v != nullptr && *v) return v;
  return "../shared/data";
}

std::string CacheDir() {
  if (const char* v = std::getenv("TINYSERVE_CACHE"); v != nullptr && *v) return v;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/tmp") + "/.cache/tinyserve";
}

std::string DefaultModelPath() { return CacheDir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

std::string Stories260kPath() { return DataDir() + "/models/stories260K/stories260K.gguf"; }

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string msg = absl::StrCat("cannot open '", path, "': ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InvalidArgumentError(msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  if (st.st_size > max_bytes) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is ", st.st_size, " bytes, over the ", max_bytes, " allowed"));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the file shrank
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

}  // namespace tinyserve
