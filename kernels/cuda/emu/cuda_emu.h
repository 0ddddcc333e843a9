// File: kernels/cuda/emu/cuda_emu.h
// A small CPU emulator of the CUDA execution model, so that a kernel's own source runs in a CPU
// test (CI has no GPU). A test defines TS_CUDA_EMU, includes this header FIRST, then the kernel's
// .cu file, and launches the kernel with ts_emu::Launch. The kernel sources keep a few
// `#ifdef TS_CUDA_EMU` branches: around inline PTX (cp.async, ldmatrix, mma), dynamic shared
// memory and the host launchers.
//
// Modelled:
//   - a grid of blocks, run one after another; the threads of a block as fibers (ucontext) on one
//     OS thread, switched only where they synchronise, so all threads of a block interleave at
//     barriers as warps do;
//   - __syncthreads and __syncwarp as barriers (threads that wait at different barriers deadlock:
//     the emulator aborts and says so), warp shuffles, ballot, match_any;
//   - shared memory: `__shared__` variables (static) and the dynamic allocation;
//   - cp.async as a 16-byte copy done at the cp.async.wait_group that covers it (kAtWait: a read
//     before the wait sees stale data) or at issue (kAtIssue: an overwrite of a buffer still being
//     read shows); tests run both;
//   - ldmatrix.x4 (plain and .trans) and mma.sync.m16n8k16 with f16/bf16 inputs and f32
//     accumulators, with the fragment layouts of the PTX ISA; ldmatrix checks that its row
//     addresses are 16-byte aligned and inside shared memory.
// Not modelled: timing, memory ordering between threads that do not synchronise (every write is
// seen at once), anything not listed.
#pragma once

#ifndef TS_CUDA_EMU
#error "cuda_emu.h is for host builds with TS_CUDA_EMU defined"
#endif

// Before the CUDA headers, which only define these when the compiler is not nvcc and they are
// not defined yet.
#define __shared__ static
#define __launch_bounds__(...)

#include <sys/mman.h>
#include <ucontext.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// Context switches: glibc's swapcontext makes a system call per switch (the signal mask), which
// dominated the emulator's time; on x86-64 a 20-instruction switch (cudart_emu.cc) saves the
// callee-saved registers, MXCSR and the x87 control word and swaps stacks.
#if defined(__x86_64__) && !defined(TS_EMU_PORTABLE_SWITCH)
#define TS_EMU_FAST_SWITCH 1
extern "C" void ts_emu_switch(void** save_sp, void* load_sp);
#else
#define TS_EMU_FAST_SWITCH 0
#endif

namespace ts_emu {

enum class CpAsyncMode { kAtWait, kAtIssue };

struct Barrier {
  int size = 0, arrived = 0;
  uint64_t generation = 0;
};

struct PendingCopy {
  void* dst;
  const void* src;
  int src_bytes;
};

// A fiber's stack (TakeStack): mapped with a guard page below it.
struct StackDeleter {
  size_t bytes = 0;
  void operator()(char* p) const { munmap(p - kGuard, bytes + kGuard); }
  static constexpr size_t kGuard = 4096;
};
using Stack = std::unique_ptr<char[], StackDeleter>;

struct Fiber {
  ucontext_t ctx;      // the portable switch (not x86-64)
  void* sp = nullptr;  // the fast switch (x86-64): the saved stack pointer
  Stack stack;
  dim3 idx;
  bool done = false;
  std::vector<std::vector<PendingCopy>> groups;  // committed cp.async groups, oldest first
  std::vector<PendingCopy> open;                 // issued since the last commit
  std::vector<PendingCopy> waited;  // kAtWait: complete, written at this thread's next barrier
};

struct Runtime {
  dim3 grid, block, block_idx;
  std::vector<Fiber> fibers;
  int current = -1;
  ucontext_t scheduler;
  void* scheduler_sp = nullptr;
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<std::array<uint64_t, 32 * 8>> exchange;  // per warp: 8 words per lane
  std::vector<uint64_t> smem_words;                     // dynamic shared memory, 8-byte aligned
  size_t smem_bytes = 0;
  CpAsyncMode mode = CpAsyncMode::kAtWait;
  uint64_t progress = 0;
  std::function<void()> body;
};

inline Runtime* g_runtime = nullptr;
inline Runtime& Rt() { return *g_runtime; }
inline Fiber& Cur() { return Rt().fibers[Rt().current]; }

[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "cuda_emu: %s (block %u,%u,%u thread %d)\n", what, Rt().block_idx.x,
               Rt().block_idx.y, Rt().block_idx.z, Rt().current);
  std::abort();
}

