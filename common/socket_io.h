// File: common/socket_io.h
// Small helpers for blocking stream sockets.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tinyserve {

// "host:port", with an IPv6 literal host bracketed ("[::1]:50051"), as gRPC and civetweb
// expect; a host already bracketed is left as it is.
std::string JoinHostPort(std::string_view host, int port);

// Sends all n bytes (retrying short writes and EINTR; never raises SIGPIPE). False on an error
// or a closed peer.
bool SendAll(int fd, const void* data, size_t n);

}  // namespace tinyserve
