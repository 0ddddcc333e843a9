#include "common/socket_io.h"

#include <sys/socket.h>

#include <cerrno>

namespace tinyserve {

std::string JoinHostPort(std::string_view host, int port) {
  const bool v6 = host.find(':') != std::string_view::npos && !host.starts_with("[");
  std::string out;
  if (v6) out += '[';
  out += host;
  if (v6) out += ']';
  out += ':';
  out += std::to_string(port);
  return out;
}

bool SendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

}  // namespace tinyserve
