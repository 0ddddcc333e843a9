#include "common/socket_io.h"

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

TEST(JoinHostPort, BracketsIpv6LiteralsOnly) {
  EXPECT_EQ(JoinHostPort("127.0.0.1", 50051), "127.0.0.1:50051");
  EXPECT_EQ(JoinHostPort("worker-0.tinyserve", 1), "worker-0.tinyserve:1");
  EXPECT_EQ(JoinHostPort("::", 50051), "[::]:50051");
  EXPECT_EQ(JoinHostPort("::1", 9100), "[::1]:9100");
  EXPECT_EQ(JoinHostPort("fd00::5", 80), "[fd00::5]:80");
  EXPECT_EQ(JoinHostPort("[::1]", 80), "[::1]:80");  // already bracketed
}

}  // namespace
}  // namespace tinyserve
