// File: worker/server/metric_buckets.h
// Histogram buckets (seconds) shared by the worker's and the router's latency histograms.
#pragma once

#include <vector>

namespace tinyserve {

const std::vector<double>& LatencyBuckets();      // TTFT, end-to-end, queue, prefill, decode
const std::vector<double>& FineLatencyBuckets();  // inter-token, engine steps

}  // namespace tinyserve
