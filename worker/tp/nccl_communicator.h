// File: worker/tp/nccl_communicator.h
// The Communicator over NCCL, for tensor parallelism on GPUs.
//
// Rendezvous goes through rank 0 as for Gloo: rank 0 calls ncclGetUniqueId and publishes it in
// its TcpStoreServer (tcp_store.h) at rendezvous_addr; the other ranks read it and every rank
// calls ncclCommInitRankConfig in non-blocking mode on its device (rank % device count unless
// given).
//
// Buffers: AllReduceSum and Broadcast take device pointers (cudaMalloc'd or managed) and run on
// them in place. A host pointer (the CPU engine path) is staged: copied to a device scratch
// buffer, reduced there, copied back; correct but pays two PCIe copies per call, so a GPU
// runner should hand device buffers. Barrier is a one-float all-reduce.
//
// Timeouts: the communicator is non-blocking; every call polls ncclCommGetAsyncError and the
// stream until done or timeout_s, then calls ncclCommAbort and returns DeadlineExceeded (a
// NCCL error returns Unavailable/Internal with ncclGetErrorString). After a failure the
// communicator is broken and every later call returns the same error.
//
// Built when TINYSERVE_HAVE_NCCL (the CUDA toolkit's NCCL). One collective at a time.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/tp/communicator.h"

namespace tinyserve {

class TcpStoreServer;

// device: the CUDA device of this rank (-1: rank % cudaGetDeviceCount()). server: as for
// MakeGlooCommunicator (rank 0 may pass a store already listening; rendezvous port 0 then).
// Unavailable when no GPU is usable.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(
    int rank, int world, const std::string& rendezvous_addr, double timeout_s, int device = -1,
    std::unique_ptr<TcpStoreServer> server = nullptr);

}  // namespace tinyserve
