// File: worker/tokenizer/special_tokens_test.cc
#include "worker/tokenizer/special_tokens.h"

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

TokenizerData MakeData() {
  TokenizerData d;
  d.tokens = {"<|a|>", "<|ab|>", "<u>", "x"};
  d.types = {TokenType::kControl, TokenType::kControl, TokenType::kUserDefined, TokenType::kNormal};
  return d;
}

std::string Show(const std::vector<TextFragment>& fs) {
  std::string s;
  for (const TextFragment& f : fs) {
    if (f.token >= 0) {
      s.append("#").append(std::to_string(f.token));
    } else {
      s.append("[").append(f.text).append("]");
    }
  }
  return s;
}

TEST(SpecialTokenSplitter, LongestFirstAndEveryOccurrence) {
  const TokenizerData d = MakeData();
  SpecialTokenSplitter s(d);
  EXPECT_EQ(Show(s.Split("p<|ab|>q<|a|><|a|>r<u>", true)), "[p]#1[q]#0#0[r]#2");
}

TEST(SpecialTokenSplitter, UserDefinedAlwaysControlOnlyWhenParsing) {
  const TokenizerData d = MakeData();
  SpecialTokenSplitter s(d);
  EXPECT_EQ(Show(s.Split("p<|a|>q<u>", false)), "[p<|a|>q]#2");
  EXPECT_EQ(Show(s.Split("<u>", false)), "#2");
  EXPECT_EQ(Show(s.Split("", true)), "");
}

}  // namespace
}  // namespace tinyserve