inline int LinearTid() { return Rt().current; }
inline int Lane() { return LinearTid() % 32; }
inline int Warp() { return LinearTid() / 32; }

// The other threads run while this one is switched out: tell the compiler any memory may have
// changed (shared-memory statics whose address never escapes included).
inline void Yield() {
#if TS_EMU_FAST_SWITCH
  ts_emu_switch(&Cur().sp, Rt().scheduler_sp);
#else
  swapcontext(&Cur().ctx, &Rt().scheduler);
#endif
  asm volatile("" ::: "memory");
}

inline void Arrive(Barrier& b) {
  const uint64_t gen = b.generation;
  if (++b.arrived == b.size) {
    b.arrived = 0;
    ++b.generation;
    ++Rt().progress;
    return;
  }
  while (b.generation == gen) Yield();
}

inline void SyncWarp() { Arrive(Rt().warp_barriers[Warp()]); }

// Every lane of the warp passes `mine`; returns all 32 lanes' values.
template <typename T>
std::array<T, 32> WarpGather(const T& mine) {
  static_assert(sizeof(T) <= 64 && std::is_trivially_copyable_v<T>, "8 words per lane");
  auto& x = Rt().exchange[Warp()];
  std::memcpy(&x[Lane() * 8], &mine, sizeof(T));
  SyncWarp();
  std::array<T, 32> all;
  for (int l = 0; l < 32; ++l) std::memcpy(&all[l], &x[l * 8], sizeof(T));
  SyncWarp();  // nobody overwrites the exchange before everyone has read it
  return all;
}

inline unsigned char* DynamicSmem() {
  return reinterpret_cast<unsigned char*>(Rt().smem_words.data());
}

inline bool InSmem(const void* p, size_t bytes) {
  const auto* b = reinterpret_cast<const unsigned char*>(Rt().smem_words.data());
  const auto* q = static_cast<const unsigned char*>(p);
  return q >= b && q + bytes <= b + Rt().smem_bytes;
}

// cp.async (16 bytes; src_bytes < 16 zero-fills the rest).
inline void DoCopy(const PendingCopy& c) {
  std::memset(c.dst, 0, 16);
  if (c.src_bytes > 0) std::memcpy(c.dst, c.src, c.src_bytes);
}
inline void CpAsync16(void* dst, const void* src, int src_bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || !InSmem(dst, 16))
    Fail("cp.async destination not 16-byte aligned shared memory");
  const PendingCopy c{dst, src, src_bytes};
  if (Rt().mode == CpAsyncMode::kAtIssue) {
    DoCopy(c);
  } else {
    Cur().open.push_back(c);
  }
}
inline void CpAsyncCommit() {
  Cur().groups.push_back(std::move(Cur().open));
  Cur().open.clear();
}
// kAtWait: a waited group's data is written when this thread next reaches __syncwarp or
// __syncthreads (not the implicit warp sync inside ldmatrix or mma), so that a read of other
// threads' copies without a barrier after the wait sees stale data, as it may on a GPU. (It is
// stricter than CUDA for a thread reading its own copies before a barrier; no kernel here does.)
inline void CpAsyncWait(int pending) {
  Fiber& f = Cur();
  while (static_cast<int>(f.groups.size()) > pending) {
    for (const PendingCopy& c : f.groups.front()) f.waited.push_back(c);
    f.groups.erase(f.groups.begin());
  }
}
inline void LandWaitedCopies() {
  Fiber& f = Cur();
  for (const PendingCopy& c : f.waited) DoCopy(c);
  f.waited.clear();
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lanes 8i..8i+7 give the row addresses of
// matrix i. Without .trans lane l receives in r[i] the elements (row l/4, cols 2(l%4), 2(l%4)+1)
// of matrix i; with .trans (rows 2(l%4), 2(l%4)+1; col l/4). The lower half holds the first.
inline void LdMatrixX4(uint32_t (&r)[4], const void* row, bool trans) {
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0 || !InSmem(row, 16))
    Fail("ldmatrix row address not 16-byte aligned shared memory");
  const auto rows = WarpGather(row);
  const int l = Lane();
  for (int i = 0; i < 4; ++i) {
    uint16_t e[2];
    for (int j = 0; j < 2; ++j) {
      const int rr = trans ? 2 * (l % 4) + j : l / 4;
      const int cc = trans ? l / 4 : 2 * (l % 4) + j;
      std::memcpy(&e[j], static_cast<const char*>(rows[8 * i + rr]) + 2 * cc, 2);
    }
    r[i] = uint32_t{e[0]} | (uint32_t{e[1]} << 16);
  }
}

