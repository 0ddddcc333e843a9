// File: worker/tokenizer/utf8_stream_test.cc
#include "gtest/gtest.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {
namespace {

TEST(Utf8StreamDecoder, HoldsBackSplitSequences) {
  const std::string text = "a€b😀c";  // € = E2 82 AC, 😀 = F0 9F 98 80
  // Feed one byte at a time: every released chunk is valid UTF-8 and together they rebuild
  // the text.
  Utf8StreamDecoder dec;
  std::string out;
  for (char c : text) {
    const std::string chunk = dec.Push(std::string_view(&c, 1));
    EXPECT_TRUE(IsValidUtf8(chunk));
    out += chunk;
  }
  out += dec.Flush();
  EXPECT_EQ(out, text);
}

TEST(Utf8StreamDecoder, ReleasesCompleteSequencesOnly) {
  Utf8StreamDecoder dec;
  EXPECT_EQ(dec.Push("x\xF0\x9F"), "x");
  EXPECT_EQ(dec.Push("\x98"), "");
  EXPECT_EQ(dec.Push("\x80y"), "😀y");
  EXPECT_EQ(dec.Push("\xE2\x82"), "");
  EXPECT_EQ(dec.Flush(), "\xE2\x82");
  EXPECT_EQ(dec.Flush(), "");
}

TEST(Utf8StreamDecoder, PassesInvalidBytesThrough) {
  Utf8StreamDecoder dec;
  // A stray continuation byte can never complete; it is released rather than held forever.
  EXPECT_EQ(dec.Push("\x80z"), "\x80z");
  EXPECT_EQ(dec.Push("\xFF"), "\xFF");
}

}  // namespace
}  // namespace tinyserve
