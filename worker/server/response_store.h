// File: worker/server/response_store.h
// The Responses API's stored responses (store: true, the default), so that a later request can
// continue one by previous_response_id and GET /v1/responses/{id} can fetch it, as OpenAI's and
// vLLM's servers keep them. Each entry holds its own turn only: the request's input items, the
// response object (whose output items are the answer) and the id of the response it continued;
// a conversation is the chain walked back to its first response.
//
// Bounded by bytes (the JSON text kept; the maps' own overhead is not counted), least recently
// used evicted first; continuing a response, or storing the turn that continues it, refreshes
// it and every response before it; fetching one refreshes that one. A chain whose older part
// was evicted or deleted can no longer be continued (Conversation says which response is
// missing). Kept in the process's memory: a restart forgets them, and several router replicas
// each keep their own.
//
// Threading: all methods are thread-safe (one mutex, not held while JSON is parsed).
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tinyserve::openai {

class ResponseStore {
 public:
  explicit ResponseStore(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Keeps a response: `input` this request's input items (a list), `response` the response
  // object. False when it is larger than the whole store (not kept).
  bool Put(const std::string& id, const std::string& previous_id,
           const nlohmann::ordered_json& input, const nlohmann::ordered_json& response);
  // The conversation up to and including response `id`, as Responses input items, oldest
  // first: each turn's input items, then its output items (with_output false: not response
  // `id`'s own, which leaves the items that made it: GET .../input_items). NotFound names the
  // missing response.
  absl::StatusOr<nlohmann::ordered_json> Conversation(const std::string& id,
                                                      bool with_output = true);
  // The stored response object, as JSON text.
  std::optional<std::string> Get(const std::string& id);
  // False when there was none.
  bool Delete(const std::string& id);

  size_t bytes() const;

 private:
  using Text = std::shared_ptr<const std::string>;  // shared with readers parsing it unlocked
  struct Entry {
    std::string previous_id;
    Text input;     // JSON text of the input items
    Text response;  // JSON text of the response object
    std::list<std::string>::iterator order;
    size_t bytes() const { return previous_id.size() + input->size() + response->size(); }
  };
  // The entry, moved to the front of the recency order; null if absent.
  Entry* Touch(const std::string& id);                              // REQUIRES(mu_)
  void Erase(std::unordered_map<std::string, Entry>::iterator it);  // REQUIRES(mu_)

  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::list<std::string> order_;                    // most recent first; GUARDED_BY(mu_)
  std::unordered_map<std::string, Entry> entries_;  // GUARDED_BY(mu_)
  size_t bytes_ = 0;                                // GUARDED_BY(mu_)
};

}  // namespace tinyserve::openai
