#include "worker/hf/hf_config.h"

#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace tinyserve {
namespace {

using nlohmann::json;

// Typed field access with errors that name the file and the field. A JSON null counts as
// absent (transformers writes null for unset optional fields).
class Fields {
 public:
  Fields(const json& doc, const std::string& label) : doc_(doc), label_(label) {}

  bool Present(const char* key) const {
    auto it = doc_.find(key);
    return it != doc_.end() && !it->is_null();
  }
  const json* Raw(const char* key) const {
    auto it = doc_.find(key);
    return it == doc_.end() || it->is_null() ? nullptr : &*it;
  }

  absl::StatusOr<int> Int(const char* key, std::optional<int> def = std::nullopt) const {
    const json* v = Raw(key);
    if (v == nullptr) {
      if (def) return *def;
      return Missing(key);
    }
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > (1 << 30)) {
      return Bad(key, *v, "a positive integer");
    }
    return static_cast<int>(v->get<int64_t>());
  }

  absl::StatusOr<double> Float(const char* key, std::optional<double> def = std::nullopt) const {
    const json* v = Raw(key);
    if (v == nullptr) {
      if (def) return *def;
      return Missing(key);
    }
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() <= 0) {
      return Bad(key, *v, "a positive number");
    }
    return v->get<double>();
  }

  absl::StatusOr<bool> Bool(const char* key, bool def) const {
    const json* v = Raw(key);
    if (v == nullptr) return def;
    if (!v->is_boolean()) return Bad(key, *v, "a boolean");
    return v->get<bool>();
  }

  absl::StatusOr<std::string> String(const char* key, std::optional<std::string> def) const {
    const json* v = Raw(key);
    if (v == nullptr) {
      if (def) return *def;
      return Missing(key);
    }
    if (!v->is_string()) return Bad(key, *v, "a string");
    return v->get<std::string>();
  }

  absl::Status Missing(const char* key) const {
    return absl::InvalidArgumentError(
        absl::StrCat("config '", label_, "': field '", key, "' is missing"));
  }
  absl::Status Bad(const char* key, const json& v, const char* want) const {
    return absl::InvalidArgumentError(
        absl::StrCat("config '", label_, "': field '", key, "' = ", v.dump(), " is not ", want));
  }
  absl::Status Unsupported(const char* key, const json& v) const {
    return absl::UnimplementedError(
        absl::StrCat("config '", label_, "': field '", key, "' = ", v.dump(), " is not supported"));
  }

 private:
  const json& doc_;
  const std::string& label_;
};

