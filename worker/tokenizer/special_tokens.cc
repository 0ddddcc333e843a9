// File: worker/tokenizer/special_tokens.cc
#include "worker/tokenizer/special_tokens.h"

#include <algorithm>
#include <list>

namespace tinyserve {

SpecialTokenSplitter::SpecialTokenSplitter(const TokenizerData& data) {
  for (size_t id = 0; id < data.types.size() && id < data.tokens.size(); ++id) {
    const TokenType type = data.types[id];
    if (data.tokens[id].empty()) continue;
    if (type == TokenType::kControl || type == TokenType::kUnknown ||
        type == TokenType::kUserDefined) {
      entries_.push_back(
          {data.tokens[id], static_cast<int32_t>(id), type == TokenType::kUserDefined});
    }
  }
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) { return a.text.size() > b.text.size(); });
}

std::vector<TextFragment> SpecialTokenSplitter::Split(std::string_view text,
                                                      bool parse_special) const {
  std::list<TextFragment> fragments;
  if (!text.empty()) fragments.push_back({-1, text});
  for (const Entry& entry : entries_) {
    if (!parse_special && !entry.always) continue;
    for (auto it = fragments.begin(); it != fragments.end(); ++it) {
      if (it->token >= 0) continue;
      std::string_view raw = it->text;
      size_t match = raw.find(entry.text);
      if (match == std::string_view::npos) continue;
      // Replace this raw fragment by [left] token [left] token ... [rest].
      while (match != std::string_view::npos) {
        if (match > 0) fragments.insert(it, {-1, raw.substr(0, match)});
        fragments.insert(it, {entry.id, {}});
        raw = raw.substr(match + entry.text.size());
        match = raw.find(entry.text);
      }
      if (raw.empty()) {
        it = fragments.erase(it);
        --it;  // the token just inserted; the loop's ++it moves past it
      } else {
        it->text = raw;
      }
    }
  }
  return {fragments.begin(), fragments.end()};
}

}  // namespace tinyserve
