// The CUDA runtime API calls TinyServe makes, implemented on the CPU for the emulated builds
// (kernels/cuda sources compiled by the host compiler against emu/cuda_emu.h and linked with this
// file instead of libcudart). One device; "device" memory is host memory. Streams hold their work
// until the host waits for it (see Drain), in stream order, with the legacy stream's implicit
// ordering. While a stream is captured into a graph its kernel launches and async copies are
// recorded instead, and cudaGraphLaunch enqueues them again (arguments as they were at capture,
// memory as it is when they run). What CUDA forbids during a global-mode capture (synchronous
// copies and memsets, allocation, synchronisation) fails with cudaErrorStreamCaptureUnsupported
// and invalidates the capture, as on a GPU. cuBLAS's GemmEx, as gemm.cu uses it, is emulated too
// (EmuCublas*).
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include "kernels/cuda/emu/cuda_emu.h"
#include "kernels/cuda/emu/cublas_emu.h"

#if TS_EMU_FAST_SWITCH
// void ts_emu_switch(void** save_sp, void* load_sp): pushes the callee-saved registers, MXCSR and
// the x87 control word, stores the stack pointer in *save_sp, loads load_sp and pops the same.
asm(R"(
  .text
  .globl ts_emu_switch
  .type ts_emu_switch, @function
ts_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size ts_emu_switch, .-ts_emu_switch
)");
#endif

struct CUstream_st {
  bool non_blocking = false;  // cudaStreamNonBlocking: not ordered with the legacy stream
  bool capturing = false;
  bool capture_invalid = false;
  std::vector<std::function<void()>> captured;
  std::vector<std::function<void()>> pending;  // enqueued, not yet run
};
struct CUgraph_st {
  std::vector<std::function<void()>> nodes;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> nodes;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point t;
};

namespace ts_emu {
namespace {

// One host thread uses the emulated device at a time (the engine thread, or a test's).
struct State {
  cudaError_t last_error = cudaSuccess;
  CUstream_st legacy;                       // the default (null) stream
  std::vector<CUstream_st*> streams;        // created streams, in creation order
  std::map<const void*, int> max_dynamic_smem;  // cudaFuncSetAttribute opt-ins
  std::map<const void*, uint64_t> launches;     // per kernel
};
State& St() {
  static State s;
  return s;
}

cudaError_t Err(cudaError_t e) {
  St().last_error = e;
  return e;
}

CUstream_st* Resolve(cudaStream_t s) { return s != nullptr ? s : &St().legacy; }

// A global-mode capture is under way on some stream.
CUstream_st* Capturing() {
  for (CUstream_st* s : St().streams)
    if (s->capturing) return s;
  return nullptr;
}
// An operation CUDA forbids during a global capture: it fails and invalidates the capture.
bool ForbiddenDuringCapture() {
  if (CUstream_st* s = Capturing()) {
    s->capture_invalid = true;
    return true;
  }
  return false;
}

// Streams run their work only when the host waits for it (a stream or device synchronisation,
// a synchronous copy out, an event wait, a free), as a GPU may: a host read of results before
// the wait, or a host write to a buffer an enqueued copy has yet to read, shows.
void Drain(CUstream_st* s) {
  while (!s->pending.empty()) {
    std::vector<std::function<void()>> ops;
    ops.swap(s->pending);
    for (auto& op : ops) op();
  }
}
void DrainAll() {
  Drain(&St().legacy);
  for (CUstream_st* s : St().streams) Drain(s);
}
// The legacy stream's implicit ordering: its work waits for every blocking stream's, and a
// blocking stream's waits for the legacy stream's; non-blocking streams are ordered with neither.
void OrderWithLegacy(CUstream_st* s) {
  if (s == &St().legacy) {
    for (CUstream_st* o : St().streams)
      if (!o->non_blocking) Drain(o);
  } else if (!s->non_blocking) {
    Drain(&St().legacy);
  }
}

void Enqueue(cudaStream_t stream, std::function<void()> op) {
  CUstream_st* s = Resolve(stream);
  if (s->capturing) {
    s->captured.push_back(std::move(op));
    return;
  }
  OrderWithLegacy(s);
  s->pending.push_back(std::move(op));
}

}  // namespace

void EnqueueLaunch(const void* fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   std::function<void()> body) {
  const uint64_t threads = uint64_t{block.x} * block.y * block.z;
  int limit = 48 * 1024;
  if (auto it = St().max_dynamic_smem.find(fn); it != St().max_dynamic_smem.end())
    limit = std::max(limit, it->second);
  if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 ||
      grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu ||
      smem > static_cast<size_t>(limit)) {
    // A bad configuration fails the launch (cudaGetLastError), nothing runs.
    Err(threads > 1024 ? cudaErrorInvalidConfiguration : cudaErrorInvalidValue);
    return;
  }
  // A kernel's cp.async copies land late (at the barrier after the wait) on its even launches
  // and at issue on its odd ones, so that code which reads before waiting and synchronising, or
  // overwrites a buffer still in use, shows wrong data in one of the two.
  const CpAsyncMode mode =
      St().launches[fn]++ % 2 == 0 ? CpAsyncMode::kAtWait : CpAsyncMode::kAtIssue;
  Enqueue(stream, [grid, block, smem, body = std::move(body), mode] {
    Launch(grid, block, smem, body, mode);
  });
}

}  // namespace ts_emu

