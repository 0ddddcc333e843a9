// File: worker/server/openai_test_util.h
// Worker messages and event parsing for the HTTP API's unit tests (openai_api_test.cc,
// openai_responses_test.cc, anthropic_api_test.cc).
#pragma once

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tinyserve/v1/tinyserve.pb.h"

namespace tinyserve::openai {

// A chunk of one token with its logprob (the token its own top alternative).
inline tinyserve::v1::GenerateResponse Chunk(const std::string& text, int token, float logprob) {
  tinyserve::v1::GenerateResponse r;
  tinyserve::v1::Chunk* c = r.mutable_chunk();
  c->add_token_ids(token);
  c->set_text(text);
  tinyserve::v1::TokenLogprobs* lp = c->add_logprobs();
  lp->set_token_id(token);
  lp->set_logprob(logprob);
  lp->set_text(text);
  tinyserve::v1::TopLogprob* top = lp->add_top();
  top->set_token_id(token);
  top->set_logprob(logprob);
  top->set_text(text);
  return r;
}

// The end of a choice: usage (half the prompt cached), worker "w1", policy "quest".
inline tinyserve::v1::GenerateResponse Complete(tinyserve::v1::FinishReason reason, int prompt,
                                                int completion) {
  tinyserve::v1::GenerateResponse r;
  tinyserve::v1::Complete* c = r.mutable_complete();
  c->set_finish_reason(reason);
  c->mutable_usage()->set_prompt_tokens(prompt);
  c->mutable_usage()->set_completion_tokens(completion);
  c->mutable_usage()->set_cached_tokens(prompt / 2);
  c->set_worker("w1");
  c->mutable_selection()->set_policy("quest");
  c->mutable_usage()->set_spec_draft_tokens(7);
  c->mutable_usage()->set_spec_accepted_tokens(5);
  return r;
}

// The JSON objects of a string of server-sent events ("data: ...\n\n").
inline std::vector<std::string> Events(const std::string& sse) {
  std::vector<std::string> out;
  std::istringstream in(sse);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("data: ", 0) == 0) out.push_back(line.substr(6));
  }
  return out;
}

// (type, data) of each server-sent event of the typed APIs ("event: TYPE\ndata: {...}\n\n").
inline std::vector<std::pair<std::string, nlohmann::ordered_json>> TypedEvents(
    const std::string& sse) {
  std::vector<std::pair<std::string, nlohmann::ordered_json>> out;
  std::istringstream in(sse);
  std::string line, type;
  while (std::getline(in, line)) {
    if (line.rfind("event: ", 0) == 0) type = line.substr(7);
    if (line.rfind("data: ", 0) == 0) {
      out.emplace_back(type, nlohmann::ordered_json::parse(line.substr(6)));
    }
  }
  return out;
}

}  // namespace tinyserve::openai
