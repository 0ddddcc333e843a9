// File: worker/tokenizer/unicode_test.cc
#include "worker/tokenizer/unicode.h"

#include "gtest/gtest.h"
#include "worker/tokenizer/byte_level.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {
namespace {

TEST(Unicode, DecodeAndEncodeRoundTrip) {
  const std::string s = "aé€😀";
  std::vector<size_t> offsets;
  const std::vector<uint32_t> cps = DecodeUtf8All(s, &offsets);
  ASSERT_EQ(cps, (std::vector<uint32_t>{'a', 0xE9, 0x20AC, 0x1F600}));
  EXPECT_EQ(offsets, (std::vector<size_t>{0, 1, 3, 6, 10}));
  std::string back;
  for (uint32_t cp : cps) AppendUtf8(cp, &back);
  EXPECT_EQ(back, s);
}

TEST(Unicode, InvalidBytesDecodeOneAtATime) {
  const std::string s = "a\xC3\x28\xF0\x9F";  // bad continuation, truncated 4-byte sequence
  std::vector<size_t> offsets;
  const std::vector<uint32_t> cps = DecodeUtf8All(s, &offsets);
  EXPECT_EQ(
      cps, (std::vector<uint32_t>{'a', kReplacementChar, '(', kReplacementChar, kReplacementChar}));
  EXPECT_FALSE(IsValidUtf8(s));
  EXPECT_FALSE(IsValidUtf8("\xC0\x80"));      // overlong
  EXPECT_FALSE(IsValidUtf8("\xED\xA0\x80"));  // surrogate
  EXPECT_TRUE(IsValidUtf8("\xEF\xBF\xBD ok"));
  EXPECT_TRUE(IsValidUtf8(""));
}

TEST(Unicode, Classes) {
  EXPECT_TRUE(IsLetter('a'));
  EXPECT_TRUE(IsLetter(0xE9));    // é
  EXPECT_TRUE(IsLetter(0x65E5));  // 日
  EXPECT_FALSE(IsLetter(0x301));  // combining acute: \p{M}, not \p{L}
  EXPECT_FALSE(IsLetter('1'));
  EXPECT_TRUE(IsNumber('7'));
  EXPECT_TRUE(IsNumber(0x663));   // Arabic-Indic three
  EXPECT_TRUE(IsNumber(0xB2));    // superscript two (No)
  EXPECT_TRUE(IsNumber(0x2167));  // Roman numeral eight (Nl)
  EXPECT_FALSE(IsNumber('x'));
  for (uint32_t cp : {0x9u, 0xAu, 0xBu, 0xCu, 0xDu, 0x20u, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au,
                      0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u}) {
    EXPECT_TRUE(IsWhitespace(cp)) << std::hex << cp;
  }
  for (uint32_t cp : {0x1Cu, 0x1Fu, 0x200Bu, 0x61u, 0x180Eu}) {
    EXPECT_FALSE(IsWhitespace(cp)) << std::hex << cp;
  }
}

// UAX #15's examples and the cases its algorithm turns on; the Hugging Face `tokenizers`
// comparison is hf_weight_source_test's NfcNormalizerMatchesHfTokenizers.
TEST(Unicode, Nfc) {
  auto nfc = [](const std::string& s) {
    std::string out;
    return NormalizeNfc(s, &out) ? out : s;
  };
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");               // composition
  EXPECT_EQ(nfc("\u212b"), "\u00c5");                // singleton
  EXPECT_EQ(nfc("\u1e0b\u0323"), "\u1e0d\u0307");    // reordered, then recomposed
  EXPECT_EQ(nfc("q\u0307\u0323"), "q\u0323\u0307");  // reordered, nothing composes
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");    // Hangul L V T
  EXPECT_EQ(nfc("\uac00\u11a8"), "\uac01");          // Hangul LV + T
  EXPECT_EQ(nfc("\u0958"), "\u0915\u093c");          // a composition exclusion
  EXPECT_EQ(nfc("a\u0301\u0301"), "\u00e1\u0301");   // the second mark is blocked
  EXPECT_EQ(nfc("\u0301e"), "\u0301e");              // a leading non-starter
  // Already NFC, or not valid UTF-8: left alone (false).
  std::string out = "unchanged";
  EXPECT_FALSE(NormalizeNfc("plain ASCII, caf\u00e9, \ufb01, \U0001f44d", &out));
  EXPECT_FALSE(NormalizeNfc("e\u0301\xff", &out));
  EXPECT_EQ(out, "unchanged");
}

TEST(ByteLevel, Gpt2Map) {
  EXPECT_EQ(ByteToCodepoint(' '), 0x120u);   // Ġ
  EXPECT_EQ(ByteToCodepoint('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(ByteToCodepoint('A'), static_cast<uint32_t>('A'));
  EXPECT_EQ(ByteToCodepoint(0xAD), 0x143u);  // the last of the 68 remapped bytes
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(CodepointToByte(ByteToCodepoint(static_cast<uint8_t>(b))), b);
  }
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(ByteLevelDecode(ByteLevelEncode(all)), all);
}

}  // namespace
}  // namespace tinyserve
