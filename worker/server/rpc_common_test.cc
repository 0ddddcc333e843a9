#include <string>

#include "gtest/gtest.h"
#include "worker/server/api_util.h"
#include "worker/server/block_hash.h"
#include "worker/server/prefix_lru.h"
#include "worker/server/rpc_security.h"
#include "worker/server/status_convert.h"

namespace tinyserve {
namespace {

namespace v1 = tinyserve::v1;

TEST(Utf8, WellFormedAndSanitized) {
  EXPECT_TRUE(IsWellFormedUtf8("plain"));
  EXPECT_TRUE(IsWellFormedUtf8("caf\xC3\xA9 \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsWellFormedUtf8("\xC3"));          // truncated
  EXPECT_FALSE(IsWellFormedUtf8("\xC0\xAF"));      // overlong
  EXPECT_FALSE(IsWellFormedUtf8("\xED\xA0\x80"));  // surrogate
  EXPECT_EQ(SanitizeUtf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  // One U+FFFD per maximal subpart, as Python's bytes.decode(errors="replace") and Rust's
  // from_utf8_lossy: a truncated sequence is one, a byte that cannot continue it starts anew.
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(SanitizeUtf8("\xE2\x82"), r);
  EXPECT_EQ(SanitizeUtf8(std::string("\xE2\x82") + "a"), r + "a");
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98"), r);
  EXPECT_EQ(SanitizeUtf8("\xE2\x82\xE2\x82\xAC"), r + "\xE2\x82\xAC");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF"), r + r);                  // overlong: C0 never starts one
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), r + r + r);          // surrogate: A0 cannot follow ED
  EXPECT_EQ(SanitizeUtf8("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(SanitizeUtf8("\x80\xBF"), r + r);
  EXPECT_EQ(SanitizeUtf8("\xE0\xA0"), r);
}

TEST(ParseGenerateRequest, NamesTheFieldWithBadUtf8) {
  v1::GenerateRequest ok;
  ok.set_text("hello");
  v1::GenerateRequest parsed;
  EXPECT_TRUE(ParseRequest(ToByteBuffer(ok), &parsed).ok());
  EXPECT_EQ(parsed.text(), "hello");

  // Field 2 (text), length 2, bytes 0xFF 0xFE: what a client with raw bytes can send.
  const std::string wire("\x12\x02\xFF\xFE", 4);
  grpc::Slice slice(wire);
  grpc::ByteBuffer bad(&slice, 1);
  grpc::Status s = ParseRequest(bad, &parsed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("text"), std::string::npos) << s.error_message();

  v1::GenerateRequest chat;
  chat.mutable_chat()->add_messages()->set_role("user");
  chat.mutable_chat()->add_messages()->set_role("user");
  std::string bytes = chat.SerializeAsString();
  bytes += std::string("\x22\x08\x0A\x06\x12\x04\x61\xFF\x62\x63", 10);  // chat.messages[2]
  grpc::Slice slice2(bytes);
  grpc::ByteBuffer bad2(&slice2, 1);
  s = ParseRequest(bad2, &parsed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("chat.messages[2].content"), std::string::npos)
      << s.error_message();
}

TEST(ParseRequest, NamesNestedRepeatedAndMapFields) {
  auto bad = [](const std::string& wire) {
    grpc::Slice slice(wire);
    return grpc::ByteBuffer(&slice, 1);
  };
  // EmbedRequest.inputs[1].text (field 2, then EmbedInput field 1).
  v1::EmbedRequest embed;
  grpc::Status s =
      ParseRequest(bad(std::string("\x12\x04\x0A\x02hi\x12\x04\x0A\x02\xFF\xFE", 12)), &embed);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("inputs[1].text is not valid UTF-8"), std::string::npos)
      << s.error_message();
  // GenerateRequest.selection.params (a map: named without an index) and sampling.stop[1].
  v1::GenerateRequest gen;
  s = ParseRequest(bad(std::string("\x32\x06\x3A\x04\x0A\x02\xC3\x28", 8)), &gen);
  EXPECT_NE(s.error_message().find("selection.params is not"), std::string::npos)
      << s.error_message();
  s = ParseRequest(bad(std::string("\x2A\x03\x42\x01x\x2A\x03\x42\x01\xFF", 10)), &gen);
  EXPECT_NE(s.error_message().find("sampling.stop[1] is not"), std::string::npos)
      << s.error_message();
  // Not a message at all.
  s = ParseRequest(bad(std::string("\xFF\xFF\xFF", 3)), &embed);
  EXPECT_NE(s.error_message().find("not a valid tinyserve.v1.EmbedRequest"), std::string::npos)
      << s.error_message();
}

TEST(BlockHash, SharedPrefixSharesLeadingHashes) {
  v1::GenerateRequest a, b;
  const std::string prefix(200, 'x');
  a.set_text(prefix + "tail one, long enough to fill another block of sixty-four bytes ....");
  b.set_text(prefix + "a different tail that also fills a block of sixty-four bytes ......");
  const auto ha = PromptBlockHashes(a), hb = PromptBlockHashes(b);
  ASSERT_EQ(ha.size(), 4u);
  ASSERT_EQ(hb.size(), 4u);
  EXPECT_EQ(ha[0], hb[0]);
  EXPECT_EQ(ha[2], hb[2]);
  EXPECT_NE(ha[3], hb[3]);
  v1::GenerateRequest ids;
  for (int i = 0; i < 40; ++i) ids.mutable_token_ids()->add_ids(i);
  EXPECT_EQ(PromptBlockHashes(ids).size(), 2u);
  // A cache_salt seeds the chain: the same salt matches, another salt or none does not.
  v1::GenerateRequest salted = a, other = a, same = a;
  salted.set_cache_salt("tenant-1");
  same.set_cache_salt("tenant-1");
  other.set_cache_salt("tenant-2");
  EXPECT_EQ(PromptBlockHashes(salted), PromptBlockHashes(same));
  EXPECT_NE(PromptBlockHashes(salted)[0], ha[0]);
  EXPECT_NE(PromptBlockHashes(salted)[0], PromptBlockHashes(other)[0]);
  EXPECT_EQ(CacheSaltSeed(""), 0u);
  EXPECT_NE(CacheSaltSeed("tenant-1"), 0u);
}

TEST(PrefixLru, MatchesLeadingChainAndEvictsChildrenFirst) {
  PrefixLru lru(4);
  lru.Insert({1, 2, 3});
  EXPECT_EQ(lru.MatchLength({1, 2, 3, 4}), 3u);
  EXPECT_EQ(lru.MatchLength({2, 3}), 2u);
  EXPECT_EQ(lru.MatchLength({9, 1}), 0u);
  lru.Insert({1, 5, 6});  // capacity 4: the oldest leaf (3) goes first
  EXPECT_EQ(lru.size(), 4u);
  EXPECT_EQ(lru.MatchLength({1, 2, 3}), 2u);
  EXPECT_EQ(lru.Snapshot(2).size(), 2u);
}

TEST(StatusConvert, KeepsCodeAndMessage) {
  grpc::Status s = ToGrpcStatus(absl::ResourceExhaustedError("queue full"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "queue full");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(SameSecret, EqualOnlyForEqualStrings) {
  EXPECT_TRUE(SameSecret("Bearer k3y", "Bearer k3y"));
  EXPECT_TRUE(SameSecret("", ""));
  EXPECT_FALSE(SameSecret("Bearer k3y", "Bearer k3z"));
  EXPECT_FALSE(SameSecret("Bearer k3y", "Bearer k3"));  // a prefix
  EXPECT_FALSE(SameSecret("Bearer k3y", "Bearer k3y "));
  EXPECT_FALSE(SameSecret("", "x"));
  EXPECT_FALSE(SameSecret(std::string("a\0b", 3), std::string("a\0c", 3)));
}

}  // namespace
}  // namespace tinyserve
