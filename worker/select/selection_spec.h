// File: worker/select/selection_spec.h
// Which token-selection policy a request (or the server) uses, and its parameters.
#pragma once

#include <map>
#include <string>

#include "absl/status/status.h"

namespace tinyserve {

struct SelectionSpec {
  std::string policy = "dense";  // dense, quest, streaming, h2o, snapkv, oracle, random
  int budget = 1024;             // tokens attended per layer and KV head (pages = budget / P)
  int dense_layers = 2;          // the first N layers always attend densely
  int sink_pages = 1;            // always-kept first pages (attention sinks), budget allowing
  int recent_pages = 0;          // always-kept most recent full pages, budget allowing
  int oracle_every = 0;          // every Nth decode step compare with the oracle (0 = never)
  std::map<std::string, std::string> params;  // policy-specific (quest gqa=sum|max, default sum)
};

// InvalidArgument naming the field for an unknown policy name or a bad parameter.
absl::Status ValidateSelectionSpec(const SelectionSpec& spec, int page_size);

}  // namespace tinyserve
