// File: worker/tokenizer/tokenizer.h
// Text <-> token ids for the models TinyServe serves:
//   - byte-level BPE ("gpt2" model) with the `gpt-2` and `smollm` pre-tokenizers (and
//     `default`, which behaves as gpt-2), as llama.cpp and Hugging Face tokenizers do;
//   - SentencePiece-style BPE ("llama" model: scores, byte fallback <0xNN>, space prefix "▁"),
//     as for stories260K and TinyLlama.
// Special tokens (CONTROL, USER_DEFINED) are cut out of the text before BPE when parse_special
// is on; USER_DEFINED always. See shared/reference/model-formats.md §6.
//
// Both GGUF metadata and a Hugging Face tokenizer.json produce a TokenizerData; the Tokenizer
// is built from that, so the two sources share one implementation.
//
// Thread safety: immutable after Create; Encode/Decode may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tinyserve {

// GGUF token types.
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5,
  kByte = 6,
};

struct TokenizerData {
  std::string model;                 // "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre = "default";       // pre-tokenizer for "gpt2": "gpt-2", "smollm", "default"
  std::vector<std::string> tokens;   // token text as stored (byte-level mapped for gpt2)
  std::vector<float> scores;         // "llama": merge priority (higher merges first)
  std::vector<TokenType> types;      // empty means all kNormal
  std::vector<std::string> merges;   // "gpt2": "a b" in rank order
  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  bool add_bos = false;              // prepend BOS when the caller asks for the default
  bool add_space_prefix = false;     // "llama": prepend "▁" to the text
  bool normalize_nfc = false;        // "gpt2": NFC before pre-tokenizing (tokenizer.json "NFC")
  std::vector<int32_t> eog_ids;      // end-of-generation ids (always include eos_id)
  std::string chat_template;         // Jinja source, may be empty
};

class Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerData data);
  virtual ~Tokenizer() = default;

  // Encodes text. parse_special: cut special-token text out as those ids (on for rendered
  // templates, off for raw user text). add_bos: prepend BOS if the vocabulary uses one.
  virtual std::vector<int32_t> Encode(std::string_view text, bool parse_special,
                                      bool add_bos) const = 0;
  // The bytes a token stands for (byte-level and byte-fallback tokens decoded; the llama "▁"
  // turned into a space). Special tokens decode to their text.
  virtual std::string TokenBytes(int32_t id) const = 0;
  // Concatenated bytes of the ids, with the llama leading-space rule applied to the first.
  virtual std::string Decode(const std::vector<int32_t>& ids) const = 0;

  const TokenizerData& data() const { return data_; }
  int32_t vocab_size() const { return static_cast<int32_t>(data_.tokens.size()); }
  int32_t bos_id() const { return data_.bos_id; }
  int32_t eos_id() const { return data_.eos_id; }
  bool IsEog(int32_t id) const;
  bool IsSpecial(int32_t id) const;  // CONTROL, USER_DEFINED or UNKNOWN
  bool IsControl(int32_t id) const;  // CONTROL (end of text, chat markers)

 protected:
  explicit Tokenizer(TokenizerData data) : data_(std::move(data)) {}
  TokenizerData data_;
};

// A message of a chat conversation.
struct ChatMessage {
  ChatMessage(std::string r, std::string c, std::string calls = "", std::string call_id = "",
              std::string reasoning = "")
      : role(std::move(r)),
        content(std::move(c)),
        tool_calls_json(std::move(calls)),
        tool_call_id(std::move(call_id)),
        reasoning_content(std::move(reasoning)) {}
  std::string role;
  std::string content;
  std::string tool_calls_json;  // an assistant turn's tool calls (OpenAI's JSON array), or empty
  std::string tool_call_id;     // a tool turn: the call it answers
  std::string reasoning_content;  // an assistant turn's reasoning (the template's variable)
};

// Renders messages with the model's chat template (a Jinja subset, worker/tokenizer/jinja.h,
// as transformers' apply_chat_template renders it: messages, add_generation_prompt, bos_token,
// eos_token); plain ChatML when the model has no template or one outside the subset (logged
// once). INVALID_ARGUMENT when the template refuses the messages (its raise_exception, e.g.
// roles that do not alternate). add_generation_prompt: the template's assistant header.
// tools_json: the template's `tools` (a JSON array), or empty for none. continue_final_message:
// the text ends where the final message's content does, so generation continues it (as
// transformers renders it: a marker appended to that content, the rendering cut at the marker);
// INVALID_ARGUMENT when the template drops the content.
// template_kwargs_json: more variables for the template (vLLM's chat_template_kwargs, e.g.
// {"enable_thinking": false} for Qwen3), checked by CheckTemplateKwargs.
absl::StatusOr<std::string> RenderChat(const TokenizerData& data,
                                       const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt, std::string_view tools_json = "",
                                       bool continue_final_message = false,
                                       std::string_view template_kwargs_json = "");
// OK when text is empty or a JSON object (nested at most 32 deep) that sets none of the
// variables RenderChat sets itself (messages, tools, add_generation_prompt, bos_token,
// eos_token); else INVALID_ARGUMENT saying why.
absl::Status CheckTemplateKwargs(std::string_view template_kwargs_json);
// OK when the model's chat template is empty or within the Jinja subset; else why not.
absl::Status CheckChatTemplate(const TokenizerData& data);

// Accumulates token bytes and releases only complete UTF-8 sequences, for streaming output.
class Utf8StreamDecoder {
 public:
  // Appends bytes; returns the longest prefix of pending bytes that is complete UTF-8.
  std::string Push(std::string_view bytes);
  // Returns whatever is left (possibly an incomplete sequence).
  std::string Flush();

 private:
  std::string pending_;
};

// True if s is valid UTF-8.
bool IsValidUtf8(std::string_view s);

}  // namespace tinyserve
