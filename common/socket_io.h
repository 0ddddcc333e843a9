// File: common/socket_io.h
// Small helpers for blocking stream sockets.
#pragma once

#include <cstddef>

namespace tinyserve {

// Sends all n bytes (retrying short writes and EINTR; never raises SIGPIPE). False on an error
// or a closed peer.
bool SendAll(int fd, const void* data, size_t n);

}  // namespace tinyserve
