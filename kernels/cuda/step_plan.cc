#include "kernels/cuda/step_plan.h"

#include <algorithm>

namespace tinyserve::cuda {

bool PlanStep(const std::vector<DeviceSeq>& batch, const StepLimits& lim, StepPlan* plan,
              std::string* error) {
  StepPlan& p = *plan;
  p = StepPlan();
  const int n_seq = static_cast<int>(batch.size());
  const int P = lim.page_size, W = lim.max_pages_per_seq;
  if (n_seq > lim.max_batch) {
    *error = "batch of " + std::to_string(n_seq) + " sequences exceeds max_batch " +
             std::to_string(lim.max_batch);
    return false;
  }
  for (const DeviceSeq& s : batch) {
    if (s.n <= 0 || s.tokens == nullptr) {
      *error = "a sequence in the batch has no new tokens";
      return false;
    }
    const int64_t need = (s.start_pos + s.n + P - 1) / P;
    if (s.start_pos < 0 || need > W || s.n_pages < need || s.pages == nullptr) {
      *error = "page table does not cover the sequence (or exceeds max_pages_per_seq)";
      return false;
    }
    for (int64_t j = 0; j < need; ++j)
      if (s.pages[j] < 0 || s.pages[j] >= lim.num_pages) {
        *error = "page id " + std::to_string(s.pages[j]) + " is out of range";
        return false;
      }
    for (int i = 0; i < s.n; ++i)
      if (s.tokens[i] < 0 || s.tokens[i] >= lim.vocab) {
        *error = "token id " + std::to_string(s.tokens[i]) + " is out of range";
        return false;
      }
    if (s.lora < 0) {
      *error = "LoRA adapter id " + std::to_string(s.lora) + " is negative";
      return false;
    }
    if (s.n == 1 && s.attention.quest && s.attention.budget_pages < 1) {
      *error = "quest budget_pages must be >= 1";
      return false;
    }
    p.rows += s.n;
  }
  if (p.rows > lim.max_tokens) {
    *error = "step of " + std::to_string(p.rows) + " tokens exceeds max_tokens " +
             std::to_string(lim.max_tokens);
    return false;
  }
  // Decode groups in first-seen order of their specs, then the prefill sequences.
  for (int i = 0; i < n_seq; ++i) {
    if (batch[i].n != 1) continue;
    bool seen = false;
    for (const DecodeGroup& g : p.groups) seen |= g.att == batch[i].attention;
    if (seen) continue;
    DecodeGroup g;
    g.begin = static_cast<int>(p.order.size());
    g.att = batch[i].attention;
    for (int j = i; j < n_seq; ++j)
      if (batch[j].n == 1 && batch[j].attention == g.att) p.order.push_back(j);
    g.size = static_cast<int>(p.order.size()) - g.begin;
    // One adapter's sequences together (first-seen order of adapters): fewer LoRA GEMMs.
    std::vector<int> first_seen;
    for (int k = g.begin; k < g.begin + g.size; ++k) {
      const int id = batch[p.order[k]].lora;
      if (std::find(first_seen.begin(), first_seen.end(), id) == first_seen.end())
        first_seen.push_back(id);
    }
    auto rank = [&](int j) {
      return std::find(first_seen.begin(), first_seen.end(), batch[j].lora) - first_seen.begin();
    };
    std::stable_sort(p.order.begin() + g.begin, p.order.end(),
                     [&](int a, int b) { return rank(a) < rank(b); });
    p.groups.push_back(g);
  }
  p.nd = static_cast<int>(p.order.size());
  for (int i = 0; i < n_seq; ++i)
    if (batch[i].n != 1) p.order.push_back(i);

  p.n_seq = n_seq;
  p.seq_len.resize(n_seq);
  p.tables.resize(n_seq);
  p.new_indptr.assign(n_seq + 1, 0);
  p.seq_lens.resize(n_seq);
  p.page_indptr.resize(n_seq + 1);
  p.page_indices.assign(static_cast<size_t>(n_seq) * W, 0);
  p.q_indptr.assign(n_seq - p.nd + 1, 0);
  std::vector<int> first_row(n_seq);  // by batch index
  for (int k = 0; k < n_seq; ++k) {
    const DeviceSeq& s = batch[p.order[k]];
    first_row[p.order[k]] = static_cast<int>(p.ids.size());
    for (int i = 0; i < s.n; ++i) {
      p.ids.push_back(s.tokens[i]);
      p.positions.push_back(static_cast<int32_t>(s.start_pos + i));
    }
    p.new_indptr[k + 1] = static_cast<int32_t>(p.ids.size());
    if (s.lora != 0) {
      if (!p.lora_runs.empty() && p.lora_runs.back().lora == s.lora &&
          p.lora_runs.back().row0 + p.lora_runs.back().rows == first_row[p.order[k]])
        p.lora_runs.back().rows += s.n;
      else
        p.lora_runs.push_back({s.lora, first_row[p.order[k]], s.n});
    }
    p.seq_len[k] = static_cast<int>(s.start_pos + s.n);
    p.seq_lens[k] = p.seq_len[k];
    p.page_indptr[k] = k * W;
    const int need = (p.seq_len[k] + P - 1) / P;
    p.tables[k].assign(s.pages, s.pages + need);
    std::copy(s.pages, s.pages + need, p.page_indices.begin() + static_cast<size_t>(k) * W);
    for (int j = static_cast<int>(s.start_pos / P); j < need; ++j) p.written.push_back(s.pages[j]);
    p.max_new = std::max(p.max_new, s.n);
    if (k >= p.nd) {
      p.q_indptr[k - p.nd + 1] = p.q_indptr[k - p.nd] + s.n;
      p.max_q_prefill = std::max(p.max_q_prefill, s.n);
    }
  }
  p.page_indptr[n_seq] = n_seq * W;
  for (int i = 0; i < n_seq; ++i) {
    const DeviceSeq& s = batch[i];
    for (int j = s.all_logits ? 0 : s.n - 1; j < s.n; ++j) p.logit_rows.push_back(first_row[i] + j);
    if (s.hidden) {
      p.hidden_spans.push_back(first_row[i] + (s.hidden_last ? s.n - 1 : 0));
      p.hidden_spans.push_back(s.hidden_last ? 1 : s.n);
    }
  }
  return true;
}

}  // namespace tinyserve::cuda
