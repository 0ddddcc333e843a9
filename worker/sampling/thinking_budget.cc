#include "worker/sampling/thinking_budget.h"

#include <algorithm>
#include <string_view>
#include <utility>

namespace tinyserve {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

// The bytes end inside a UTF-8 character (a lead byte whose continuation bytes are missing).
bool EndsMidCharacter(std::string_view s) {
  for (size_t back = 1; back <= std::min<size_t>(4, s.size()); ++back) {
    const unsigned char c = static_cast<unsigned char>(s[s.size() - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back;
  }
  return false;
}

}  // namespace

ThinkingBudgetConstraint::ThinkingBudgetConstraint(std::shared_ptr<const TokenTable> table,
                                                   bool open, int budget,
                                                   std::vector<int32_t> forced)
    : table_(std::move(table)), budget_(budget), forced_(std::move(forced)), state_(State::kIdle) {
  if (open) StartCounting();
}

void ThinkingBudgetConstraint::StartCounting() {
  state_ = State::kCounting;
  text_.clear();
  spent_ = 0;
  if (budget_ <= 0) state_ = forced_.empty() ? State::kDone : State::kForcing;
}

bool ThinkingBudgetConstraint::Allows(int32_t id) const {
  return state_ != State::kForcing || id == forced_[next_];
}

void ThinkingBudgetConstraint::AllowedTokens(int vocab, std::vector<uint8_t>* allowed) const {
  if (state_ != State::kForcing) {
    allowed->assign(vocab, 1);
    return;
  }
  allowed->assign(vocab, 0);
  if (forced_[next_] >= 0 && forced_[next_] < vocab) (*allowed)[forced_[next_]] = 1;
}

void ThinkingBudgetConstraint::Accept(int32_t id) {
  const bool known = id >= 0 && static_cast<size_t>(id) < table_->bytes.size();
  const std::string_view bytes = known && table_->kind[id] != TokenTable::kEnd
                                     ? std::string_view(table_->bytes[id])
                                     : std::string_view();
  switch (state_) {
    case State::kIdle: {
      text_.append(bytes);
      const size_t start = text_.find_first_not_of(" \t\r\n");
      const std::string_view said =
          start == std::string::npos ? std::string_view() : std::string_view(text_).substr(start);
      if (said.substr(0, kOpen.size()) == kOpen) {
        StartCounting();
      } else if (kOpen.substr(0, said.size()) != said) {
        state_ = State::kDone;  // an answer without thinking
      }
      break;
    }
    case State::kCounting:
      text_.append(bytes);
      if (text_.find(kClose) != std::string::npos) {
        state_ = State::kDone;  // closed by the model within its budget
        break;
      }
      if (text_.size() > 16) text_.erase(0, text_.size() - 16);  // enough to see kClose
      if (++spent_ >= budget_ && !EndsMidCharacter(text_)) {
        state_ = forced_.empty() ? State::kDone : State::kForcing;
        next_ = 0;
      }
      break;
    case State::kForcing:
      if (id == forced_[next_] && ++next_ == forced_.size()) state_ = State::kDone;
      break;
    case State::kDone:
      break;
  }
}

}  // namespace tinyserve
