#include "worker/sampling/reasoning_constraint.h"

#include <algorithm>
#include <string_view>
#include <utility>

namespace tinyserve {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>", kSpace = " \t\r\n";

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

ReasoningConstraint::ReasoningConstraint(std::shared_ptr<const TokenTable> table, State start,
                                         std::optional<int> budget, std::vector<int32_t> forced,
                                         std::unique_ptr<TokenConstraint> inner)
    : table_(std::move(table)),
      budget_(budget),
      forced_(std::move(forced)),
      inner_(std::move(inner)),
      state_(start == State::kDone ? State::kDone : State::kIdle) {
  if (start == State::kCounting || start == State::kForcing) StartCounting();
}

ReasoningConstraint::State ReasoningConstraint::StartOf(std::string_view turn,
                                                        std::string_view format) {
  const size_t open = turn.rfind(kOpen), close = turn.rfind(kClose);
  if (open != std::string_view::npos && (close == std::string_view::npos || open > close))
    return State::kCounting;
  if (close != std::string_view::npos) return State::kDone;
  return format == "deepseek_r1" ? State::kCounting : State::kIdle;
}

ReasoningConstraint::State ReasoningConstraint::StartOfPrompt(const TokenTable& table,
                                                              const std::vector<int32_t>& prompt,
                                                              std::string_view format) {
  size_t from = prompt.size();
  for (size_t steps = 0; from > 0 && steps < 4096; --from, ++steps) {
    const int32_t id = prompt[from - 1];
    if (id < 0 || static_cast<size_t>(id) >= table.bytes.size()) continue;
    const std::string& b = table.bytes[id];
    if (table.kind[id] != TokenTable::kNormal && b != kOpen && b != kClose) break;
  }
  std::string turn;
  for (size_t i = from; i < prompt.size(); ++i) {
    if (prompt[i] >= 0 && static_cast<size_t>(prompt[i]) < table.bytes.size())
      turn += table.bytes[prompt[i]];
  }
  return StartOf(turn, format);
}

std::string_view ReasoningConstraint::BytesOf(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= table_->bytes.size() ||
      table_->kind[id] == TokenTable::kEnd)
    return {};
  return table_->bytes[id];
}

bool ReasoningConstraint::IsEnd(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < table_->kind.size() &&
         table_->kind[id] == TokenTable::kEnd;
}

bool ReasoningConstraint::Opens(int32_t id) const {
  std::string_view b = BytesOf(id);
  const size_t start = b.find_first_not_of(kSpace);
  return start != std::string_view::npos && b.substr(start, kOpen.size()) == kOpen;
}

void ReasoningConstraint::StartCounting() {
  state_ = State::kCounting;
  tail_.clear();
  spent_ = overrun_ = 0;
  if (budget_.has_value() && *budget_ <= 0) {
    state_ = forced_.empty() ? State::kDone : State::kForcing;
    next_ = 0;
  }
}

bool ReasoningConstraint::Allows(int32_t id) const {
  switch (state_) {
    case State::kIdle:
      return inner_ == nullptr || Opens(id) || inner_->Allows(id);
    case State::kCounting:  // with a structured answer to come, no end inside the block
      return inner_ == nullptr || !IsEnd(id);
    case State::kForcing:
      return id == forced_[next_];
    case State::kDone:
      return inner_ == nullptr || inner_->Allows(id);
  }
  return true;
}

void ReasoningConstraint::AllowedTokens(int vocab, std::vector<uint8_t>* allowed) const {
  if (state_ == State::kForcing) {
    allowed->assign(vocab, 0);
    if (forced_[next_] >= 0 && forced_[next_] < vocab) (*allowed)[forced_[next_]] = 1;
  } else if (state_ == State::kCounting || inner_ == nullptr) {
    allowed->assign(vocab, 1);
    if (state_ == State::kCounting && inner_ != nullptr) {
      const int n = std::min<int>(vocab, static_cast<int>(table_->kind.size()));
      for (int id = 0; id < n; ++id) (*allowed)[id] = !IsEnd(id);
    }
  } else {
    inner_->AllowedTokens(vocab, allowed);
    if (state_ == State::kIdle) {
      const int n = std::min<int>(vocab, static_cast<int>(table_->bytes.size()));
      for (int id = 0; id < n; ++id) {
        if (!(*allowed)[id] && Opens(id)) (*allowed)[id] = 1;
      }
    }
  }
}

void ReasoningConstraint::Accept(int32_t id) {
  const std::string_view bytes = BytesOf(id);
  switch (state_) {
    case State::kIdle:
      if (Opens(id)) {
        StartCounting();
        if (state_ == State::kCounting) {  // what follows "<think>" in the token is inside
          const size_t at = bytes.find(kOpen) + kOpen.size();
          tail_.assign(bytes.substr(at));
          if (tail_.find(kClose) != std::string::npos) state_ = State::kDone;
        }
        break;
      }
      if (inner_ != nullptr) inner_->Accept(id);
      // Whitespace keeps it undecided; anything else is the answer, without thinking.
      if (bytes.empty() || bytes.find_first_not_of(kSpace) != std::string_view::npos)
        state_ = State::kDone;
      break;
    case State::kCounting:
      tail_.append(bytes);
      if (tail_.find(kClose) != std::string::npos) {
        state_ = State::kDone;  // closed by the model (within its budget)
        break;
      }
      if (tail_.size() > 16) tail_.erase(0, tail_.size() - 16);  // enough to see kClose
      if (!budget_.has_value()) break;
      if (spent_ < *budget_) ++spent_;
      // At the budget; a character it began is finished first (at most 3 more tokens).
      if (spent_ >= *budget_ && (!EndsMidCharacter(tail_) || ++overrun_ > 3)) {
        state_ = forced_.empty() ? State::kDone : State::kForcing;
        next_ = 0;
      }
      break;
    case State::kForcing:
      // Another token (a migrated request's replayed output): the close starts over.
      next_ = id == forced_[next_] ? next_ + 1 : id == forced_[0] ? 1 : 0;
      if (next_ == forced_.size()) state_ = State::kDone;
      break;
    case State::kDone:
      if (inner_ != nullptr) inner_->Accept(id);
      break;
  }
}

absl::Status ReasoningConstraint::status() const {
  return inner_ != nullptr ? inner_->status() : absl::OkStatus();
}

}  // namespace tinyserve