template <typename T>
float Bits16ToFloat(uint16_t b) {
  if constexpr (std::is_same_v<T, __half>) {
    __half_raw r;
    r.x = b;
    return __half2float(__half(r));
  } else {
    __nv_bfloat16_raw r;
    r.x = b;
    return __bfloat162float(__nv_bfloat16(r));
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, D = A B + C, with
// g = lane/4, t = lane%4:
//   A (16x16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B (16x8):  b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C, D (16x8): c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
template <typename T>
void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Frag {
    uint32_t a[4], b[2];
    float c[4];
  };
  Frag mine;
  std::memcpy(mine.a, a, sizeof(mine.a));
  mine.b[0] = b0;
  mine.b[1] = b1;
  std::memcpy(mine.c, c, sizeof(mine.c));
  const auto all = WarpGather(mine);
  float A[16][16], B[16][8], C[16][8];
  auto lo = [](uint32_t w) { return Bits16ToFloat<T>(static_cast<uint16_t>(w & 0xffff)); };
  auto hi = [](uint32_t w) { return Bits16ToFloat<T>(static_cast<uint16_t>(w >> 16)); };
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const Frag& f = all[l];
    for (int q = 0; q < 4; ++q) {
      const int row = g + (q & 1) * 8, col = 2 * t + (q >> 1) * 8;
      A[row][col] = lo(f.a[q]);
      A[row][col + 1] = hi(f.a[q]);
    }
    for (int q = 0; q < 2; ++q) {
      B[2 * t + 8 * q][g] = lo(f.b[q]);
      B[2 * t + 8 * q + 1][g] = hi(f.b[q]);
    }
    for (int q = 0; q < 4; ++q) C[g + (q >> 1) * 8][2 * t + (q & 1)] = f.c[q];
  }
  const int g = Lane() / 4, t = Lane() % 4;
  for (int q = 0; q < 4; ++q) {
    const int row = g + (q >> 1) * 8, col = 2 * t + (q & 1);
    float s = C[row][col];
    for (int k = 0; k < 16; ++k) s = std::fma(A[row][k], B[k][col], s);
    c[q] = s;
  }
}

// Fiber stacks: mmap'ed with a guard page below (an overflow faults instead of corrupting the
// heap), kept for the next launch (a model step launches hundreds of grids).
inline std::vector<Stack>& StackPool() {
  static std::vector<Stack> pool;
  return pool;
}
inline Stack TakeStack(size_t bytes) {
  auto& pool = StackPool();
  if (!pool.empty()) {
    Stack s = std::move(pool.back());
    pool.pop_back();
    return s;
  }
  void* p = mmap(nullptr, bytes + StackDeleter::kGuard, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) Fail("cannot map a fiber stack");
  mprotect(p, StackDeleter::kGuard, PROT_NONE);
  return Stack(static_cast<char*>(p) + StackDeleter::kGuard, StackDeleter{bytes});
}

// The emulated runtime (cudart_emu.cc): a launch in stream order, or recorded while the stream is
// captured; configuration errors (block size, grid, dynamic shared memory beyond the 48 KB default
// or the kernel's cudaFuncSetAttribute opt-in) become the launch's error, as on a GPU.
void EnqueueLaunch(const void* fn, dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   std::function<void()> body);

inline void FiberEntry() {
  Rt().body();
  Cur().done = true;
#if TS_EMU_FAST_SWITCH
  ts_emu_switch(&Cur().sp, Rt().scheduler_sp);  // never resumed
  std::abort();
#endif
}  // (portable switch) returns to the scheduler through uc_link

// A fresh context for f that starts in FiberEntry (kept out of Launch: getcontext returns twice
// as far as the compiler knows).
inline void InitFiber(Fiber& f, size_t stack_bytes, ucontext_t* link) {
#if TS_EMU_FAST_SWITCH
  (void)link;
  // The frame ts_emu_switch pops: MXCSR and x87 control word, r15..r12, rbx, rbp, then the
  // "return" address FiberEntry, above it a fake return address of FiberEntry's own (the stack is
  // 16-byte aligned at a call).
  auto* top = reinterpret_cast<uint64_t*>(
      (reinterpret_cast<uintptr_t>(f.stack.get()) + stack_bytes) & ~uintptr_t{15});
  uint64_t* sp = top;
  *--sp = 0;
  *--sp = reinterpret_cast<uint64_t>(&FiberEntry);
  for (int i = 0; i < 6; ++i) *--sp = 0;  // rbp, rbx, r12, r13, r14, r15
  uint32_t csr = 0;
  uint16_t cw = 0;
  asm volatile("stmxcsr %0" : "=m"(csr));
  asm volatile("fnstcw %0" : "=m"(cw));
  *--sp = uint64_t{csr} | (uint64_t{cw} << 32);
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack.get();
  f.ctx.uc_stack.ss_size = stack_bytes;
  f.ctx.uc_link = link;
  makecontext(&f.ctx, FiberEntry, 0);
#endif
}

