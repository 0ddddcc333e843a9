// File: worker/tokenizer/hf_tokenizer_json.cc
#include "worker/tokenizer/hf_tokenizer_json.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/tokenizer/token_text.h"
#include "worker/tokenizer/unicode.h"

namespace tinyserve {
namespace {

using nlohmann::json;

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", what));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The Split regexes of Llama 3's and Qwen2's tokenizer.json (pre_tokenizer.h).
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Every pre-tokenizer of a (possibly Sequence) pre_tokenizer, in order.
void Flatten(const json& node, std::vector<const json*>* out) {
  if (!node.is_object()) return;
  if (node.value("type", "") == "Sequence" && node.contains("pretokenizers")) {
    for (const json& child : node["pretokenizers"]) Flatten(child, out);
    return;
  }
  if (node.value("type", "") == "Sequence" && node.contains("normalizers")) {
    for (const json& child : node["normalizers"]) Flatten(child, out);
    return;
  }
  out->push_back(&node);
}

bool HasType(const std::vector<const json*>& nodes, std::string_view type) {
  for (const json* n : nodes) {
    if (n->value("type", "") == type) return true;
  }
  return false;
}

// The token text of a special-token entry in tokenizer_config.json ("x" or {"content": "x"}).
std::string ConfigToken(const json& config, const char* key) {
  if (!config.contains(key)) return {};
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return {};
}

absl::Status ParseMerges(const json& merges, std::vector<std::string>* out) {
  if (!merges.is_array()) return Bad("model.merges is not an array");
  out->reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      out->push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out->push_back(absl::StrCat(m[0].get<std::string>(), " ", m[1].get<std::string>()));
    } else {
      return Bad(absl::StrCat("model.merges[", i, "] is neither \"a b\" nor [a, b]"));
    }
  }
  return absl::OkStatus();
}

// SentencePiece-style scores for a BPE vocabulary: the token a merge of rank r produces
// scores -r, so higher scores merge first as lower ranks do.
void ScoresFromMerges(TokenizerData* data) {
  std::unordered_map<std::string, int32_t> ids;
  for (size_t i = 0; i < data->tokens.size(); ++i) ids.emplace(data->tokens[i], i);
  data->scores.assign(data->tokens.size(), -1e9f);
  for (size_t i = 0; i < data->tokens.size(); ++i) {
    const std::string& t = data->tokens[i];
    size_t offset = 0;
    DecodeUtf8(t, &offset);
    if (offset == t.size()) data->scores[i] = 0.0f;  // a single character
  }
  for (size_t rank = 0; rank < data->merges.size(); ++rank) {
    const std::string& m = data->merges[rank];
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos) continue;
    auto it = ids.find(m.substr(0, space) + m.substr(space + 1));
    if (it != ids.end() && data->scores[it->second] == -1e9f) {
      data->scores[it->second] = -static_cast<float>(rank);
    }
  }
  data->merges.clear();
}

}  // namespace

