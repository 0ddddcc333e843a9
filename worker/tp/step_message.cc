#include "worker/tp/step_message.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tinyserve {
namespace {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void Str(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  template <typename T>
  void Vec(const std::vector<T>& v) {
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  template <typename T>
  bool Get(T* v) {
    if (pos_ + sizeof(T) > s_.size()) return false;
    std::memcpy(v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool Str(std::string* v) {
    uint32_t n = 0;
    if (!Get(&n) || pos_ + n > s_.size()) return false;
    v->assign(s_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Vec(std::vector<T>* v) {
    uint32_t n = 0;
    if (!Get(&n) || pos_ + static_cast<size_t>(n) * sizeof(T) > s_.size()) return false;
    v->resize(n);
    std::memcpy(v->data(), s_.data() + pos_, static_cast<size_t>(n) * sizeof(T));
    pos_ += static_cast<size_t>(n) * sizeof(T);
    return true;
  }
  bool done() const { return pos_ == s_.size(); }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

void PutSpec(Writer& w, const SelectionSpec& s) {
  w.Str(s.policy);
  w.Put<int32_t>(s.budget);
  w.Put<int32_t>(s.dense_layers);
  w.Put<int32_t>(s.sink_pages);
  w.Put<int32_t>(s.recent_pages);
  w.Put<int32_t>(s.oracle_every);
  w.Put<uint32_t>(static_cast<uint32_t>(s.params.size()));
  for (const auto& [k, v] : s.params) {
    w.Str(k);
    w.Str(v);
  }
}

bool GetSpec(Reader& r, SelectionSpec* s) {
  uint32_t n = 0;
  if (!r.Str(&s->policy) || !r.Get(&s->budget) || !r.Get(&s->dense_layers) ||
      !r.Get(&s->sink_pages) || !r.Get(&s->recent_pages) || !r.Get(&s->oracle_every) ||
      !r.Get(&n))
    return false;
  s->params.clear();
  for (uint32_t i = 0; i < n; ++i) {
    std::string k, v;
    if (!r.Str(&k) || !r.Str(&v)) return false;
    s->params[k] = v;
  }
  return true;
}

}  // namespace

std::string EncodeStepMessage(const StepMessage& m) {
  Writer w;
  w.Put<uint8_t>(static_cast<uint8_t>(m.kind));
  w.Vec(m.finished);
  w.Vec(m.reset_pages);
  w.Put<uint32_t>(static_cast<uint32_t>(m.entries.size()));
  for (const StepEntry& e : m.entries) {
    w.Put<uint64_t>(e.seq);
    w.Vec(e.tokens);
    w.Put<int64_t>(e.start_pos);
    w.Vec(e.pages);
    const uint8_t flags = (e.all_logits ? 1 : 0) | (e.select ? 2 : 0) |
                          (e.prefill_done ? 4 : 0) | (e.has_spec ? 8 : 0);
    w.Put<uint8_t>(flags);
    w.Put<int64_t>(e.begin_tokens);
    w.Put<int32_t>(e.lora);
    if (e.has_spec) {
      PutSpec(w, e.spec);
      w.Put<uint64_t>(e.seed);
    }
  }
  w.Put<uint32_t>(static_cast<uint32_t>(m.lora_loads.size()));
  for (const LoraLoad& l : m.lora_loads) {
    w.Str(l.name);
    w.Str(l.path);
  }
  w.Vec(m.lora_frees);
  return w.Take();
}

absl::StatusOr<StepMessage> DecodeStepMessage(const std::string& bytes) {
  Reader r(bytes);
  StepMessage m;
  uint8_t kind = 0;
  uint32_t n = 0;
  const auto bad = [] { return absl::DataLossError("malformed tensor-parallel step message"); };
  if (!r.Get(&kind) || kind < 1 || kind > 4) return bad();
  m.kind = static_cast<StepMessage::Kind>(kind);
  // Counts are bounded by the bytes left (each element takes at least one).
  if (!r.Vec(&m.finished) || !r.Vec(&m.reset_pages) || !r.Get(&n) || n > bytes.size()) return bad();
  m.entries.resize(n);
  for (StepEntry& e : m.entries) {
    uint8_t flags = 0;
    if (!r.Get(&e.seq) || !r.Vec(&e.tokens) || !r.Get(&e.start_pos) || !r.Vec(&e.pages) ||
        !r.Get(&flags) || !r.Get(&e.begin_tokens) || !r.Get(&e.lora))
      return bad();
    e.all_logits = flags & 1;
    e.select = flags & 2;
    e.prefill_done = flags & 4;
    e.has_spec = flags & 8;
    if (e.has_spec && (!GetSpec(r, &e.spec) || !r.Get(&e.seed))) return bad();
  }
  if (!r.Get(&n) || n > bytes.size()) return bad();
  m.lora_loads.resize(n);
  for (LoraLoad& l : m.lora_loads)
    if (!r.Str(&l.name) || !r.Str(&l.path)) return bad();
  if (!r.Vec(&m.lora_frees) || !r.done()) return bad();
  return m;
}

absl::Status SendStepMessage(Communicator* comm, const StepMessage& m) {
  const std::string payload = EncodeStepMessage(m);
  std::string first(kStepMessageFirstChunk, '\0');
  const uint64_t n = payload.size();
  std::memcpy(first.data(), &n, sizeof(n));
  const size_t head = std::min<size_t>(payload.size(), kStepMessageFirstChunk - sizeof(n));
  std::memcpy(first.data() + sizeof(n), payload.data(), head);
  TS_RETURN_IF_ERROR(comm->Broadcast(first.data(), first.size(), 0));
  if (head < payload.size()) {
    std::string rest = payload.substr(head);
    TS_RETURN_IF_ERROR(comm->Broadcast(rest.data(), rest.size(), 0));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepMessage> ReceiveStepMessage(Communicator* comm) {
  std::string first(kStepMessageFirstChunk, '\0');
  TS_RETURN_IF_ERROR(comm->Broadcast(first.data(), first.size(), 0));
  uint64_t n = 0;
  std::memcpy(&n, first.data(), sizeof(n));
  if (n > (1ull << 32)) return absl::DataLossError("tensor-parallel step message too large");
  const size_t head = std::min<size_t>(n, kStepMessageFirstChunk - sizeof(n));
  std::string payload(first.data() + sizeof(n), head);
  if (head < n) {
    std::string rest(n - head, '\0');
    TS_RETURN_IF_ERROR(comm->Broadcast(rest.data(), rest.size(), 0));
    payload += rest;
  }
  return DecodeStepMessage(payload);
}

absl::StatusOr<std::vector<int>> AgreeOnLoraLoads(Communicator* comm,
                                                  const std::vector<bool>& failed) {
  std::vector<float> sum(failed.begin(), failed.end());
  TS_RETURN_IF_ERROR(comm->AllReduceSum(sum.data(), sum.size()));
  return std::vector<int>(sum.begin(), sum.end());
}

absl::Status BroadcastHello(Communicator* comm, TpHello* hello) {
  return comm->Broadcast(hello, sizeof(*hello), 0);
}

}  // namespace tinyserve
