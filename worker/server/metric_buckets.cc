#include "worker/server/metric_buckets.h"

namespace tinyserve {

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    30,   60,  120};
  return b;
}

const std::vector<double>& FineLatencyBuckets() {
  static const std::vector<double> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};
  return b;
}

}  // namespace tinyserve