absl::StatusOr<TokenizerData> TokenizerDataFromHfJsonText(const std::string& tokenizer_json,
                                                          const std::string& config_json) {
  json root = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object()) return Bad("not a JSON object");
  if (!root.contains("model") || !root["model"].is_object()) return Bad("no model object");
  const json& model = root["model"];
  if (model.value("type", "") != "BPE") {
    return Bad(absl::StrCat("model.type '", model.value("type", ""), "' is not BPE"));
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) return Bad("no model.vocab");

  TokenizerData data;
  // Vocabulary, by id; added tokens may extend it.
  std::vector<std::pair<int64_t, std::string>> entries;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    if (!it.value().is_number_integer()) return Bad(absl::StrCat("vocab['", it.key(), "']"));
    entries.emplace_back(it.value().get<int64_t>(), it.key());
  }
  std::vector<std::pair<int64_t, bool>> added;  // id, special
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    for (const json& t : root["added_tokens"]) {
      if (!t.contains("id") || !t.contains("content") || !t["id"].is_number_integer() ||
          !t["content"].is_string()) {
        return Bad("an added_tokens entry lacks id or content");
      }
      entries.emplace_back(t["id"].get<int64_t>(), t["content"].get<std::string>());
      added.emplace_back(t["id"].get<int64_t>(), t.value("special", false));
    }
  }
  int64_t max_id = -1;
  for (const auto& [id, text] : entries) {
    if (id < 0 || id > (1 << 24)) return Bad(absl::StrCat("token id ", id, " out of range"));
    max_id = std::max(max_id, id);
  }
  data.tokens.assign(max_id + 1, std::string());
  data.types.assign(max_id + 1, TokenType::kUnused);
  for (const auto& [id, text] : entries) {
    data.tokens[id] = text;
    data.types[id] = TokenType::kNormal;
  }
  for (const auto& [id, special] : added) {
    data.types[id] = special ? TokenType::kControl : TokenType::kUserDefined;
  }
  if (model.contains("merges")) TS_RETURN_IF_ERROR(ParseMerges(model["merges"], &data.merges));

  std::vector<const json*> pre, norm;
  if (root.contains("pre_tokenizer")) Flatten(root["pre_tokenizer"], &pre);
  if (root.contains("normalizer")) Flatten(root["normalizer"], &norm);
  const bool byte_fallback = model.value("byte_fallback", false);
  if (HasType(pre, "ByteLevel")) {
    data.model = "gpt2";
    data.pre = "gpt-2";
    for (const json* n : pre) {
      const std::string type = n->value("type", "");
      if (type == "Digits" && n->value("individual_digits", false)) data.pre = "smollm";
      if (type == "Split") {
        // Llama 3 and Qwen2 split by a regex of their own before a ByteLevel without one.
        const json* regex = n->contains("pattern") && (*n)["pattern"].is_object() &&
                                    (*n)["pattern"].contains("Regex") &&
                                    (*n)["pattern"]["Regex"].is_string()
                                ? &(*n)["pattern"]["Regex"]
                                : nullptr;
        const std::string pattern = regex != nullptr ? regex->get<std::string>() : "";
        if (pattern == kLlama3Pattern) {
          data.pre = "llama-bpe";
        } else if (pattern == kQwen2Pattern) {
          data.pre = "qwen2";
        } else {
          return Bad(absl::StrCat("unsupported pre_tokenizer Split pattern '",
                                  pattern.substr(0, 80),
                                  "' (TinyServe implements Llama 3's and Qwen2's)"));
        }
      }
    }
  } else if (byte_fallback || HasType(pre, "Metaspace") || HasType(norm, "Prepend")) {
    data.model = "llama";
    data.add_bos = true;
    data.add_space_prefix = HasType(norm, "Prepend");
    for (const json* n : pre) {
      if (n->value("type", "") == "Metaspace" &&
          n->value("prepend_scheme", std::string("always")) != "never" &&
          n->value("add_prefix_space", true)) {
        data.add_space_prefix = true;
      }
    }
    for (size_t i = 0; i < data.tokens.size(); ++i) {
      if (data.types[i] == TokenType::kNormal && ParseByteToken(data.tokens[i]) >= 0) {
        data.types[i] = TokenType::kByte;
      }
    }
    ScoresFromMerges(&data);
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      const std::string unk = model["unk_token"].get<std::string>();
      for (size_t i = 0; i < data.tokens.size(); ++i) {
        if (data.tokens[i] == unk) {
          data.unk_id = static_cast<int32_t>(i);
          data.types[i] = TokenType::kUnknown;
        }
      }
    }
  } else {
    return Bad("unsupported pre_tokenizer (want ByteLevel, or Metaspace / byte_fallback)");
  }
  // Normalizers: byte-level BPE's NFC (Qwen2's) runs before pre-tokenizing; SentencePiece's
  // Prepend / Replace are its "▁" handling above. Any other would change ids unseen: refused.
  for (const json* n : norm) {
    const std::string type = n->value("type", "");
    if (type == "NFC" && data.model == "gpt2") {
      data.normalize_nfc = true;
    } else if ((type != "Prepend" && type != "Replace") || data.model != "llama") {
      return Bad(absl::StrCat("unsupported normalizer '", type, "' for a ",
                              data.model == "gpt2" ? "byte-level" : "SentencePiece",
                              " BPE (TinyServe applies NFC to byte-level ones, Prepend and "
                              "Replace to SentencePiece ones)"));
    }
  }

  if (!config_json.empty()) {
    json config = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
    }
    auto find = [&](const char* key) -> int32_t {
      const std::string text = ConfigToken(config, key);
      if (text.empty()) return -1;
      for (size_t i = 0; i < data.tokens.size(); ++i) {
        if (data.tokens[i] == text) return static_cast<int32_t>(i);
      }
      return -1;
    };
    data.bos_id = find("bos_token");
    data.eos_id = find("eos_token");
    if (int32_t unk = find("unk_token"); unk >= 0) data.unk_id = unk;
    data.pad_id = find("pad_token");
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
      data.add_bos = config["add_bos_token"].get<bool>();
    }
    if (config.contains("chat_template") && config["chat_template"].is_string()) {
      data.chat_template = config["chat_template"].get<std::string>();
    }
  }
  if (data.add_bos && data.bos_id < 0) data.add_bos = false;
  if (data.eos_id >= 0) data.eog_ids.push_back(data.eos_id);
  return data;
}

absl::StatusOr<TokenizerData> TokenizerDataFromHfJson(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::string config;
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    TS_ASSIGN_OR_RETURN(config, ReadFile(config_path.string()));
  }
  absl::StatusOr<TokenizerData> data = TokenizerDataFromHfJsonText(text, config);
  if (!data.ok()) {
    return absl::Status(data.status().code(), absl::StrCat(path, ": ", data.status().message()));
  }
  return data;
}

}  // namespace tinyserve
