// The Responses API's response store (response_store.h): conversations as chains of turns,
// eviction by bytes (least recently used first), fetch and delete; and the Responses parser
// continuing a stored response (previous_response_id, store).
#include "worker/server/response_store.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "worker/server/openai_responses.h"
#include "worker/server/openai_test_util.h"

namespace tinyserve::openai {
namespace {

using json = Json;
namespace v1 = tinyserve::v1;

json UserSays(const std::string& text) {
  return json::array({{{"type", "message"}, {"role", "user"}, {"content", text}}});
}

json ResponseSaying(const std::string& id, const std::string& text) {
  return {{"id", id},
          {"object", "response"},
          {"output",
           {{{"type", "message"},
             {"role", "assistant"},
             {"content", {{{"type", "output_text"}, {"text", text}}}}}}}};
}

std::string TextOf(const json& item) {
  return item["content"].is_string() ? item["content"].get<std::string>()
                                     : item["content"][0]["text"].get<std::string>();
}

TEST(ResponseStore, AConversationIsItsChainOfTurns) {
  ResponseStore store(1 << 20);
  store.Put("a", "", UserSays("one"), ResponseSaying("a", "two"));
  store.Put("b", "a", UserSays("three"), ResponseSaying("b", "four"));
  store.Put("c", "a", UserSays("five"), ResponseSaying("c", "six"));  // a fork of a
  auto b = store.Conversation("b");
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->size(), 4u);
  EXPECT_EQ(TextOf((*b)[0]), "one");
  EXPECT_EQ((*b)[1]["role"], "assistant");
  EXPECT_EQ(TextOf((*b)[1]), "two");
  EXPECT_EQ(TextOf((*b)[3]), "four");
  auto c = store.Conversation("c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(TextOf((*c)[2]), "five");
  // The items that made b: all but its own answer.
  auto made_b = store.Conversation("b", /*with_output=*/false);
  ASSERT_TRUE(made_b.ok());
  ASSERT_EQ(made_b->size(), 3u);
  EXPECT_EQ(TextOf((*made_b)[2]), "three");
  EXPECT_EQ(json::parse(*store.Get("b"))["output"][0]["content"][0]["text"], "four");
  EXPECT_FALSE(store.Get("z").has_value());
  EXPECT_EQ(store.Conversation("z").status().code(), absl::StatusCode::kNotFound);
  // Deleting a turn breaks the chains through it, and says which response is missing.
  EXPECT_TRUE(store.Delete("a"));
  EXPECT_FALSE(store.Delete("a"));
  auto broken = store.Conversation("b");
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(broken.status().message().find("'a'"), std::string::npos) << broken.status();
}

TEST(ResponseStore, EvictsTheLeastRecentlyUsedPastItsBytes) {
  const json big = ResponseSaying("x", std::string(300, 'x'));
  const size_t one = big.dump().size() + UserSays("q").dump().size() + 1;
  ResponseStore store(3 * one + 10);
  store.Put("a", "", UserSays("q"), big);
  store.Put("b", "", UserSays("q"), big);
  store.Put("c", "", UserSays("q"), big);
  EXPECT_LE(store.bytes(), 3 * one + 10);
  ASSERT_TRUE(store.Get("a").has_value());  // a is now the most recent: b goes first
  store.Put("d", "", UserSays("q"), big);
  EXPECT_FALSE(store.Get("b").has_value());
  EXPECT_TRUE(store.Get("a").has_value());
  EXPECT_TRUE(store.Get("c").has_value());
  EXPECT_TRUE(store.Get("d").has_value());
  // Continuing a conversation refreshes every turn of it.
  store.Put("e", "d", UserSays("q"), big);  // evicts a, used before c and d
  EXPECT_TRUE(store.Conversation("e").ok());
  EXPECT_FALSE(store.Get("a").has_value());
  // An entry larger than the whole store is not kept, and evicts nothing.
  const size_t before = store.bytes();
  store.Put("huge", "", UserSays(std::string(4 * one, 'y')), big);
  EXPECT_FALSE(store.Get("huge").has_value());
  EXPECT_EQ(store.bytes(), before);
  // Putting an id again replaces it.
  store.Put("e", "d", UserSays("r"), big);
  ASSERT_EQ(store.Conversation("e")->size(), 4u);
  EXPECT_EQ(TextOf((*store.Conversation("e"))[2]), "r");
  EXPECT_EQ(store.bytes(), before);
}

TEST(ResponseStore, StoringATurnRefreshesTheTurnsItContinues) {
  const json big = ResponseSaying("x", std::string(300, 'x'));
  const size_t one = big.dump().size() + UserSays("q").dump().size() + 1;
  ResponseStore store(4 * one + 10);
  EXPECT_TRUE(store.Put("a", "", UserSays("q"), big));
  EXPECT_TRUE(store.Put("b", "", UserSays("q"), big));
  EXPECT_TRUE(store.Put("c", "", UserSays("q"), big));
  EXPECT_TRUE(store.Put("d", "a", UserSays("q"), big));  // a is in use again
  EXPECT_TRUE(store.Put("e", "", UserSays("q"), big));   // so b goes, not a
  EXPECT_FALSE(store.Get("b").has_value());
  EXPECT_TRUE(store.Conversation("d").ok());
  EXPECT_FALSE(store.Put("huge", "", UserSays(std::string(5 * one, 'y')), big));
}

TEST(ResponsesStore, PreviousResponseIdContinuesAStoredConversation) {
  const ServedModel model{"SmolLM2-135M-Instruct", 8192, {}, "", ""};
  ResponseStore store(1 << 20);
  auto first = ParseResponsesRequest(
      R"({"model": "m", "instructions": "Be brief.", "input": "My name is Ada."})", model, "r1",
      &store);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->responses["store"], true);  // the default with a store
  EXPECT_TRUE(first->responses["previous_response_id"].is_null());
  EXPECT_EQ(first->responses_input, UserSays("My name is Ada."));
  ResponsesBuilder b(*first, "resp_1", 1);
  b.OnResponse(0, Chunk("Hello Ada.", 10, -0.5f));
  b.OnResponse(0, Complete(v1::FINISH_REASON_EOS, 6, 1));
  EXPECT_EQ(b.Final(), json());
  const json body = json::parse(b.Body());
  EXPECT_EQ(b.Final(), body);
  store.Put("resp_1", "", first->responses_input, b.Final());

