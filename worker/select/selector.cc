#include "worker/select/selector.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/timer.h"
#include "kernels/cpu/attention.h"
#include "worker/kv/kv_span.h"
#include "worker/kv/paged_kv_cache.h"

namespace tinyserve {

PolicyContext MakePolicyContext(const ModelConfig& model, int local_kv_heads, int page_size,
                                KvDtype kv_dtype, uint64_t seed) {
  PolicyContext c;
  c.n_layers = model.n_layers;
  c.n_kv_heads = local_kv_heads;
  c.head_dim = model.head_dim;
  c.page_size = page_size;
  c.kv_bytes_per_token_head_layer = 2 * model.head_dim * KvDtypeBytes(kv_dtype);
  c.seed = seed;
  c.sliding_window = model.sliding_window;
  c.sliding.resize(model.n_layers);
  for (int l = 0; l < model.n_layers; ++l) c.sliding[l] = model.SlidingLayer(l);
  return c;
}

Policy::Policy(const SelectionSpec& spec, const PolicyContext& ctx)
    : spec_(spec), ctx_(ctx), page_budget_(std::max(1, spec.budget / ctx.page_size)) {
  prev_.resize(static_cast<size_t>(ctx.n_layers) * ctx.n_kv_heads);
  rows_.resize(1);
}

bool Policy::Active(int layer) const { return layer >= spec_.dense_layers && !ctx_.Sliding(layer); }

bool Policy::NeedsScores(int layer) const { return Active(layer) && WantsScores(layer); }

void Policy::OnScores(const ScoresArgs& args) { Scores(args); }

void Policy::BeginStep(int64_t n_tokens, int rows) {
  n_tokens_ = n_tokens;
  oracle_step_ = spec_.oracle_every > 0 && step_index_ % spec_.oracle_every == 0;
  // Dense layers read everything (sliding ones their window): count them on both sides so
  // ratios cover the whole model.
  rows_.assign(static_cast<size_t>(std::max(1, rows)), StepStats());
  for (size_t r = 0; r < rows_.size(); ++r) {
    int64_t tokens = 0;
    for (int l = 0; l < ctx_.n_layers; ++l)
      if (!Active(l)) tokens += ctx_.LayerTokens(l, n_tokens + static_cast<int64_t>(r));
    const int64_t bytes = tokens * ctx_.n_kv_heads * ctx_.kv_bytes_per_token_head_layer;
    rows_[r].kv_bytes_read += bytes;
    rows_[r].kv_bytes_dense += bytes;
  }
  if (rows > 1) row_chosen_.assign(rows, std::vector<std::vector<int32_t>>(prev_.size()));
}

bool Policy::SelectsPerRow() const {
  for (int l = 0; l < ctx_.n_layers; ++l)
    if (NeedsScores(l)) return false;
  return Stateless() && spec_.oracle_every == 0;
}

bool Policy::Saves(int64_t n_pages, int head_dim) const {
  // Scoring pages through their boxes reads 2 * head_dim fp16 per page (against page_size
  // tokens of K+V each): selection pays only when the context exceeds the budget by more than
  // the boxes cost.
  if (!reads_metadata()) return true;
  const int64_t tok_bytes = ctx_.kv_bytes_per_token_head_layer;
  const int64_t box_bytes = 2LL * head_dim * static_cast<int64_t>(sizeof(fp16_t));
  return (page_budget_ * ctx_.page_size) * tok_bytes + n_pages * box_bytes <
         n_pages * ctx_.page_size * tok_bytes;
}

double Policy::AttendedTokens(int64_t n_tokens) const {
  const int64_t n_pages = (n_tokens + ctx_.page_size - 1) / ctx_.page_size;
  const bool selects = n_pages > page_budget_ && Saves(n_pages, ctx_.head_dim);
  const double boxes = reads_metadata() ? static_cast<double>(n_pages) * 2 * ctx_.head_dim *
                                              sizeof(fp16_t) / ctx_.kv_bytes_per_token_head_layer
                                        : 0.0;
  double sum = 0;
  for (int l = 0; l < ctx_.n_layers; ++l) {
    sum +=
        Active(l) && selects
            ? std::min<double>(static_cast<double>(n_tokens), page_budget_ * ctx_.page_size) + boxes
            : static_cast<double>(ctx_.LayerTokens(l, n_tokens));
  }
  return ctx_.n_layers > 0 ? sum / ctx_.n_layers : static_cast<double>(n_tokens);
}

bool Policy::DenseAt(int64_t n_tokens) const {
  bool active = false;
  for (int l = 0; l < ctx_.n_layers; ++l) {
    if (NeedsScores(l)) return false;  // it learns from every step's scores (h2o)
    active |= Active(l);
  }
  return !active || (n_tokens + ctx_.page_size - 1) / ctx_.page_size <= page_budget_;
}

void Policy::RecordDenseStep(int64_t n_tokens) {
  const int64_t n_pages = (n_tokens + ctx_.page_size - 1) / ctx_.page_size;
  StepStats step;
  for (int l = 0; l < ctx_.n_layers; ++l) {
    if (Active(l)) {
      step.pages_selected += n_pages * ctx_.n_kv_heads;
      step.pages_total += n_pages * ctx_.n_kv_heads;
    }
    step.kv_bytes_read +=
        ctx_.LayerTokens(l, n_tokens) * ctx_.n_kv_heads * ctx_.kv_bytes_per_token_head_layer;
  }
  step.kv_bytes_dense = step.kv_bytes_read;
  RecordStep(step);
}

void Policy::RecordStep(const StepStats& step) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
  stats_.Add(step_);
  ++step_index_;
}

