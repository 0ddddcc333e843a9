// PEFT LoRA adapter folders (declared in worker/model/lora_adapter.h): adapter_config.json and
// adapter_model.safetensors, as PEFT's save_pretrained writes them and vLLM loads them.
//
// Tensor names: base_model.model.<module>.lora_A.weight ([r, in]) and .lora_B.weight ([out, r]),
// where <module>.weight is a Hugging Face weight name (worker/hf/hf_names.h maps it to the GGUF
// name). Row-major [r, in] is ggml's ne [in, r], so the bytes are used as they are, except on a
// GGUF base model, whose Q and K rows llama.cpp's converter permuted for adjacent-pair RoPE: the
// Q and K updates' B rows are permuted the same way (convert_hf_to_gguf.py's permute: per head,
// rows [2, hd/2] -> [hd/2, 2]; K with the KV head count).
#include <cmath>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/paths.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/hf/hf_names.h"
#include "worker/hf/safetensors.h"
#include "worker/model/lora_adapter.h"

namespace tinyserve {
namespace {

using json = nlohmann::json;

// The safetensors file and any permuted copies, kept alive by the adapter.
struct PeftStorage {
  std::unique_ptr<SafetensorsFile> file;
  std::deque<std::vector<uint8_t>> copies;
};

bool IsEmptyConfigValue(const json& v) {
  return v.is_null() || ((v.is_object() || v.is_array()) && v.empty());
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoraAdapter>> OpenPeftLoraAdapter(const std::string& name,
                                                                 const std::string& dir,
                                                                 const ModelConfig& base) {
  auto fail = [&](const std::string& what) { return LoraError(name, dir, what); };
  absl::StatusOr<std::string> text = ReadRegularFile(dir + "/adapter_config.json", 1 << 20);
  if (absl::IsNotFound(text.status()))
    return fail("a folder without adapter_config.json (not a PEFT adapter)");
  if (!text.ok()) return fail(absl::StrCat("adapter_config.json: ", text.status().message()));
  const json config = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return fail("adapter_config.json is not a JSON object");
  auto get = [&](const char* key) { return config.contains(key) ? config[key] : json(); };
  if (const json t = get("peft_type"); !t.is_null() && t != "LORA")
    return fail(absl::StrCat("adapter_config.json: peft_type is ", t.dump(), ", not \"LORA\""));
  if (base.arch != Arch::kLlama)
    return fail("PEFT adapters are read for Llama-family models only (this one is gpt2)");
  const json r = get("r"), alpha = get("lora_alpha");
  if (!r.is_number_integer() || r.get<int64_t>() < 1)
    return fail("adapter_config.json: r must be a positive integer");
  if (!alpha.is_number() || !std::isfinite(alpha.get<double>()) || alpha.get<double>() < 0)
    return fail("adapter_config.json: lora_alpha must be a number >= 0");
  if (get("use_dora") == true) return fail("adapter_config.json: use_dora (DoRA) is not supported");
  if (const json b = get("bias"); !b.is_null() && b != "none")
    return fail(
        absl::StrCat("adapter_config.json: bias ", b.dump(), " is not supported (\"none\")"));
  if (!IsEmptyConfigValue(get("modules_to_save")))
    return fail("adapter_config.json: modules_to_save (fully trained layers) is not supported");
  for (const char* key : {"alpha_pattern", "rank_pattern"})
    if (!IsEmptyConfigValue(get(key)))
      return fail(absl::StrCat("adapter_config.json: ", key, " is not supported"));
  const bool rslora = get("use_rslora") == true;
  const float lora_alpha = alpha.get<float>();

  const std::string weights = dir + "/adapter_model.safetensors";
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(weights);
  if (!file.ok()) {
    if (absl::IsNotFound(file.status()))
      return fail(FileExists(dir + "/adapter_model.bin")
                      ? "adapter_model.bin (a pickle) is not read: save the adapter with "
                        "safe_serialization=True (adapter_model.safetensors)"
                      : "no adapter_model.safetensors");
    return fail(std::string(file.status().message()));
  }
  auto storage = std::make_shared<PeftStorage>();
  storage->file = std::move(*file);

  constexpr std::string_view kPrefix = "base_model.model.", kA = ".lora_A.weight",
                             kB = ".lora_B.weight";
  std::map<std::string, LoraPair> pairs;
  for (const auto& [tname, t] : storage->file->tensors()) {
    const std::string_view n = tname;
    const bool is_a = n.ends_with(kA);
    if (!n.starts_with(kPrefix) || !(is_a || n.ends_with(kB)) ||
        n.size() <= kPrefix.size() + kA.size())
      return fail(absl::StrCat(
          "tensor '", tname, "' is not a LoRA factor (base_model.model.<module>.lora_A/B.weight)"));
    const std::string module(n.substr(kPrefix.size(), n.size() - kPrefix.size() - kA.size()));
    const HfNameMapping map =
        MapHfTensorName(base.arch, base.tied_embeddings, module + ".weight", base.post_norms);
    if (map.action != HfNameMapping::Action::kMap)
      return fail(
          absl::StrCat("tensor '", tname, "': '", module, "' is not a module of this model"));
    if (t.shape.size() != 2) return fail(absl::StrCat("tensor '", tname, "' is not 2-D"));
    TensorRef ref;
    ref.name = tname;
    ref.type = SafetensorsToGgml(t.dtype);
    ref.ne = {t.shape[1], t.shape[0]};
    ref.data = t.data;
    ref.nbytes = t.nbytes;
    LoraPair& p = pairs[map.gguf_name];
    (is_a ? p.a : p.b) = std::move(ref);
  }
  for (auto& [gguf, p] : pairs) {
    if (p.a.ne.empty() || p.b.ne.empty())
      return fail(
          absl::StrCat("'", gguf, "' has only its lora_", p.b.ne.empty() ? "A" : "B", " factor"));
    const int64_t rank = p.b.ne[0];
    p.scale = rank < 1 ? 1.0f
                       : lora_alpha / (rslora ? std::sqrt(static_cast<float>(rank))
                                              : static_cast<float>(rank));
    // GGUF base: permute the Q/K update's output rows as the converter permuted the weights.
    const bool q = gguf.ends_with(".attn_q.weight"), k = gguf.ends_with(".attn_k.weight");
    if (base.rope_style == RopeStyle::kAdjacent && (q || k)) {
      const int64_t heads = q ? base.n_heads : base.n_kv_heads, hd = base.head_dim;
      const int64_t rows = p.b.ne.size() == 2 ? p.b.ne[1] : 0;
      if (rows != heads * hd || hd % 2 != 0) continue;  // Make refuses the shape
      const size_t row_bytes = p.b.nbytes / static_cast<size_t>(rows);
      std::vector<uint8_t>& out = storage->copies.emplace_back(p.b.nbytes);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < hd / 2; ++i)
          for (int64_t c = 0; c < 2; ++c)
            std::memcpy(&out[static_cast<size_t>(h * hd + 2 * i + c) * row_bytes],
                        p.b.data + static_cast<size_t>(h * hd + c * (hd / 2) + i) * row_bytes,
                        row_bytes);
      p.b.data = out.data();
    }
  }
  return LoraAdapter::Make(name, dir, base, lora_alpha, std::move(pairs), storage);
}

}  // namespace tinyserve
