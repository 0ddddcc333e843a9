// tp_bench: decode tokens/s of the engine at a tensor-parallel size, ranks as threads of this
// process talking over the real Gloo communicator on loopback (the same code path as separate
// processes, minus process start-up). Rank 0 is an Engine; ranks > 0 run TpFollower.
//
//   tp_bench MODEL [--tp 2] [--threads 1] [--batch 4] [--prompt 32] [--tokens 64] [--reps 3]
//
// --threads is per rank (TP 2 x 1 thread uses as many cores as TP 1 x 2 threads). Prints one
// line per repetition and the median: decode tokens/s = batch * (tokens - 1) / decode window
// (first token of the first request to the last token of the last), prefill excluded.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/timer.h"
#include "worker/engine/engine.h"
#include "worker/tp/gloo_communicator.h"
#include "worker/tp/tcp_store.h"
#include "worker/tp/tp_follower.h"

namespace tinyserve {
namespace {

class TimingSink : public RequestSink {
 public:
  void OnTokens(const std::vector<GeneratedToken>& tokens, const RequestUsage&) override {
    std::lock_guard<std::mutex> lock(mu);
    const double now = NowSeconds();
    if (first < 0) first = now;
    last = now;
    n += static_cast<int>(tokens.size());
  }
  void OnFinish(FinishReason, const RequestUsage&, absl::Status s) override {
    status = s;
    done.set_value();
  }
  std::mutex mu;
  double first = -1, last = -1;
  int n = 0;
  absl::Status status;
  std::promise<void> done;
};

int Main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: tp_bench MODEL [--tp N] [--threads T] [--batch B] "
                         "[--prompt P] [--tokens N] [--reps R]\n");
    return 2;
  }
  const std::string model = argv[1];
  int tp = 1, threads = 1, batch = 4, prompt = 32, tokens = 64, reps = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (f == "--tp") tp = v;
    else if (f == "--threads") threads = v;
    else if (f == "--batch") batch = v;
    else if (f == "--prompt") prompt = v;
    else if (f == "--tokens") tokens = v;
    else if (f == "--reps") reps = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  std::vector<std::unique_ptr<Communicator>> comms(tp);
  std::vector<std::thread> followers;
  std::vector<absl::Status> fstatus(tp);
  if (tp > 1) {
    auto server = TcpStoreServer::Listen("127.0.0.1", 0);
    if (!server.ok()) return 1;
    const std::string addr = absl::StrCat("127.0.0.1:", (*server)->port());
    std::vector<std::thread> t;
    for (int r = 0; r < tp; ++r)
      t.emplace_back([&, r] {
        auto c = MakeGlooCommunicator(r, tp, addr, 60, r == 0 ? std::move(*server) : nullptr);
        if (c.ok()) comms[r] = std::move(*c);
      });
    for (auto& x : t) x.join();
    for (auto& c : comms)
      if (c == nullptr) return 1;
    for (int r = 1; r < tp; ++r)
      followers.emplace_back([&, r] {
        TpFollowerOptions fo;
        fo.model_path = model;
        fo.threads = threads;
        fstatus[r] = RunTpFollower(fo, comms[r].get());
      });
  }
  EngineOptions o;
  o.model_path = model;
  o.threads = threads;
  o.kv_pages = 512;
  o.page_size = 16;
  o.max_batch = batch;
  if (tp > 1) {
    o.tp_size = tp;
    o.tp_comm = comms[0].get();
  }
  auto e = Engine::Create(o);
  if (!e.ok()) {
    std::fprintf(stderr, "%s\n", e.status().ToString().c_str());
    return 1;
  }
  (*e)->Start();
  std::vector<double> rates;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<std::shared_ptr<TimingSink>> sinks;
    for (int b = 0; b < batch; ++b) {
      GenerateRequest r;
      r.request_id = absl::StrCat("bench", rep, "-", b);
      for (int i = 0; i < prompt; ++i) r.prompt_ids.push_back((i * 7 + b * 13 + rep) % 250 + 1);
      r.sampling.max_tokens = tokens;
      r.sampling.ignore_eos = true;
      sinks.push_back(std::make_shared<TimingSink>());
      if (auto s = (*e)->Submit(r, sinks.back()); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
    double first = 1e300, last = 0;
    int generated = 0;
    for (auto& s : sinks) {
      s->done.get_future().wait();
      if (!s->status.ok()) {
        std::fprintf(stderr, "%s\n", s->status.ToString().c_str());
        return 1;
      }
      first = std::min(first, s->first);
      last = std::max(last, s->last);
      generated += s->n - 1;
    }
    const double rate = generated / (last - first);
    rates.push_back(rate);
    std::printf("tp %d threads/rank %d batch %d: %d decode tokens in %.3f s = %.1f tok/s\n", tp,
                threads, batch, generated, last - first, rate);
  }
  e->reset();
  for (auto& f : followers) f.join();
  std::sort(rates.begin(), rates.end());
  std::printf("median tp %d threads/rank %d batch %d: %.1f tok/s\n", tp, threads, batch,
              rates[rates.size() / 2]);
  return 0;
}

}  // namespace
}  // namespace tinyserve

int main(int argc, char** argv) { return tinyserve::Main(argc, argv); }
