// File: worker/tokenizer/hf_tokenizer_json.h
// TokenizerData from a Hugging Face tokenizer.json, so a Hugging Face folder and a GGUF file
// feed the same Tokenizer.
//
// Supported:
//   - model.type "BPE" with a ByteLevel pre-tokenizer -> model "gpt2": vocab, merges (either
//     "a b" strings or ["a", "b"] pairs), pre "smollm" when a Digits(individual_digits)
//     pre-tokenizer comes before ByteLevel, else "gpt-2";
//   - model.type "BPE" with byte_fallback and a Metaspace pre-tokenizer or a Replace(" ", "▁")
//     normalizer (Llama/TinyLlama style) -> model "llama": scores are derived from merge
//     ranks (the token a merge of rank r produces scores -r; others score -1e9 or 0 for
//     single characters), <0xNN> tokens become BYTE, add_bos and add_space_prefix are set.
//   - normalizer: NFC on a byte-level BPE (Qwen2's; Tokenizer applies it to the text between
//     special tokens, worker/tokenizer/unicode.h NormalizeNfc); Prepend / Replace on a
//     SentencePiece one; any other is refused by name.
//   - added_tokens: special -> CONTROL, otherwise USER_DEFINED (both keep their ids).
// A tokenizer_config.json beside the file, when present, supplies bos_token, eos_token,
// unk_token, pad_token, add_bos_token and chat_template.
//
// Errors: NotFound for a missing file; InvalidArgument naming the field for anything else.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {

absl::StatusOr<TokenizerData> TokenizerDataFromHfJson(const std::string& path);

// The same from JSON text already read; config_json may be empty.
absl::StatusOr<TokenizerData> TokenizerDataFromHfJsonText(const std::string& tokenizer_json,
                                                          const std::string& config_json);

}  // namespace tinyserve