using ts_emu::St;

extern "C" {

// Device math the CUDA headers declare for host compilers too (C linkage), defined here.
float __expf(float x) { return std::exp(x); }

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : ts_emu::Err(cudaErrorInvalidDevice);
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return ts_emu::Err(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return ts_emu::Err(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "TinyServe CUDA emulator (CPU)");
  prop->multiProcessorCount = 132;
  prop->l2CacheSize = 50 << 20;
  prop->major = 9;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->maxThreadsPerBlock = 1024;
  prop->warpSize = 32;
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value > 227 * 1024) return ts_emu::Err(cudaErrorInvalidValue);
    St().max_dynamic_smem[func] = value;
  }
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = St().last_error;
  St().last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return St().last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    default: return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (ts_emu::ForbiddenDuringCapture()) return ts_emu::Err(cudaErrorStreamCaptureUnsupported);
  *ptr = std::aligned_alloc(256, std::max<size_t>(256, (bytes + 255) / 256 * 256));
  if (*ptr == nullptr) return ts_emu::Err(cudaErrorMemoryAllocation);
  std::memset(*ptr, 0xa5, bytes);  // cudaMalloc does not clear: neither do we
  return cudaSuccess;
}
cudaError_t cudaFree(void* ptr) {
  ts_emu::DrainAll();  // cudaFree synchronises the device
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int) {
  return cudaMalloc(ptr, bytes);
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cudaMalloc(ptr, bytes); }
cudaError_t cudaFreeHost(void* ptr) {
  ts_emu::DrainAll();
  std::free(ptr);
  return cudaSuccess;
}
cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int) {
  *dev = host;
  return cudaSuccess;
}

// On the legacy stream. Host to device it may return before the data lands (CUDA stages a
// pageable source and lets the DMA finish later): the source is copied now and lands with the
// legacy stream's next work, so a kernel on a non-blocking stream that does not wait for it reads
// the old contents. Other directions return when done.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (ts_emu::ForbiddenDuringCapture()) return ts_emu::Err(cudaErrorStreamCaptureUnsupported);
  if (kind == cudaMemcpyHostToDevice) {
    auto staged = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                      static_cast<const char*>(src) + bytes);
    ts_emu::Enqueue(nullptr, [=] { std::memcpy(dst, staged->data(), bytes); });
    return cudaSuccess;
  }
  ts_emu::Enqueue(nullptr, [=] { std::memmove(dst, src, bytes); });
  ts_emu::Drain(&St().legacy);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  ts_emu::Enqueue(stream, [=] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}
