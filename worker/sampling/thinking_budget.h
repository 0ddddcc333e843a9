// File: worker/sampling/thinking_budget.h
// A reasoning model's thinking budget (vLLM's thinking_token_budget, llama.cpp's reasoning
// budget, Anthropic's thinking.budget_tokens): once the model has spent `budget` output tokens
// inside its <think> block without closing it, the block is closed for it: the tokens of
// "\n</think>\n\n" are forced one by one, and the answer follows freely.
//
//   kIdle      (qwen3's format) thinking has not begun: the output must open with "<think>"
//              (after whitespace); any other start means the model is not thinking (kDone).
//   kCounting  inside the block (deepseek_r1's format starts here: its prompt opened it);
//              "</think>" ends it (kDone); the budget's last token, or the end of a UTF-8
//              character it began, starts kForcing.
//   kForcing   only the next forced token is allowed.
//   kDone      everything is allowed.
//
// Thread safety: per request, like the Sampler that owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/sampling/json_constraint.h"

namespace tinyserve {

class ThinkingBudgetConstraint final : public TokenConstraint {
 public:
  enum class State { kIdle, kCounting, kForcing, kDone };

  // open: thinking begins with the first output token (deepseek_r1), else at "<think>"
  // (qwen3). forced: the tokens of "\n</think>\n\n".
  ThinkingBudgetConstraint(std::shared_ptr<const TokenTable> table, bool open, int budget,
                           std::vector<int32_t> forced);

  bool Allows(int32_t id) const override;
  void AllowedTokens(int vocab, std::vector<uint8_t>* allowed) const override;
  void Accept(int32_t id) override;
  State state() const { return state_; }

 private:
  void StartCounting();

  std::shared_ptr<const TokenTable> table_;
  const int budget_;
  const std::vector<int32_t> forced_;
  State state_;
  std::string text_;  // kIdle: the output so far; kCounting: its last bytes
  int spent_ = 0;     // tokens inside the block
  size_t next_ = 0;   // kForcing: the forced token due
};

}  // namespace tinyserve
