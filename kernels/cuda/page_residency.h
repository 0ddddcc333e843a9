// File: kernels/cuda/page_residency.h
// Which KV pages of one layer sit in the device page cache of the tiered KV option (plain C++,
// no CUDA: the policy is tested on the CPU; device_model.cu moves the bytes).
//
// The tiered cache keeps every page at home in pinned host memory and `capacity` pages of the
// layer in device slots. Before a decode step attends, Ensure() is given the pages the step
// needs (the union of the pages selected for every sequence and KV head): needed pages already
// resident are hits; the others get a slot (a free one, else the least recently needed slot
// whose page the step does not need) and are listed for copying host -> device. Invalidate()
// drops pages whose home copy changed (written this step), so a stale copy is never read.
//
// Thread safety: none; one owner (the model's forward).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tinyserve::cuda {

class PageResidency {
 public:
  struct Copy {
    int32_t page;  // physical page id (home)
    int32_t slot;  // device slot
  };
  struct Totals {
    int64_t hits = 0, misses = 0;  // needed pages found resident / copied in
    int64_t over_capacity = 0;     // Ensure calls refused (needed set larger than the cache)
  };

  explicit PageResidency(int capacity);

  // Makes every page of `needed` (duplicates allowed) resident. On success fills slot_of
  // (page -> slot for the needed pages) and copies (the misses to move, each page once) and
  // returns true. Returns false, changing nothing, when the distinct needed pages exceed the
  // capacity (the caller then reads those pages from home memory directly).
  bool Ensure(const std::vector<int32_t>& needed, std::vector<Copy>* copies);
  // The slot of a resident page, or -1.
  int32_t SlotOf(int32_t page) const;
  // Forgets the device copies of these pages (their home copy changed).
  void Invalidate(const std::vector<int32_t>& pages);

  int capacity() const { return capacity_; }
  int resident() const { return static_cast<int>(slot_of_.size()); }
  const Totals& totals() const { return totals_; }

 private:
  int capacity_;
  int64_t clock_ = 0;
  std::unordered_map<int32_t, int32_t> slot_of_;  // page -> slot
  std::vector<int32_t> page_in_;                   // slot -> page, -1 free
  std::vector<int64_t> last_used_;                 // slot -> clock of the last Ensure needing it
  Totals totals_;
};

}  // namespace tinyserve::cuda