// Asynchronous to the host on device memory (the legacy stream), like cudaMemset.
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (ts_emu::ForbiddenDuringCapture()) return ts_emu::Err(cudaErrorStreamCaptureUnsupported);
  ts_emu::Enqueue(nullptr, [=] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  ts_emu::Enqueue(stream, [=] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  *stream = new CUstream_st;
  (*stream)->non_blocking = (flags & cudaStreamNonBlocking) != 0;
  St().streams.push_back(*stream);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  ts_emu::Drain(stream);  // its work still completes
  auto& v = St().streams;
  v.erase(std::remove(v.begin(), v.end(), stream), v.end());
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (ts_emu::ForbiddenDuringCapture()) return ts_emu::Err(cudaErrorStreamCaptureUnsupported);
  ts_emu::Drain(ts_emu::Resolve(stream));
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  if (ts_emu::ForbiddenDuringCapture()) return ts_emu::Err(cudaErrorStreamCaptureUnsupported);
  ts_emu::DrainAll();
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (stream == nullptr || stream->capturing) return ts_emu::Err(cudaErrorIllegalState);
  stream->capturing = true;
  stream->capture_invalid = false;
  stream->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (stream == nullptr || !stream->capturing) return ts_emu::Err(cudaErrorIllegalState);
  stream->capturing = false;
  *graph = nullptr;
  if (stream->capture_invalid) return ts_emu::Err(cudaErrorStreamCaptureInvalidated);
  *graph = new CUgraph_st{std::move(stream->captured)};
  stream->captured.clear();
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (graph == nullptr) return ts_emu::Err(cudaErrorInvalidValue);
  *exec = new CUgraphExec_st{graph->nodes};
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (exec == nullptr) return ts_emu::Err(cudaErrorInvalidValue);
  for (const auto& node : exec->nodes) ts_emu::Enqueue(stream, node);
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st;
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  ts_emu::Enqueue(stream, [event] { event->t = std::chrono::steady_clock::now(); });
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  ts_emu::DrainAll();
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->t - start->t).count();
  return cudaSuccess;
}

}  // extern "C"

// cuBLAS, as gemm.cu calls it: C (m x n, column-major, ldc) = alpha op(A) op(B) + beta C with
// 16-bit A and B, f32 compute, 16-bit or f32 C; run in the handle's stream.
struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace ts_emu {
namespace {

float Load(const void* p, cudaDataType t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  const uint16_t b = static_cast<const uint16_t*>(p)[i];
  return t == CUDA_R_16F ? Bits16ToFloat<__half>(b) : Bits16ToFloat<__nv_bfloat16>(b);
}
void Store(void* p, cudaDataType t, int64_t i, float v) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
  } else if (t == CUDA_R_16F) {
    static_cast<uint16_t*>(p)[i] = static_cast<__half_raw>(__float2half_rn(v)).x;
  } else {
    static_cast<uint16_t*>(p)[i] = static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(v)).x;
  }
}

}  // namespace

cublasStatus_t EmuCublasCreate(cublasHandle_t* h) {
  *h = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t EmuCublasDestroy(cublasHandle_t h) {
  delete h;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t EmuCublasSetWorkspace(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t EmuCublasSetStream(cublasHandle_t h, cudaStream_t s) {
  h->stream = s;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t EmuCublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                               int n, int k, const void* alpha, const void* A, cudaDataType at,
                               int lda, const void* B, cudaDataType bt, int ldb, const void* beta,
                               void* C, cudaDataType ct, int ldc, cublasComputeType_t,
                               cublasGemmAlgo_t) {
  if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  Enqueue(h->stream, [=] {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float s = 0.f;
        for (int l = 0; l < k; ++l) {
          const int64_t ai = ta == CUBLAS_OP_N ? int64_t{l} * lda + i : int64_t{i} * lda + l;
          const int64_t bi = tb == CUBLAS_OP_N ? int64_t{j} * ldb + l : int64_t{l} * ldb + j;
          s = std::fma(Load(A, at, ai), Load(B, bt, bi), s);
        }
        const int64_t ci = int64_t{j} * ldc + i;
        Store(C, ct, ci, al * s + (be != 0.f ? be * Load(C, ct, ci) : 0.f));
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace ts_emu