  // The next turn: the stored turn's input and output come before its own input; its own
  // instructions lead, the first turn's are not carried over.
  auto second = ParseResponsesRequest(
      R"({"instructions": "Answer in French.", "previous_response_id": "resp_1",
          "input": [{"role": "user", "content": "What is my name?"}]})",
      model, "r2", &store);
  ASSERT_TRUE(second.ok()) << second.status();
  const v1::ChatMessages& chat = second->calls[0].chat();
  ASSERT_EQ(chat.messages_size(), 4);
  EXPECT_EQ(chat.messages(0).role(), "system");
  EXPECT_EQ(chat.messages(0).content(), "Answer in French.");
  EXPECT_EQ(chat.messages(1).content(), "My name is Ada.");
  EXPECT_EQ(chat.messages(2).role(), "assistant");
  EXPECT_EQ(chat.messages(2).content(), "Hello Ada.");
  EXPECT_EQ(chat.messages(3).content(), "What is my name?");
  EXPECT_EQ(second->responses["previous_response_id"], "resp_1");
  EXPECT_EQ(second->responses_input.size(), 1u);  // its own input only

  // store: false is echoed; an unknown id is a 400 naming the field; without a store the
  // field is refused and nothing says it was stored.
  auto unkept = ParseResponsesRequest(R"({"input": "x", "store": false})", model, "r3", &store);
  ASSERT_TRUE(unkept.ok());
  EXPECT_EQ(unkept->responses["store"], false);
  for (ResponseStore* s : {&store, static_cast<ResponseStore*>(nullptr)}) {
    for (const char* id : {"\"resp_9\"", "\"\"", "7"}) {
      auto unknown = ParseResponsesRequest(
          absl::StrCat(R"({"input": "x", "previous_response_id": )", id, "}"), model, "r4", s);
      ASSERT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument) << id;
      EXPECT_EQ(ErrorBody(unknown.status())["error"]["param"], "previous_response_id");
    }
  }
  auto stateless = ParseResponsesRequest(R"({"input": "x", "store": true})", model, "r5");
  ASSERT_TRUE(stateless.ok());
  EXPECT_EQ(stateless->responses["store"], false);
}

}  // namespace
}  // namespace tinyserve::openai
