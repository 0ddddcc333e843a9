#include "worker/eval/evaluator.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "common/timer.h"
#include "worker/kv/paged_kv_cache.h"
#include "worker/sampling/sampler.h"
#include "worker/select/selector.h"
#include "worker/tokenizer/tokenizer.h"

namespace tinyserve {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void LogSoftmax(const float* x, int n, std::vector<double>* out) {
  out->resize(n);
  double mx = x[0];
  for (int i = 1; i < n; ++i) mx = std::max<double>(mx, x[i]);
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(x[i] - mx);
  const double lse = mx + std::log(s);
  for (int i = 0; i < n; ++i) (*out)[i] = x[i] - lse;
}

std::string Num(double v) { return v < 0 ? "null" : absl::StrFormat("%.6g", v); }

std::string SpecJson(const SelectionSpec& s) {
  std::string params;
  for (const auto& [k, v] : s.params) absl::StrAppend(&params, params.empty() ? "" : ",", "\"", k, "\":\"", v, "\"");
  return absl::StrFormat(
      "\"policy\":\"%s\",\"budget\":%d,\"dense_layers\":%d,\"sink_pages\":%d,\"recent_pages\":%d,"
      "\"params\":{%s}",
      s.policy, s.budget, s.dense_layers, s.sink_pages, s.recent_pages, params);
}

}  // namespace

std::string EvalResult::ToJson() const {
  return absl::StrFormat(
      "{\"context\":%d,\"eval_tokens\":%d,%s,\"page_size\":%d,\"kv_dtype\":\"%s\","
      "\"ppl\":%.6g,\"ppl_dense\":%.6g,"
      "\"delta_ppl_pct\":%.4f,\"top1_agreement\":%.4f,\"kl_mean\":%.6g,\"page_hit_rate\":%s,"
      "\"mass_recall\":%s,\"reuse\":%s,\"kv_bytes_ratio\":%.4f,\"pages_selected_per_step\":%.1f,"
      "\"pages_scored_per_step\":%.1f,\"step_ms\":%.3f,\"step_ms_dense\":%.3f,"
      "\"attention_ms\":%.3f,\"attention_ms_dense\":%.3f,\"select_cpu_ms\":%.3f}",
      context, eval_tokens, SpecJson(spec), page_size, kv_dtype, ppl, ppl_dense, delta_ppl_pct,
      top1_agreement, kl_mean, Num(page_hit_rate), Num(mass_recall), Num(reuse), kv_bytes_ratio,
      pages_selected_per_step, pages_scored_per_step, step_ms, step_ms_dense, attention_ms,
      attention_ms_dense, select_ms);
}

std::string PasskeyResult::ToJson() const {
  return absl::StrFormat(
      "{\"passkey\":true,\"length\":%d,\"depth\":%.3f,%s,\"samples\":%d,\"accuracy\":%.4f,"
      "\"accuracy_dense\":%.4f}",
      length, depth, SpecJson(spec), samples, samples ? static_cast<double>(correct) / samples : 0.0,
      samples ? static_cast<double>(correct_dense) / samples : 0.0);
}

struct Evaluator::State {
  std::unique_ptr<WeightSource> source;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<TransformerRunner> runner;
  std::unique_ptr<PagedKvCache> kv;
  int page_size = 16;
  KvDtype kv_dtype = KvDtype::kF16;

  // Prefills tokens [0, n) into pages 0.. of a fresh cache sized for n + extra tokens.
  absl::Status Prefill(const std::vector<int32_t>& tokens, int n, int extra) {
    const int64_t prefill_pages = (n + page_size - 1) / page_size;
    const int64_t decode_pages = (extra + page_size) / page_size + 1;
    const int64_t need = prefill_pages + decode_pages;
    if (!kv || kv->config().num_pages < need) {
      KvCacheConfig config = runner->MakeKvConfig(page_size, need);
      config.dtype = kv_dtype;
      kv = std::make_unique<PagedKvCache>(config);
    }
    base_pages.clear();
    for (int64_t p = 0; p < prefill_pages; ++p) {
      base_pages.push_back(static_cast<int32_t>(p));
      kv->ResetPage(static_cast<int32_t>(p));
    }
    scratch_first = static_cast<int32_t>(prefill_pages);
    prefill_len = n;
    std::vector<float> logits;
    for (int start = 0; start < n; start += 512) {
      SeqInput in;
      in.tokens = &tokens[start];
      in.n = std::min(512, n - start);
      in.start_pos = start;
      in.pages = &base_pages;
      TS_RETURN_IF_ERROR(runner->Forward({in}, kv.get(), &logits));
    }
    return absl::OkStatus();
  }

