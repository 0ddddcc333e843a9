// File: worker/sampling/reasoning_constraint.h
// A reasoning model's <think> block under constrained decoding and a thinking budget (vLLM's
// semantics): the block is free text, and a structured output (the inner constraint: JSON,
// regex, grammar) holds only the answer after it. With a budget (vLLM's
// thinking_token_budget, llama.cpp's reasoning budget, Anthropic's thinking.budget_tokens),
// once the model has spent `budget` tokens inside the block without closing it, the block is
// closed for it: the tokens of "\n</think>" are forced one by one (the model, or the inner
// constraint, goes on from there).
//
//   kIdle      (qwen3's format) thinking has not begun: a token whose text (after leading
//              whitespace) starts with "<think>" opens the block (Qwen3's and DeepSeek's
//              vocabularies have it as one token); any other text begins the answer (kDone).
//              Whitespace before either is given to the inner constraint too.
//   kCounting  inside the block (deepseek_r1's format starts here: its prompt opened it):
//              anything goes but, with an inner constraint, the end of generation (the answer
//              must come); "</think>" from the model ends it (kDone); the budget's last token,
//              or the end of a UTF-8 character it began, starts kForcing.
//   kForcing   only the next forced token is allowed.
//   kDone      the inner constraint's rules (everything without one).
//
// Thread safety: per request, like the Sampler that owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "worker/sampling/json_constraint.h"

namespace tinyserve {

class ReasoningConstraint final : public TokenConstraint {
 public:
  enum class State { kIdle, kCounting, kForcing, kDone };

  // start: kIdle (qwen3: the output may open the block), kCounting (the prompt opened it:
  // deepseek_r1, or a prompt ending inside a block) or kDone (the prompt closed it: thinking
  // turned off). budget: tokens inside the block (unset: no limit). forced: the tokens of
  // "\n</think>". inner: what the answer is held to (null: nothing).
  ReasoningConstraint(std::shared_ptr<const TokenTable> table, State start,
                      std::optional<int> budget, std::vector<int32_t> forced,
                      std::unique_ptr<TokenConstraint> inner);
  // The state the current assistant turn's text (what the prompt holds of it) leaves for
  // `format` ("qwen3", "deepseek_r1"): kCounting inside an open <think> block, kDone after a
  // closed one (thinking turned off, or continued past it), else the format's own start
  // (deepseek_r1's prompt opens the block).
  static State StartOf(std::string_view turn, std::string_view format);
  // StartOf the prompt's text after its last special token other than the think tags (the
  // assistant header), at most 4096 tokens back.
  static State StartOfPrompt(const TokenTable& table, const std::vector<int32_t>& prompt,
                             std::string_view format);

  bool Allows(int32_t id) const override;
  void AllowedTokens(int vocab, std::vector<uint8_t>* allowed) const override;
  void Accept(int32_t id) override;
  absl::Status status() const override;
  State state() const { return state_; }

 private:
  std::string_view BytesOf(int32_t id) const;
  bool Opens(int32_t id) const;  // kIdle: the token opens the block
  bool IsEnd(int32_t id) const;  // an end-of-generation token
  void StartCounting();

  std::shared_ptr<const TokenTable> table_;
  const std::optional<int> budget_;
  const std::vector<int32_t> forced_;
  std::unique_ptr<TokenConstraint> inner_;
  State state_;
  std::string tail_;  // kCounting: the block's last bytes (a "</think>" across tokens)
  int spent_ = 0;     // tokens inside the block (counted up to the budget)
  int overrun_ = 0;   // tokens past the budget that finish a UTF-8 character
  size_t next_ = 0;   // kForcing: the forced token due
};

}  // namespace tinyserve
