// MeasureJson: nesting and ordered_json's parse work, outside strings, before parsing.
#include "common/json_nesting.h"

#include <gtest/gtest.h>

#include <string>

namespace tinyserve {
namespace {

TEST(MeasureJson, NestingAndMembersPerObject) {
  EXPECT_EQ(MeasureJson("1").nesting, 0);
  EXPECT_EQ(MeasureJson(R"({"a": [1, {"b": 2}]})").nesting, 3);
  // Members count at their own object only: 2² + 1² + 3².
  const JsonCost c = MeasureJson(R"({"a": {"x": 1}, "b": [{"p": 1, "q": 2, "r": [3]}]})");
  EXPECT_EQ(c.ordered_work, 4u + 1u + 9u);
  // Colons and brackets inside strings (escaped quotes too) do not count.
  EXPECT_EQ(MeasureJson(R"({"a:b": "{[:\":]}"})").ordered_work, 1u);
  EXPECT_EQ(MeasureJson(R"({"a:b": "{[:\":]}"})").nesting, 1);
  // An object left open still cost its parse.
  EXPECT_EQ(MeasureJson(R"({"a": 1, "b": 2, "c": )").ordered_work, 9u);
  std::string wide = "{";
  for (int i = 0; i < 20000; ++i) wide += "\"k" + std::to_string(i) + "\": 0,";
  wide.back() = '}';
  EXPECT_EQ(MeasureJson(wide).ordered_work, 400000000u);
  EXPECT_FALSE(JsonAffordable(wide, 32));
  EXPECT_TRUE(JsonAffordable(R"({"a": [[[1]]]})", 4));
  EXPECT_FALSE(JsonAffordable(R"({"a": [[[1]]]})", 3));
  // Deep text is measured without tracking every level.
  EXPECT_EQ(MeasureJson(std::string(100000, '[')).nesting, 100000);
}

}  // namespace
}  // namespace tinyserve