// rope_scaling (or transformers 5's rope_parameters): "default", "linear" (positions divided by
// factor), "llama3" (per-frequency divisors: 1 above high_freq_factor / the original context,
// factor below low_freq_factor / it, interpolated between; transformers'
// _compute_llama3_parameters) or "yarn" (YarnFreqDivisors and the attention factor, as
// transformers' _compute_yarn_parameters). c->rope_theta, head_dim and max_context must be set.
absl::Status ParseRopeScaling(const Fields& f, const char* key, const json& s, ModelConfig* c) {
  if (!s.is_object()) return f.Bad(key, s, "an object");
  const auto type_it = s.contains("rope_type") ? s.find("rope_type") : s.find("type");
  const std::string type =
      type_it != s.end() && type_it->is_string() ? type_it->get<std::string>() : "default";
  if (type == "default") return absl::OkStatus();
  auto number = [&](const char* name, std::optional<double> def) -> absl::StatusOr<double> {
    auto it = s.find(name);
    if (it == s.end() || it->is_null()) {
      if (def) return *def;
      return f.Bad(key, s, absl::StrCat("an object with ", name).c_str());
    }
    if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0)
      return f.Bad(key, s, absl::StrCat("an object with a positive ", name).c_str());
    return it->get<double>();
  };
  TS_ASSIGN_OR_RETURN(const double factor, number("factor", std::nullopt));
  if (type == "linear") {
    c->rope_freq_scale = static_cast<float>(1.0 / factor);
    return absl::OkStatus();
  }
  if (type == "yarn") {
    TS_ASSIGN_OR_RETURN(const double old_ctx,
                        number("original_max_position_embeddings", c->max_context));
    TS_ASSIGN_OR_RETURN(const double beta_fast, number("beta_fast", 32.0));
    TS_ASSIGN_OR_RETURN(const double beta_slow, number("beta_slow", 1.0));
    const auto truncate = s.find("truncate");
    if (truncate != s.end() && !truncate->is_boolean())
      return f.Bad(key, s, "an object whose truncate is a boolean");
    c->rope_freq_factors =
        YarnFreqDivisors(c->head_dim, c->rope_theta, factor, old_ctx, beta_fast, beta_slow,
                         truncate == s.end() || truncate->get<bool>());
    // attention_factor, else from mscale / mscale_all_dim (DeepSeek's), else 0.1 ln(factor) + 1.
    double attn = YarnMscale(factor);
    if (s.contains("attention_factor") && !s["attention_factor"].is_null()) {
      TS_ASSIGN_OR_RETURN(attn, number("attention_factor", std::nullopt));
    } else if (s.contains("mscale") && s.contains("mscale_all_dim")) {
      TS_ASSIGN_OR_RETURN(const double m, number("mscale", std::nullopt));
      TS_ASSIGN_OR_RETURN(const double m_all, number("mscale_all_dim", std::nullopt));
      attn = YarnMscale(factor, m) / YarnMscale(factor, m_all);
    }
    c->rope_attn_factor = static_cast<float>(attn);
    // The context it extends to (vLLM's rule): the original times the factor.
    c->max_context = std::max(c->max_context, YarnContext(old_ctx, factor));
    return absl::OkStatus();
  }
  if (type != "llama3") return f.Unsupported(key, s);
  TS_ASSIGN_OR_RETURN(const double low, number("low_freq_factor", 1.0));
  TS_ASSIGN_OR_RETURN(const double high, number("high_freq_factor", 4.0));
  TS_ASSIGN_OR_RETURN(const double old_ctx, number("original_max_position_embeddings", 8192.0));
  if (!(high > low)) return f.Bad(key, s, "an object with high_freq_factor > low_freq_factor");
  const double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  c->rope_freq_factors.resize(c->head_dim / 2);
  for (int i = 0; i < c->head_dim / 2; ++i) {
    const double freq = std::pow(static_cast<double>(c->rope_theta), -2.0 * i / c->head_dim);
    const double wavelen = 2 * M_PI / freq;
    double divisor = 1.0;
    if (wavelen > low_wavelen) {
      divisor = factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (old_ctx / wavelen - low) / (high - low);
      divisor = 1.0 / ((1 - smooth) / factor + smooth);
    }
    c->rope_freq_factors[i] = static_cast<float>(divisor);
  }
  return absl::OkStatus();
}

absl::Status ParseLlama(const Fields& f, ModelConfig* c) {
  c->arch = Arch::kLlama;
  TS_ASSIGN_OR_RETURN(c->dim, f.Int("hidden_size"));
  TS_ASSIGN_OR_RETURN(c->n_layers, f.Int("num_hidden_layers"));
  TS_ASSIGN_OR_RETURN(c->n_heads, f.Int("num_attention_heads"));
  TS_ASSIGN_OR_RETURN(c->n_kv_heads, f.Int("num_key_value_heads", c->n_heads));
  if (c->n_heads % c->n_kv_heads != 0) {
    return f.Bad("num_key_value_heads", c->n_kv_heads, "a divisor of num_attention_heads");
  }
  if (!f.Present("head_dim") && c->dim % c->n_heads != 0) {
    return f.Bad("num_attention_heads", c->n_heads, "a divisor of hidden_size");
  }
  TS_ASSIGN_OR_RETURN(c->head_dim, f.Int("head_dim", c->dim / c->n_heads));
  if (c->head_dim % 2 != 0) return f.Bad("head_dim", c->head_dim, "even (RoPE rotates pairs)");
  TS_ASSIGN_OR_RETURN(c->ffn_dim, f.Int("intermediate_size"));
  TS_ASSIGN_OR_RETURN(c->vocab_size, f.Int("vocab_size"));
  TS_ASSIGN_OR_RETURN(c->max_context, f.Int("max_position_embeddings"));
  TS_ASSIGN_OR_RETURN(double eps, f.Float("rms_norm_eps"));
  c->norm_eps = static_cast<float>(eps);
  TS_ASSIGN_OR_RETURN(c->tied_embeddings, f.Bool("tie_word_embeddings", false));
  c->rope_style = RopeStyle::kRotateHalf;

  TS_ASSIGN_OR_RETURN(std::string act, f.String("hidden_act", "silu"));
  if (act != "silu") return f.Unsupported("hidden_act", act);
  // attention_bias: Q/K/V/O biases, read when the checkpoint has them (Qwen2 has Q/K/V ones
  // without the field).
  TS_ASSIGN_OR_RETURN(bool mlp_bias, f.Bool("mlp_bias", false));
  if (mlp_bias) return f.Unsupported("mlp_bias", true);
  TS_ASSIGN_OR_RETURN(bool sliding, f.Bool("use_sliding_window", false));
  if (sliding) return f.Unsupported("use_sliding_window", true);

  TS_ASSIGN_OR_RETURN(double theta, f.Float("rope_theta", 10000.0));
  // transformers 5 writes {"rope_type": "default", "rope_theta": ...} instead, and moves
  // rope_scaling's fields there too.
  const char* scaling_key = "rope_scaling";
  const json* scaling = f.Raw("rope_scaling");
  if (const json* params = f.Raw("rope_parameters")) {
    if (!params->is_object()) return f.Bad("rope_parameters", *params, "an object");
    auto t = params->find("rope_theta");
    if (t != params->end()) {
      if (!t->is_number() || t->get<double>() <= 0) {
        return f.Bad("rope_parameters", *params, "an object with a positive rope_theta");
      }
      theta = t->get<double>();
    }
    if (scaling == nullptr) {
      scaling_key = "rope_parameters";
      scaling = params;
    }
  }
  c->rope_theta = static_cast<float>(theta);
  if (scaling != nullptr) TS_RETURN_IF_ERROR(ParseRopeScaling(f, scaling_key, *scaling, c));
  return absl::OkStatus();
}

