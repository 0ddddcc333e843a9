#include "router/lora_sync.h"

#include <algorithm>
#include <chrono>

#include "common/log.h"
#include "common/timer.h"
#include "worker/server/api_util.h"

namespace tinyserve {

namespace v1 = tinyserve::v1;

namespace {

// One call out to a worker: a load (with its request) or an unload.
struct Call {
  WorkerPtr worker;  // keeps the handle (the key of Shared::workers) alive until it ends
  std::string key;   // "load NAME" or "unload NAME"
  bool load = false;
  v1::LoadLoraAdapterRequest load_request;
  v1::UnloadLoraAdapterRequest unload_request;
  grpc::ClientContext context;
  v1::LoraAdapterInfo loaded;
  v1::UnloadLoraAdapterResponse unloaded;
};

}  // namespace

struct LoraSync::Shared {
  RouterMetrics* metrics;  // GUARDED_BY(mu) null once the LoraSync is gone
  double retry_seconds;
  std::mutex mu;
  bool stopped = false;  // GUARDED_BY(mu)
  struct Worker {
    WorkerPtr handle;
    bool busy = false;                   // a call is out
    std::map<std::string, double> hold;  // call key -> not again before (NowSeconds)
    std::map<std::string, int> logged;   // call key -> the failure logged last (status code)
  };
  std::map<const WorkerHandle*, Worker> workers;  // GUARDED_BY(mu)
  std::set<Call*> out;                            // GUARDED_BY(mu) calls not yet finished

  void Finish(Call* call, const grpc::Status& status) {
    // A repeat of what the worker already did (a report that predates it) is a success.
    const bool ok =
        status.ok() || status.error_code() == (call->load ? grpc::StatusCode::ALREADY_EXISTS
                                                          : grpc::StatusCode::NOT_FOUND);
    std::lock_guard<std::mutex> lock(mu);
    out.erase(call);
    if (metrics != nullptr) metrics->lora_syncs(call->load, ok).Increment();
    auto it = workers.find(call->worker.get());
    if (it == workers.end()) return;  // removed meanwhile
    Worker& w = it->second;
    w.busy = false;
    const std::string& address = call->worker->address();
    if (ok) {
      if (status.ok()) TS_LOG(INFO) << "worker " << address << ": LoRA sync: " << call->key;
      w.logged.erase(call->key);
      // Its next load report may predate the call: not again at once.
      w.hold[call->key] = NowSeconds() + 1;
      return;
    }
    const int code = static_cast<int>(status.error_code());
    if (w.logged[call->key] != code) {
      TS_LOG(WARNING) << "worker " << address << ": LoRA sync: " << call->key
                      << " failed: " << StatusCodeName(status.error_code()) << ": "
                      << status.error_message() << " (retried every " << retry_seconds << " s)";
      w.logged[call->key] = code;
    }
    w.hold[call->key] = NowSeconds() + retry_seconds;
  }
};

LoraSync::LoraSync(RouterMetrics* metrics, double retry_seconds)
    : shared_(std::make_shared<Shared>()) {
  shared_->metrics = metrics;
  shared_->retry_seconds = retry_seconds;
}

LoraSync::~LoraSync() {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->stopped = true;
  shared_->metrics = nullptr;
  for (Call* call : shared_->out) call->context.TryCancel();
}

void LoraSync::Reconcile(const std::vector<WorkerPtr>& workers) {
  struct Healthy {
    WorkerPtr worker;
    v1::LoadReport report;
  };
  std::vector<Healthy> healthy;
  for (const WorkerPtr& w : workers)
    if (w->healthy()) healthy.push_back({w, w->load()});

  // The latest event per name over the healthy workers.
  struct Event {
    bool load = false;
    double at = -1;
    std::string path;
  };
  std::map<std::string, Event> latest;
  for (const Healthy& h : healthy) {
    for (const v1::RuntimeLoraAdapter& a : h.report.runtime_lora_adapters()) {
      Event& e = latest[a.name()];
      if (a.loaded_at() > e.at) e = {true, a.loaded_at(), a.path()};
    }
    for (const v1::UnloadedLoraAdapter& u : h.report.unloaded_lora_adapters()) {
      Event& e = latest[u.name()];
      if (u.unloaded_at() > e.at) e = {false, u.unloaded_at(), ""};
    }
  }

  std::vector<std::shared_ptr<Call>> calls;
  {
    Shared& s = *shared_;
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopped) return;
    // Forget workers no longer registered.
    for (auto it = s.workers.begin(); it != s.workers.end();) {
      const bool known = std::any_of(workers.begin(), workers.end(),
                                     [&](const WorkerPtr& w) { return w.get() == it->first; });
      it = known ? std::next(it) : s.workers.erase(it);
    }
    const double now = NowSeconds();
    for (const Healthy& h : healthy) {
      Shared::Worker& w = s.workers[h.worker.get()];
      w.handle = h.worker;
      if (w.busy) continue;
      const auto& served = h.report.lora_adapters();
      const auto& runtime = h.report.runtime_lora_adapters();
      auto call = std::make_shared<Call>();
      for (const auto& [name, e] : latest) {
        if (e.load) {
          if (std::find(served.begin(), served.end(), name) != served.end()) continue;
        } else if (std::none_of(runtime.begin(), runtime.end(), [&](const auto& a) {
                     return a.name() == name && a.loaded_at() < e.at;
                   })) {
          continue;
        }
        const std::string key = (e.load ? "load " : "unload ") + name;
        auto hold = w.hold.find(key);
        if (hold != w.hold.end() && hold->second > now) continue;
        call->key = key;
        call->load = e.load;
        if (e.load) {
          call->load_request.set_lora_name(name);
          call->load_request.set_lora_path(e.path);
          call->load_request.set_loaded_at(e.at);
        } else {
          call->unload_request.set_lora_name(name);
        }
        break;
      }
      if (call->key.empty()) continue;
      call->worker = h.worker;
      w.busy = true;
      s.out.insert(call.get());
      calls.push_back(std::move(call));
    }
  }

  for (std::shared_ptr<Call>& c : calls) {
    Call* call = c.get();
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    call->worker->Prepare(&call->context);
    auto done = [shared = shared_, c](grpc::Status status) { shared->Finish(c.get(), status); };
    if (call->load) {
      call->worker->api().async()->LoadLoraAdapter(&call->context, &call->load_request,
                                                   &call->loaded, done);
    } else {
      call->worker->api().async()->UnloadLoraAdapter(&call->context, &call->unload_request,
                                                     &call->unloaded, done);
    }
  }
}

}  // namespace tinyserve