  // A page table for one decode run: the prefill's full pages shared, its partial last page
  // copied into scratch, and fresh scratch pages after it.
  std::vector<int32_t> DecodePages(int extra) {
    const int64_t full = prefill_len / page_size;
    std::vector<int32_t> pages(base_pages.begin(), base_pages.begin() + full);
    int32_t next = scratch_first;
    if (prefill_len % page_size != 0) {
      kv->ResetPage(next);
      kv->CopyPage(base_pages[full], next);
      pages.push_back(next++);
    }
    const int64_t total = (prefill_len + extra + page_size - 1) / page_size;
    while (static_cast<int64_t>(pages.size()) < total) {
      kv->ResetPage(next);
      pages.push_back(next++);
    }
    return pages;
  }

  PolicyContext Context(uint64_t seed) const {
    return MakePolicyContext(runner->config(), runner->local_kv_heads(), page_size, kv_dtype,
                             seed);
  }

  std::vector<int32_t> base_pages;
  int32_t scratch_first = 0;
  int prefill_len = 0;
};

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(const std::string& model_path,
                                                             int threads, int page_size,
                                                             KvDtype kv_dtype) {
  std::unique_ptr<Evaluator> e(new Evaluator());
  e->s_ = std::make_unique<State>();
  State& s = *e->s_;
  s.page_size = page_size;
  s.kv_dtype = kv_dtype;
  TS_ASSIGN_OR_RETURN(s.source, OpenWeightSource(model_path));
  TS_ASSIGN_OR_RETURN(s.tok, Tokenizer::Create(s.source->tokenizer_data()));
  s.pool = std::make_unique<ThreadPool>(threads);
  RunnerOptions ro;
  ro.pool = s.pool.get();
  TS_ASSIGN_OR_RETURN(s.runner, TransformerRunner::Create(*s.source, ro));
  return e;
}

Evaluator::~Evaluator() = default;

const ModelConfig& Evaluator::config() const { return s_->runner->config(); }