// Gemma 3 text models (model_type gemma3_text): a Llama body (ParseLlama reads the shapes) with
// Gemma's extras; config fields as transformers 4.5x writes them (rope_theta,
// rope_local_base_freq, rope_scaling for the global layers) or 5.x (rope_parameters with
// full_attention / sliding_attention entries).
absl::Status ParseGemma3(const Fields& f, ModelConfig* c) {
  TS_RETURN_IF_ERROR(ParseLlama(f, c));
  c->variant = "gemma3";
  c->qk_norm = c->post_norms = c->gelu_gate = true;
  c->embed_scale = std::sqrt(static_cast<float>(c->dim));
  TS_ASSIGN_OR_RETURN(c->tied_embeddings, f.Bool("tie_word_embeddings", true));
  TS_ASSIGN_OR_RETURN(std::string act, f.String("hidden_activation", "gelu_pytorch_tanh"));
  if (act != "gelu_pytorch_tanh") return f.Unsupported("hidden_activation", act);
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (const json* v = f.Raw(key)) return f.Unsupported(key, *v);
  TS_ASSIGN_OR_RETURN(bool bidirectional, f.Bool("use_bidirectional_attention", false));
  if (bidirectional) return f.Unsupported("use_bidirectional_attention", true);
  TS_ASSIGN_OR_RETURN(double scalar, f.Float("query_pre_attn_scalar", c->head_dim));
  c->attn_scale = static_cast<float>(1.0 / std::sqrt(scalar));

  TS_ASSIGN_OR_RETURN(c->sliding_window, f.Int("sliding_window"));
  c->swa_layers.assign(c->n_layers, false);
  if (const json* types = f.Raw("layer_types")) {
    if (!types->is_array() || types->size() != static_cast<size_t>(c->n_layers))
      return f.Bad("layer_types", *types, "a list with an entry per layer");
    for (int l = 0; l < c->n_layers; ++l) {
      const json& t = (*types)[l];
      if (t == "sliding_attention") {
        c->swa_layers[l] = true;
      } else if (t != "full_attention") {
        return f.Bad("layer_types", *types, "a list of sliding_attention / full_attention");
      }
    }
  } else {
    TS_ASSIGN_OR_RETURN(int legacy, f.Int("_sliding_window_pattern", 6));
    TS_ASSIGN_OR_RETURN(int pattern, f.Int("sliding_window_pattern", legacy));
    for (int l = 0; l < c->n_layers; ++l) c->swa_layers[l] = (l + 1) % pattern != 0;
  }

  // RoPE: the global layers' base and scaling, the sliding layers' base (unscaled).
  c->rope_freq_scale = 1.0f;
  c->rope_freq_factors.clear();
  const json* params = f.Raw("rope_parameters");
  if (params != nullptr && params->contains("full_attention")) {
    auto theta_of = [&](const char* kind) -> absl::StatusOr<float> {
      const json* p = &(*params)[kind];
      auto t = p->find("rope_theta");
      if (!p->is_object() || t == p->end() || !t->is_number() || !(t->get<double>() > 0))
        return f.Bad("rope_parameters", *params,
                     absl::StrCat("an object whose ", kind, " has a positive rope_theta").c_str());
      return static_cast<float>(t->get<double>());
    };
    TS_ASSIGN_OR_RETURN(c->rope_theta, theta_of("full_attention"));
    TS_RETURN_IF_ERROR(ParseRopeScaling(f, "rope_parameters", (*params)["full_attention"], c));
    if (params->contains("sliding_attention")) {
      TS_ASSIGN_OR_RETURN(c->rope_theta_swa, theta_of("sliding_attention"));
      const json& sliding = (*params)["sliding_attention"];
      if (sliding.value("rope_type", std::string("default")) != "default")
        return f.Unsupported("rope_parameters", *params);
    }
  } else {
    TS_ASSIGN_OR_RETURN(double theta, f.Float("rope_theta", 1000000.0));
    c->rope_theta = static_cast<float>(theta);
    if (const json* scaling = f.Raw("rope_scaling"))
      TS_RETURN_IF_ERROR(ParseRopeScaling(f, "rope_scaling", *scaling, c));
    TS_ASSIGN_OR_RETURN(double local, f.Float("rope_local_base_freq", 10000.0));
    c->rope_theta_swa = static_cast<float>(local);
  }
  return absl::OkStatus();
}

