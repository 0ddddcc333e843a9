#include "worker/model/lora_adapter.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fnv.h"
#include "common/status.h"
#include "worker/gguf/gguf_file.h"

namespace tinyserve {
namespace {

struct Shape {
  int64_t in = 0, out = 0;
};

// The [in, out] of an adaptable base weight "blk.N.<what>.weight", or nullopt.
std::optional<Shape> AdaptableShape(const std::string& name, const ModelConfig& c) {
  constexpr std::string_view kPrefix = "blk.", kSuffix = ".weight";
  if (name.size() <= kPrefix.size() + kSuffix.size() || name.compare(0, 4, kPrefix) != 0 ||
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return std::nullopt;
  const size_t dot = name.find('.', kPrefix.size());
  if (dot == std::string::npos) return std::nullopt;
  const std::string layer = name.substr(kPrefix.size(), dot - kPrefix.size());
  if (layer.empty() || layer.size() > 6 ||
      layer.find_first_not_of("0123456789") != std::string::npos ||
      (layer.size() > 1 && layer[0] == '0') || std::stoi(layer) >= c.n_layers)
    return std::nullopt;
  const std::string what = name.substr(dot + 1, name.size() - kSuffix.size() - dot - 1);
  const int64_t D = c.dim, qd = int64_t{c.n_heads} * c.head_dim,
                kd = int64_t{c.n_kv_heads} * c.head_dim, F = c.ffn_dim;
  const bool gpt2 = c.arch == Arch::kGpt2;
  if (what == "attn_output") return Shape{qd, D};
  if (what == "ffn_up") return Shape{D, F};
  if (what == "ffn_down") return Shape{F, D};
  if (gpt2) {
    if (what == "attn_qkv") return Shape{D, qd + 2 * kd};
    return std::nullopt;
  }
  if (what == "attn_q") return Shape{D, qd};
  if (what == "attn_k" || what == "attn_v") return Shape{D, kd};
  if (what == "ffn_gate") return Shape{D, F};
  return std::nullopt;
}

TensorRef Ref(const GgufTensorInfo& t) {
  TensorRef r;
  r.name = t.name;
  r.type = t.type;
  r.ne = t.ne;
  r.data = t.data;
  r.nbytes = t.nbytes;
  return r;
}

}  // namespace

absl::Status LoraError(const std::string& name, const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("LoRA adapter '", name, "' (", path, "): ", what));
}

absl::StatusOr<std::unique_ptr<LoraAdapter>> LoraAdapter::Make(
    const std::string& name, const std::string& path, const ModelConfig& base, float alpha,
    std::map<std::string, LoraPair> pairs, std::shared_ptr<const void> storage) {
  auto fail = [&](const std::string& what) { return LoraError(name, path, what); };
  if (pairs.empty()) return fail("it holds no tensors");
  std::unique_ptr<LoraAdapter> a(new LoraAdapter());
  a->name_ = name;
  a->path_ = path;
  a->alpha_ = alpha;
  a->storage_ = std::move(storage);
  for (auto& [weight, p] : pairs) {
    const std::optional<Shape> shape = AdaptableShape(weight, base);
    if (!shape)
      return fail(absl::StrCat("tensor '", p.a.name, "': '", weight,
                               "' is not a weight TinyServe adapts (blk.N attention and MLP "
                               "projections of this ",
                               ArchName(base.arch), " model)"));
    const std::vector<int64_t>& na = p.a.ne;
    const std::vector<int64_t>& nb = p.b.ne;
    if (na.size() != 2 || nb.size() != 2 || na[0] != shape->in || nb[1] != shape->out ||
        na[1] != nb[0] || na[1] < 1 || na[1] > 4096)
      return fail(absl::StrCat("tensor '", weight, "': lora_a ", ShapeString(na), " and lora_b ",
                               ShapeString(nb), " do not fit the base weight (lora_a must be [",
                               shape->in, ", r] and lora_b [r, ", shape->out,
                               "], 1 <= r <= 4096)"));
    if (!std::isfinite(p.scale)) return fail(absl::StrCat("tensor '", weight, "': bad scale"));
    a->max_rank_ = std::max(a->max_rank_, p.rank());
  }
  a->pairs_ = std::move(pairs);
  return a;
}

absl::StatusOr<std::unique_ptr<LoraAdapter>> LoraAdapter::Open(const std::string& name,
                                                               const std::string& path,
                                                               const ModelConfig& base) {
  auto fail = [&](const std::string& what) { return LoraError(name, path, what); };
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return absl::NotFoundError(absl::StrCat("LoRA adapter '", name, "': no such file ", path));
  if (S_ISDIR(st.st_mode)) {
#ifdef TINYSERVE_HAVE_HF
    return OpenPeftLoraAdapter(name, path, base);
#else
    return fail(
        "a folder (PEFT adapter), and this build cannot read them (worker/hf is not built)");
#endif
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return fail(std::string(file.status().message()));
  return FromGguf(name, path, std::move(*file), base);
}

absl::StatusOr<std::unique_ptr<LoraAdapter>> LoraAdapter::FromGguf(
    const std::string& name, const std::string& path, std::shared_ptr<const GgufFile> owned,
    const ModelConfig& base) {
  auto fail = [&](const std::string& what) { return LoraError(name, path, what); };
  const GgufFile& f = *owned;
  auto string_kv = [&](std::string_view key) -> absl::StatusOr<std::string> {
    absl::StatusOr<std::string> v = f.GetString(key);
    if (!v.ok()) return fail(std::string(v.status().message()));
    return v;
  };
  if (f.Find("general.type") == nullptr)
    return fail("not a LoRA adapter: it has no general.type (is this a model file?)");
  TS_ASSIGN_OR_RETURN(const std::string type, string_kv("general.type"));
  if (type != "adapter")
    return fail(absl::StrCat("not a LoRA adapter: general.type is '", type, "', not 'adapter'"));
  TS_ASSIGN_OR_RETURN(const std::string kind, string_kv("adapter.type"));
  if (kind != "lora") return fail(absl::StrCat("adapter.type is '", kind, "', not 'lora'"));
  TS_ASSIGN_OR_RETURN(const std::string arch, string_kv("general.architecture"));
  if (arch != ArchName(base))
    return fail(absl::StrCat("general.architecture is '", arch, "' but the model is '",
                             ArchName(base), "'"));
  if (arch == "llama" && base.rope_style != RopeStyle::kAdjacent)
    return fail(
        "a GGUF adapter needs a GGUF base model (its Q/K rows are permuted for llama.cpp's RoPE; "
        "this model was loaded from a Hugging Face folder: give the adapter as a PEFT folder)");
  float alpha = 0;
  if (f.Find("adapter.lora.alpha") != nullptr) {
    absl::StatusOr<double> v = f.GetFloat("adapter.lora.alpha");
    if (!v.ok()) return fail(std::string(v.status().message()));
    if (!std::isfinite(*v) || *v < 0)
      return fail(absl::StrCat("adapter.lora.alpha = ", *v, " must be finite and >= 0"));
    alpha = static_cast<float>(*v);
  }

  // Pair up <base>.lora_a / <base>.lora_b.
  std::map<std::string, std::pair<const GgufTensorInfo*, const GgufTensorInfo*>> halves;
  for (const GgufTensorInfo& t : f.tensors()) {
    constexpr std::string_view kA = ".lora_a", kB = ".lora_b";
    const bool is_a = t.name.size() > kA.size() && t.name.ends_with(kA);
    const bool is_b = t.name.size() > kB.size() && t.name.ends_with(kB);
    if (!is_a && !is_b)
      return fail(absl::StrCat("tensor '", t.name, "' is not a .lora_a or .lora_b tensor"));
    auto& h = halves[t.name.substr(0, t.name.size() - kA.size())];
    (is_a ? h.first : h.second) = &t;
  }
  std::map<std::string, LoraPair> pairs;
  for (const auto& [weight, h] : halves) {
    if (h.first == nullptr || h.second == nullptr)
      return fail(absl::StrCat("tensor '", weight, h.first ? ".lora_a" : ".lora_b", "' has no ",
                               h.first ? ".lora_b" : ".lora_a", " partner"));
    LoraPair p{Ref(*h.first), Ref(*h.second)};
    // llama.cpp: scale = alpha / r, or 1 when alpha is 0 (the rank is lora_b's ne[0]).
    const int64_t r = h.second->ne.empty() ? 1 : std::max<int64_t>(1, h.second->ne[0]);
    p.scale = alpha != 0 ? alpha / static_cast<float>(r) : 1.0f;
    pairs.emplace(weight, std::move(p));
  }
  return Make(name, path, base, alpha, std::move(pairs), std::move(owned));
}

const LoraPair* LoraAdapter::Find(const std::string& name) const {
  auto it = pairs_.find(name);
  return it == pairs_.end() ? nullptr : &it->second;
}

uint64_t LoraDigest(const std::vector<LoraInfo>& loras) {
  Fnv1a digest;
  for (const LoraInfo& l : loras) {
    digest.Add(l.name);
    digest.Add(absl::StrCat(l.max_rank, ":", l.tensors));
  }
  return digest.value();
}

int LoraId(const std::vector<LoraInfo>& loras, const std::string& name) {
  if (name.empty()) return 0;  // (an unloaded adapter's slot)
  for (size_t i = 0; i < loras.size(); ++i)
    if (loras[i].name == name) return static_cast<int>(i) + 1;
  return 0;
}

absl::Status ParseLoraFlag(const std::string& flag, std::string* name, std::string* path) {
  const size_t eq = flag.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == flag.size())
    return absl::InvalidArgumentError(absl::StrCat(
        "--lora: expected NAME=PATH (a name and a GGUF adapter file or PEFT folder), got '", flag,
        "'"));
  *name = flag.substr(0, eq);
  *path = flag.substr(eq + 1);
  if (absl::Status s = CheckLoraName(*name); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("--lora: ", s.message()));
  return absl::OkStatus();
}

absl::Status CheckLoraName(const std::string& name) {
  const bool ok_chars = name.find_first_not_of(
                            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                            "0123456789._:/-") == std::string::npos;
  if (name.empty() || !ok_chars || name.size() > 64 || name[0] == '.' || name[0] == '-')
    return absl::InvalidArgumentError(absl::StrCat(
        "adapter name '", name.substr(0, 80),
        "' must be 1-64 characters of letters, digits and . _ : / - (not starting with . or -)"));
  return absl::OkStatus();
}

}  // namespace tinyserve
