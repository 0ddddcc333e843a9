#include "worker/server/response_store.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tinyserve::openai {

using json = nlohmann::ordered_json;

void ResponseStore::Put(const std::string& id, const std::string& previous_id, const json& input,
                        const json& response) {
  auto text = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  Entry entry{previous_id, text(input), text(response), {}};
  const size_t size = entry.bytes() + id.size();
  if (size > max_bytes_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(id); it != entries_.end()) Erase(it);
  while (bytes_ + size > max_bytes_ && !order_.empty()) Erase(entries_.find(order_.back()));
  order_.push_front(id);
  entry.order = order_.begin();
  entries_.emplace(id, std::move(entry));
  bytes_ += size;
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

absl::StatusOr<json> ResponseStore::Conversation(const std::string& id) {
  std::vector<const Entry*> chain;  // newest first
  std::lock_guard<std::mutex> lock(mu_);
  for (std::string at = id; !at.empty();) {
    const Entry* e = Touch(at);
    if (e == nullptr) {
      return absl::NotFoundError(
          at == id
              ? absl::StrCat("no stored response '", id, "' (never stored, deleted or evicted)")
              : absl::StrCat("response '", id, "' continues '", at,
                             "', which is no longer stored (deleted or evicted)"));
    }
    chain.push_back(e);
    if (chain.size() > entries_.size()) return absl::InternalError("a cycle of stored responses");
    at = e->previous_id;
  }
  json items = json::array();
  for (auto e = chain.rbegin(); e != chain.rend(); ++e) {
    for (json& item : json::parse((*e)->input)) items.push_back(std::move(item));
    json response = json::parse((*e)->response);
    for (json& item : response["output"]) items.push_back(std::move(item));
  }
  return items;
}

std::optional<std::string> ResponseStore::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = Touch(id);
  if (e == nullptr) return std::nullopt;
  return e->response;
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