absl::StatusOr<std::vector<EvalResult>> Evaluator::Run(const std::string& text, int context,
                                                       int eval_tokens,
                                                       const std::vector<SelectionSpec>& specs) {
  State& s = *s_;
  const ModelConfig& c = s.runner->config();
  if (context < 1) return absl::InvalidArgumentError("context must be >= 1");
  if (eval_tokens < 1) return absl::InvalidArgumentError("eval-tokens must be >= 1");
  if (context + eval_tokens + 1 > c.max_context)
    return absl::InvalidArgumentError(absl::StrCat("context + eval-tokens + 1 = ",
                                                   context + eval_tokens + 1,
                                                   " exceeds the model's context of ", c.max_context));
  for (const auto& spec : specs) TS_RETURN_IF_ERROR(ValidateSelectionSpec(spec, s.page_size));
  const std::vector<int32_t> tokens = s.tok->Encode(text, false, s.tok->data().add_bos);
  if (static_cast<int>(tokens.size()) < context + eval_tokens + 1)
    return absl::InvalidArgumentError(absl::StrCat("text: ", tokens.size(),
                                                   " tokens, fewer than context + eval-tokens + 1 = ",
                                                   context + eval_tokens + 1));
  TS_RETURN_IF_ERROR(s.Prefill(tokens, context, eval_tokens));
  const int vocab = c.vocab_size;

  // One teacher-forced decode run; returns per-step logits, times and the policy (or null).
  struct Run {
    std::vector<float> logits;  // [eval_tokens][vocab]
    std::vector<double> step_ms, attn_ms;
    std::unique_ptr<Policy> policy;
  };
  auto run = [&](const SelectionSpec* spec) -> absl::StatusOr<Run> {
    Run r;
    std::vector<int32_t> pages = s.DecodePages(eval_tokens);
    if (spec != nullptr) {
      TS_ASSIGN_OR_RETURN(r.policy, CreatePolicy(*spec, s.Context(7)));
    }
    r.logits.resize(static_cast<size_t>(eval_tokens) * vocab);
    std::vector<float> out;
    for (int i = 0; i < eval_tokens; ++i) {
      SeqInput in;
      in.tokens = &tokens[context + i];
      in.n = 1;
      in.start_pos = context + i;
      in.pages = &pages;
      if (r.policy) {
        r.policy->BeginStep(context + i + 1);
        in.selector = r.policy.get();
      }
      Stopwatch sw;
      TS_RETURN_IF_ERROR(s.runner->Forward({in}, s.kv.get(), &out));
      const double ms = sw.Millis();
      bool oracle_step = false;
      if (r.policy) {
        r.policy->EndStep();
        oracle_step = r.policy->last_step().oracle_samples > 0;
      }
      if (!oracle_step) {
        r.step_ms.push_back(ms);
        r.attn_ms.push_back(1e3 * s.runner->last_timings().attention);
      }
      std::copy(out.begin(), out.end(), r.logits.begin() + static_cast<size_t>(i) * vocab);
    }
    return r;
  };

  TS_ASSIGN_OR_RETURN(Run dense, run(nullptr));
  std::vector<EvalResult> results;
  std::vector<double> lp_d, lp_p;
  for (const auto& spec : specs) {
    TS_ASSIGN_OR_RETURN(Run pol, run(&spec));
    EvalResult e;
    e.spec = spec;
    e.context = context;
    e.eval_tokens = eval_tokens;
    e.page_size = s.page_size;
    e.kv_dtype = KvDtypeName(s.kv_dtype);
    double nll = 0, nll_d = 0, kl = 0;
    int agree = 0;
    for (int i = 0; i < eval_tokens; ++i) {
      const float* ld = &dense.logits[static_cast<size_t>(i) * vocab];
      const float* lq = &pol.logits[static_cast<size_t>(i) * vocab];
      LogSoftmax(ld, vocab, &lp_d);
      LogSoftmax(lq, vocab, &lp_p);
      const int32_t target = tokens[context + i + 1];
      nll -= lp_p[target];
      nll_d -= lp_d[target];
      double k = 0;
      for (int v = 0; v < vocab; ++v) k += std::exp(lp_d[v]) * (lp_d[v] - lp_p[v]);
      kl += std::max(0.0, k);
      agree += Argmax(ld, vocab) == Argmax(lq, vocab);
    }
    e.ppl = std::exp(nll / eval_tokens);
    e.ppl_dense = std::exp(nll_d / eval_tokens);
    e.delta_ppl_pct = 100.0 * (e.ppl / e.ppl_dense - 1.0);
    e.top1_agreement = static_cast<double>(agree) / eval_tokens;
    e.kl_mean = kl / eval_tokens;
    const SelectionStats& st = pol.policy->stats();
    e.page_hit_rate = st.PageHitRate();
    e.mass_recall = st.MassRecall();
    e.reuse = st.Reuse();
    e.kv_bytes_ratio = st.total.kv_bytes_dense
                           ? static_cast<double>(st.total.kv_bytes_read) / st.total.kv_bytes_dense
                           : 1.0;
    e.pages_selected_per_step = st.steps ? static_cast<double>(st.total.pages_selected) / st.steps : 0;
    e.pages_scored_per_step = st.steps ? static_cast<double>(st.total.pages_scored) / st.steps : 0;
    e.step_ms = Median(pol.step_ms);
    e.step_ms_dense = Median(dense.step_ms);
    e.attention_ms = Median(pol.attn_ms);
    e.attention_ms_dense = Median(dense.attn_ms);
    e.select_ms = st.steps ? 1e3 * st.total.select_seconds / st.steps : 0;
    results.push_back(e);
  }
  return results;
}