// Runs kernel() (a call of the __global__ function with its arguments) over grid x block with
// `smem_bytes` of dynamic shared memory.
inline void Launch(dim3 grid, dim3 block, size_t smem_bytes, std::function<void()> kernel,
                   CpAsyncMode mode = CpAsyncMode::kAtWait) {
  Runtime rt;
  Runtime* saved = g_runtime;
  g_runtime = &rt;
  rt.grid = grid;
  rt.block = block;
  rt.mode = mode;
  rt.body = std::move(kernel);
  const int n = static_cast<int>(block.x * block.y * block.z);
  rt.smem_bytes = smem_bytes;
  rt.smem_words.assign((smem_bytes + 7) / 8 + 2, 0);
  rt.fibers.resize(n);
  const int warps = (n + 31) / 32;
  rt.warp_barriers.assign(warps, Barrier{32, 0, 0});
  rt.warp_barriers.back().size = n - 32 * (warps - 1);  // a partial last warp
  rt.block_barrier = Barrier{n, 0, 0};
  rt.exchange.assign(warps, {});
  constexpr size_t kStack = 128 * 1024;
  for (Fiber& f : rt.fibers) f.stack = TakeStack(kStack);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        rt.block_idx = dim3(bx, by, bz);
        // Stale shared memory from the previous block, like a GPU's.
        std::memset(rt.smem_words.data(), 0xff, rt.smem_words.size() * 8);
        for (int i = 0; i < n; ++i) {
          Fiber& f = rt.fibers[i];
          f.done = false;
          f.groups.clear();
          f.open.clear();
          f.waited.clear();
          f.idx = dim3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
          InitFiber(f, kStack, &rt.scheduler);
        }
        int left = n;
        while (left > 0) {
          const uint64_t before = rt.progress;
          const int left_before = left;
          for (int i = 0; i < n; ++i) {
            if (rt.fibers[i].done) continue;
            rt.current = i;
#if TS_EMU_FAST_SWITCH
            ts_emu_switch(&rt.scheduler_sp, rt.fibers[i].sp);
#else
            swapcontext(&rt.scheduler, &rt.fibers[i].ctx);
#endif
            if (rt.fibers[i].done) --left;
          }
          if (left > 0 && left == left_before && rt.progress == before)
            Fail("deadlock: threads wait at different barriers (divergent sync)");
        }
      }
  for (Fiber& f : rt.fibers) StackPool().push_back(std::move(f.stack));
  g_runtime = saved;
}

}  // namespace ts_emu

// The device-side names kernels use.
#define threadIdx (::ts_emu::Cur().idx)
#define blockIdx (::ts_emu::Rt().block_idx)
#define blockDim (::ts_emu::Rt().block)
#define gridDim (::ts_emu::Rt().grid)

// cuda_runtime.h declares its C++ overloads only for nvcc.
template <typename T>
cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}

inline void __syncthreads() {
  ts_emu::LandWaitedCopies();
  ts_emu::Arrive(ts_emu::Rt().block_barrier);
}
inline void __syncwarp(unsigned = 0xffffffffu) {
  ts_emu::LandWaitedCopies();
  ts_emu::SyncWarp();
}

template <typename T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const auto all = ts_emu::WarpGather(v);
  const int base = ts_emu::Lane() / width * width;
  return all[base + ((src % width) + width) % width];
}
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  const auto all = ts_emu::WarpGather(v);
  const int l = ts_emu::Lane(), src = l ^ lane_mask;
  return src / width == l / width ? all[src] : v;
}
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  const auto all = ts_emu::WarpGather(v);
  const int l = ts_emu::Lane(), src = l - static_cast<int>(delta);
  return src >= l / width * width ? all[src] : v;
}
inline unsigned __ballot_sync(unsigned, int pred) {
  const auto all = ts_emu::WarpGather(pred != 0);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= unsigned{all[l]} << l;
  return r;
}
inline unsigned __match_any_sync(unsigned, unsigned value) {
  const auto all = ts_emu::WarpGather(value);
  unsigned r = 0;
  for (int l = 0; l < 32; ++l) r |= unsigned{all[l] == value} << l;
  return r;
}
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p += v;
  return old;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int __ffs(unsigned x) { return x == 0 ? 0 : std::countr_zero(x) + 1; }
inline int __popc(unsigned x) { return std::popcount(x); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
