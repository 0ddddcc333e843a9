#include "worker/server/response_store.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tinyserve::openai {

using json = nlohmann::ordered_json;

bool ResponseStore::Put(const std::string& id, const std::string& previous_id, const json& input,
                        const json& response) {
  auto text = [](const json& j) {
    return std::make_shared<const std::string>(
        j.dump(-1, ' ', false, json::error_handler_t::replace));
  };
  Entry entry{previous_id, text(input), text(response), {}};
  const size_t size = entry.bytes() + id.size();
  if (size > max_bytes_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  // The turns it continues are in use again: they go after it in the eviction order.
  size_t steps = 0;
  for (const Entry* e = Touch(previous_id); e != nullptr && ++steps <= entries_.size();)
    e = Touch(e->previous_id);
  if (auto it = entries_.find(id); it != entries_.end()) Erase(it);
  while (bytes_ + size > max_bytes_ && !order_.empty()) Erase(entries_.find(order_.back()));
  order_.push_front(id);
  entry.order = order_.begin();
  entries_.emplace(id, std::move(entry));
  bytes_ += size;
  return true;
}

ResponseStore::Entry* ResponseStore::Touch(const std::string& id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second.order);
  return &it->second;
}

void ResponseStore::Erase(std::unordered_map<std::string, Entry>::iterator it) {
  bytes_ -= it->second.bytes() + it->first.size();
  order_.erase(it->second.order);
  entries_.erase(it);
}

absl::StatusOr<json> ResponseStore::Conversation(const std::string& id, bool with_output) {
  std::vector<std::pair<Text, Text>> chain;  // newest first
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::string at = id; !at.empty();) {
      const Entry* e = Touch(at);
      if (e == nullptr) {
        const std::string shown = id.substr(0, 100);
        return absl::NotFoundError(
            at == id ? absl::StrCat("no stored response '", shown,
                                    "' (never stored, deleted or evicted)")
                     : absl::StrCat("response '", shown, "' continues '", at,
                                    "', which is no longer stored (deleted or evicted)"));
      }
      chain.emplace_back(e->input, e->response);
      if (chain.size() > entries_.size()) return absl::InternalError("a cycle of stored responses");
      at = e->previous_id;
    }
  }
  json items = json::array();
  for (auto turn = chain.rbegin(); turn != chain.rend(); ++turn) {
    for (json& item : json::parse(*turn->first)) items.push_back(std::move(item));
    if (!with_output && turn + 1 == chain.rend()) break;
    json response = json::parse(*turn->second);
    for (json& item : response["output"]) items.push_back(std::move(item));
  }
  return items;
}

std::optional<std::string> ResponseStore::Get(const std::string& id) {
  Text response;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Entry* e = Touch(id);
    if (e == nullptr) return std::nullopt;
    response = e->response;
  }
  return *response;
}

bool ResponseStore::Delete(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  Erase(it);
  return true;
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace tinyserve::openai