absl::StatusOr<std::vector<PasskeyResult>> Evaluator::Passkey(
    int length, double depth, int samples, const std::vector<SelectionSpec>& specs, uint64_t seed) {
  State& s = *s_;
  const ModelConfig& c = s.runner->config();
  if (depth < 0 || depth > 1) return absl::InvalidArgumentError("depth must be in [0, 1]");
  if (length < 64 || length + 16 > c.max_context)
    return absl::InvalidArgumentError(
        absl::StrCat("passkey length must be in [64, ", c.max_context - 16, "]"));
  for (const auto& spec : specs) TS_RETURN_IF_ERROR(ValidateSelectionSpec(spec, s.page_size));
  const std::string filler =
      "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
      "again. ";
  const std::string head =
      "There is an important info hidden inside a lot of irrelevant text. Find it and "
      "memorize it. I will quiz you about the important information there. ";
  const std::string question = "What is the pass key? The pass key is";
  const int filler_tokens = static_cast<int>(s.tok->Encode(filler, false, false).size());
  std::vector<PasskeyResult> results(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    results[i].spec = specs[i];
    results[i].depth = depth;
    results[i].samples = samples;
  }
  std::mt19937_64 rng(seed);
  constexpr int kGen = 8;
  for (int sample = 0; sample < samples; ++sample) {
    const int key = 10000 + static_cast<int>(rng() % 90000);
    const std::string needle = absl::StrCat("The pass key is ", key, ". Remember it. ", key,
                                            " is the pass key. ");
    // Fill to about `length` tokens with the needle at `depth` of the filler.
    const int budget = length - 80;
    const int n_fill = std::max(1, budget / std::max(1, filler_tokens));
    const int at = static_cast<int>(std::lround(depth * n_fill));
    std::string text = head;
    for (int f = 0; f <= n_fill; ++f) {
      if (f == at) text += needle;
      if (f < n_fill) text += filler;
    }
    text += question;
    const std::vector<int32_t> tokens = s.tok->Encode(text, false, s.tok->data().add_bos);
    const std::vector<int32_t> q_tokens = s.tok->Encode(question, false, false);
    const int n_question = static_cast<int>(q_tokens.size());
    const int prefix = static_cast<int>(tokens.size()) - n_question;
    if (static_cast<int>(tokens.size()) + kGen > c.max_context)
      return absl::InvalidArgumentError("passkey prompt too long for the model");
    TS_RETURN_IF_ERROR(s.Prefill(tokens, prefix, n_question + kGen));
    results[0].length = static_cast<int>(tokens.size());
    // Decodes the question token by token, then generates greedily under a spec.
    auto answer = [&](const SelectionSpec* spec) -> absl::StatusOr<bool> {
      std::vector<int32_t> pages = s.DecodePages(n_question + kGen);
      std::unique_ptr<Policy> policy;
      if (spec != nullptr) {
        TS_ASSIGN_OR_RETURN(policy, CreatePolicy(*spec, s.Context(seed)));
      }
      std::vector<int32_t> seq(tokens.begin(), tokens.end());
      std::vector<float> logits;
      std::string out;
      for (int pos = prefix; pos < static_cast<int>(tokens.size()) + kGen - 1; ++pos) {
        SeqInput in;
        in.tokens = &seq[pos];
        in.n = 1;
        in.start_pos = pos;
        in.pages = &pages;
        if (policy) {
          policy->BeginStep(pos + 1);
          in.selector = policy.get();
        }
        TS_RETURN_IF_ERROR(s.runner->Forward({in}, s.kv.get(), &logits));
        if (policy) policy->EndStep();
        if (pos + 1 >= static_cast<int>(tokens.size())) {
          const int32_t next = Argmax(logits.data(), c.vocab_size);
          seq.push_back(next);
          out += s.tok->TokenBytes(next);
        }
      }
      // The first integer in the answer must be the key.
      std::string digits;
      for (char ch : out) {
        if (ch >= '0' && ch <= '9') {
          digits += ch;
        } else if (!digits.empty()) {
          break;
        }
      }
      return digits == std::to_string(key);
    };
    TS_ASSIGN_OR_RETURN(bool dense_ok, answer(nullptr));
    for (size_t i = 0; i < specs.size(); ++i) {
      TS_ASSIGN_OR_RETURN(bool ok, answer(&specs[i]));
      results[i].correct += ok;
      results[i].correct_dense += dense_ok;
      results[i].length = static_cast<int>(tokens.size());
    }
  }
  return results;
}

}  // namespace tinyserve
