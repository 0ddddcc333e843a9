#include "common/flags.h"

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

TEST(FlagSet, ParsesForms) {
  FlagSet f("x", "test");
  std::string s = "a";
  int i = 1;
  float t = 0;
  bool b = false;
  std::vector<std::string> list;
  f.String("model", &s, "m");
  f.Int("max-tokens", &i, "n");
  f.Float("temperature", &t, "t");
  f.Bool("chat", &b, "c");
  f.StringList("stop", &list, "s");
  ASSERT_TRUE(f.Parse({"--model", "m.gguf", "--max-tokens=7", "--chat", "--temperature", "0.5",
                       "--stop", "a", "--stop=b", "pos"})
                  .ok());
  EXPECT_EQ(s, "m.gguf");
  EXPECT_EQ(i, 7);
  EXPECT_FLOAT_EQ(t, 0.5f);
  EXPECT_TRUE(b);
  EXPECT_EQ(list, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(f.positional(), (std::vector<std::string>{"pos"}));
  EXPECT_TRUE(f.WasSet("chat"));
}

TEST(FlagSet, ErrorsNameTheFlag) {
  FlagSet f("x", "test");
  int i = 0;
  f.Int("max-tokens", &i, "n");
  auto s = f.Parse({"--max-tokens", "abc"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--max-tokens"), std::string::npos);
  FlagSet g("x", "test");
  s = g.Parse({"--nope"});
  EXPECT_NE(s.message().find("--nope"), std::string::npos);
  FlagSet h("x", "test");
  h.Int("max-tokens", &i, "n");
  EXPECT_FALSE(h.Parse({"--max-tokens"}).ok());
}

void RegisterDeviceTwice() {
  FlagSet f("cmd", "");
  std::string a, b;
  f.String("device", &a, "one");
  f.String("device", &b, "two");
}

TEST(FlagSetDeathTest, RegisteringANameTwiceAborts) {
  EXPECT_DEATH(RegisterDeviceTwice(), "registered twice");
}

}  // namespace
}  // namespace tinyserve

