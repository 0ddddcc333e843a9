#include "common/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/paths_test.XXXXXX";
  const char* d = mkdtemp(tmpl);
  return d != nullptr ? d : "/tmp";
}

// Paths a client can name (a run-time LoRA adapter's) are read only when they are regular files
// of a bounded size: a FIFO, a device or a folder is refused at once, never waited on or read.
TEST(ReadRegularFile, ReadsFilesAndRefusesTheRest) {
  const std::string dir = TempDir();
  const std::string file = dir + "/a.json";
  std::ofstream(file) << "{\"r\": 8}";
  auto ok = ReadRegularFile(file, 100);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "{\"r\": 8}");

  auto big = ReadRegularFile(file, 4);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("over the 4 allowed"), std::string::npos) << big.status();

  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto f = ReadRegularFile(fifo, 100);  // would block in open() without O_NONBLOCK
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("not a regular file"), std::string::npos) << f.status();

  EXPECT_EQ(ReadRegularFile("/dev/zero", 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadRegularFile(dir, 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadRegularFile(dir + "/none", 100).status().code(), absl::StatusCode::kNotFound);
  std::remove(fifo.c_str());
  std::remove(file.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace tinyserve