void Policy::EndRow(int row) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = rows_[row];
  stats_.Add(step_);
  ++step_index_;
  if (rows_.size() > 1) {  // a verification: the row's choices are what the next step follows
    for (size_t k = 0; k < prev_.size(); ++k)
      if (!row_chosen_[row][k].empty()) prev_[k] = row_chosen_[row][k];
  }
}

int Policy::AddForced(int64_t n_pages, std::vector<int32_t>* chosen) const {
  chosen->clear();
  const int64_t last = n_pages - 1;
  chosen->push_back(static_cast<int32_t>(last));
  // Sinks and recent pages take what the budget leaves after the current page, sinks first.
  const int64_t sinks = std::min<int64_t>({spec_.sink_pages, last, page_budget_ - 1});
  const int64_t recent = std::max<int64_t>(
      0, std::min<int64_t>({spec_.recent_pages, last - sinks, page_budget_ - 1 - sinks}));
  for (int64_t p = 0; p < sinks; ++p) chosen->push_back(static_cast<int32_t>(p));
  for (int64_t p = last - recent; p < last; ++p) chosen->push_back(static_cast<int32_t>(p));
  std::sort(chosen->begin(), chosen->end());
  chosen->erase(std::unique(chosen->begin(), chosen->end()), chosen->end());
  return std::max(0, page_budget_ - static_cast<int>(chosen->size()));
}

void Policy::FillTopK(const std::vector<float>& score, int64_t n_pages,
                      std::vector<int32_t>* chosen, int pages) const {
  const int slots = (pages < 0 ? page_budget_ : pages) - static_cast<int>(chosen->size());
  if (slots > 0) {
    std::vector<bool> taken(n_pages, false);
    for (int32_t p : *chosen) taken[p] = true;
    std::vector<int32_t> cand;
    cand.reserve(n_pages);
    for (int32_t p = 0; p < n_pages; ++p)
      if (!taken[p]) cand.push_back(p);
    auto better = [&](int32_t a, int32_t b) {
      return score[a] > score[b] || (score[a] == score[b] && a < b);
    };
    if (static_cast<int>(cand.size()) > slots) {
      std::nth_element(cand.begin(), cand.begin() + slots, cand.end(), better);
      cand.resize(slots);
    }
    chosen->insert(chosen->end(), cand.begin(), cand.end());
  }
  std::sort(chosen->begin(), chosen->end());
}