absl::Status ParseGpt2(const Fields& f, ModelConfig* c) {
  c->arch = Arch::kGpt2;
  TS_ASSIGN_OR_RETURN(c->dim, f.Int("n_embd"));
  TS_ASSIGN_OR_RETURN(c->n_layers, f.Int("n_layer"));
  TS_ASSIGN_OR_RETURN(c->n_heads, f.Int("n_head"));
  if (c->dim % c->n_heads != 0) return f.Bad("n_head", c->n_heads, "a divisor of n_embd");
  c->n_kv_heads = c->n_heads;
  c->head_dim = c->dim / c->n_heads;
  TS_ASSIGN_OR_RETURN(c->ffn_dim, f.Int("n_inner", 4 * c->dim));
  TS_ASSIGN_OR_RETURN(c->vocab_size, f.Int("vocab_size"));
  TS_ASSIGN_OR_RETURN(int n_ctx, f.Int("n_ctx", 1024));
  TS_ASSIGN_OR_RETURN(c->max_context, f.Int("n_positions", n_ctx));
  TS_ASSIGN_OR_RETURN(double eps, f.Float("layer_norm_epsilon", 1e-5));
  c->norm_eps = static_cast<float>(eps);
  TS_ASSIGN_OR_RETURN(c->tied_embeddings, f.Bool("tie_word_embeddings", true));
  c->rope_style = RopeStyle::kNone;
  c->rope_theta = 0.0f;

  TS_ASSIGN_OR_RETURN(std::string act, f.String("activation_function", "gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return f.Unsupported("activation_function", act);
  }
  TS_ASSIGN_OR_RETURN(bool scale, f.Bool("scale_attn_weights", true));
  if (!scale) return f.Unsupported("scale_attn_weights", false);
  TS_ASSIGN_OR_RETURN(bool by_layer, f.Bool("scale_attn_by_inverse_layer_idx", false));
  if (by_layer) return f.Unsupported("scale_attn_by_inverse_layer_idx", true);
  // Upcasting only changes the precision of a float16 run; the maths is the same.
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, const std::string& label) {
  const json doc = json::parse(json_text.begin(), json_text.end(), nullptr,
                               /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("config '", label, "': not a JSON object"));
  }
  Fields f(doc, label);
  TS_ASSIGN_OR_RETURN(std::string type, f.String("model_type", std::nullopt));
  ModelConfig c;
  if (type == "llama" || type == "qwen2" || type == "qwen3") {
    TS_RETURN_IF_ERROR(ParseLlama(f, &c));
    if (type != "llama") c.variant = type;
    c.qk_norm = type == "qwen3";
  } else if (type == "gemma3_text") {
    TS_RETURN_IF_ERROR(ParseGemma3(f, &c));
  } else if (type == "gpt2") {
    TS_RETURN_IF_ERROR(ParseGpt2(f, &c));
  } else {
    return absl::UnimplementedError(
        absl::StrCat("config '", label, "': model_type '", type,
                     "' is not supported (llama, qwen2, qwen3, gemma3_text, gpt2)"));
  }
  return c;
}

absl::Status ApplyRopeScaling(std::string_view json_text, const std::string& label,
                              ModelConfig* c) {
  json doc;
  doc["rope_scaling"] = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  const Fields f(doc, label);
  if (doc["rope_scaling"].is_discarded())
    return absl::InvalidArgumentError(
        absl::StrCat("config '", label, "': not a JSON object: ", std::string(json_text)));
  c->rope_freq_scale = 1.0f;
  c->rope_freq_factors.clear();
  c->rope_attn_factor = 1.0f;
  return ParseRopeScaling(f, "rope_scaling", doc["rope_scaling"], c);
}

absl::StatusOr<ModelConfig> ReadHfConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("config: cannot open '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ParseHfConfig(ss.str(), path);
}

}  // namespace tinyserve