void Policy::Select(const SelectArgs& a, std::vector<int32_t>* chosen) {
  Stopwatch sw;
  const int64_t n_pages = (a.n_tokens + a.page_size - 1) / a.page_size;
  const int64_t tok_bytes = ctx_.kv_bytes_per_token_head_layer;
  const int64_t box_bytes = 2LL * a.head_dim * static_cast<int64_t>(sizeof(fp16_t));
  StepStats local;
  if (n_pages <= page_budget_ || !Saves(n_pages, a.head_dim)) {
    // The context fits the budget (or selecting would read more than dense): dense, and
    // bit-identical to dense.
    chosen->clear();
    for (int32_t p = 0; p < n_pages; ++p) chosen->push_back(p);
  } else {
    local.pages_scored = Choose(a, n_pages, chosen);
  }
  int64_t tokens = 0;
  for (int32_t p : *chosen)
    tokens += std::min<int64_t>(a.page_size, a.n_tokens - static_cast<int64_t>(p) * a.page_size);
  local.pages_selected = static_cast<int64_t>(chosen->size());
  local.pages_total = n_pages;
  local.kv_bytes_dense = a.n_tokens * tok_bytes;
  local.kv_bytes_read = tokens * tok_bytes;
  if (reads_metadata())
    local.kv_bytes_read += local.pages_scored * box_bytes;
  // Reuse against the previous step of this (layer, head); a verification's rows all compare
  // with the step before it (they run at once).
  const size_t key = static_cast<size_t>(a.layer) * ctx_.n_kv_heads + a.kv_head;
  std::vector<int32_t>& prev = prev_[key];
  if (!prev.empty()) {
    std::vector<int32_t> inter;
    std::set_intersection(chosen->begin(), chosen->end(), prev.begin(), prev.end(),
                          std::back_inserter(inter));
    local.reuse_hits = static_cast<int64_t>(inter.size());
    local.reuse_total = static_cast<int64_t>(chosen->size());
  }
  if (rows_.size() > 1) {
    row_chosen_[a.row][key] = *chosen;
  } else {
    prev = *chosen;
  }
  local.select_seconds = sw.Seconds();
  if (oracle_step_ && n_pages > page_budget_) OracleCompare(a, n_pages, *chosen);
  std::lock_guard<std::mutex> lock(mu_);
  StepStats& step = rows_[a.row];
  step.pages_scored += local.pages_scored;
  step.pages_selected += local.pages_selected;
  step.pages_total += local.pages_total;
  step.kv_bytes_read += local.kv_bytes_read;
  step.kv_bytes_dense += local.kv_bytes_dense;
  step.select_seconds += local.select_seconds;
  step.reuse_hits += local.reuse_hits;
  step.reuse_total += local.reuse_total;
}

// Dense attention mass of each page for the query group (mean over the group's heads).
std::vector<float> PageAttentionMass(const SelectArgs& a, int64_t n_pages) {
  std::vector<KvSpan> spans;
  for (int64_t p = 0; p < n_pages; ++p) {
    const int32_t page = (*a.pages)[p];
    const int n = static_cast<int>(std::min<int64_t>(a.page_size, a.n_tokens - p * a.page_size));
    spans.push_back(PageSpan(*a.kv, a.layer, page, a.kv_head, n));
  }
  std::vector<float> scores(static_cast<size_t>(a.group) * a.n_tokens), lse(a.group),
      out(static_cast<size_t>(a.group) * a.head_dim);
  AttendOptions opt;
  opt.scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  opt.scores_out = scores.data();
  opt.lse_out = lse.data();
  AttendSpans(a.q, a.group, a.head_dim, spans.data(), static_cast<int>(spans.size()), opt,
              out.data());
  std::vector<float> mass(n_pages, 0.0f);
  for (int g = 0; g < a.group; ++g)
    for (int64_t t = 0; t < a.n_tokens; ++t)
      mass[t / a.page_size] += std::exp(scores[g * a.n_tokens + t] - lse[g]) / a.group;
  return mass;
}

void Policy::OracleCompare(const SelectArgs& a, int64_t n_pages,
                           const std::vector<int32_t>& chosen) {
  const std::vector<float> mass = PageAttentionMass(a, n_pages);
  // The oracle obeys the same rules (forced pages, same number of pages) and takes the pages of
  // largest true attention mass for the rest.
  std::vector<int32_t> order;
  AddForced(n_pages, &order);
  FillTopK(mass, n_pages, &order, static_cast<int>(chosen.size()));
  const size_t k = order.size();
  std::vector<int32_t> inter;
  std::set_intersection(chosen.begin(), chosen.end(), order.begin(), order.end(),
                        std::back_inserter(inter));
  double recall = 0;
  for (int32_t p : chosen) recall += mass[p];
  std::lock_guard<std::mutex> lock(mu_);
  StepStats& step = rows_[a.row];
  step.oracle_samples += 1;
  step.hit_rate_sum += k ? static_cast<double>(inter.size()) / k : 1.0;
  step.mass_recall_sum += recall;
}

}  // namespace tinyserve
