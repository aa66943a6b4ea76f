#include "nccl_comm.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "cuda_check.h"

namespace lockstep::trainer::gpu {
namespace {

using Clock = std::chrono::steady_clock;

std::string hex(const void* data, std::size_t bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

bool unhex(const std::string& text, void* data, std::size_t bytes) {
  if (text.size() != 2 * bytes) return false;
  auto* p = static_cast<unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    const auto nibble = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    p[i] = static_cast<unsigned char>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
  }
  return true;
}

}  // namespace

Result<int> pickDevice(std::uint32_t localRank) {
  int count = 0;
  LOCKSTEP_TRY(gpuLibraries());
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    return Error{ErrorCode::kFailedPrecondition,
                 std::string("--backend cuda needs an NVIDIA GPU and its driver, and this machine offers none (") +
                     (e != cudaSuccess ? cudaGetErrorString(e) : "no device") + "); use --backend cpu"};
  }
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible != nullptr && *visible != '\0') return 0;  // this rank's GPU, as the agent chose it
  return static_cast<int>(localRank % static_cast<std::uint32_t>(count));
}

Result<std::unique_ptr<NcclComm>> NcclComm::connect(StoreClient* store, const std::string& keyPrefix, int rank,
                                                    int worldSize, std::chrono::milliseconds timeout) {
  std::unique_ptr<NcclComm> c(new NcclComm());
  c->rank_ = rank;
  c->worldSize_ = worldSize;
  c->timeout_ = timeout;
  ncclUniqueId id{};
  if (rank == 0) {
    LOCKSTEP_NCCL(ncclGetUniqueId(&id));
    if (store) LOCKSTEP_TRY(store->set(keyPrefix + "nccl-id", hex(&id, sizeof id)));
  } else {
    if (!store) return Error{ErrorCode::kInternal, "NCCL rendezvous needs the job's store"};
    LOCKSTEP_ASSIGN_OR_RETURN(const std::string text, store->get(keyPrefix + "nccl-id", timeout));
    if (!unhex(text, &id, sizeof id)) return Error{ErrorCode::kInternal, "the store holds a malformed NCCL id"};
  }
  LOCKSTEP_CUDA(cudaStreamCreateWithFlags(&c->stream_, cudaStreamNonBlocking));
  LOCKSTEP_CUDA(cudaEventCreateWithFlags(&c->done_, cudaEventDisableTiming));
  // Non-blocking: initialisation and collectives return at once, and a dead peer shows up as an
  // asynchronous error that wait() sees, instead of a call that never returns.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c->comm_, worldSize, id, rank, &config);
  const auto deadline = Clock::now() + timeout;
  while (r == ncclInProgress || (r == ncclSuccess && c->comm_ != nullptr)) {
    ncclResult_t state = ncclSuccess;
    LOCKSTEP_NCCL(ncclCommGetAsyncError(c->comm_, &state));
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      c->abort();  // a communicator in error is aborted, not destroyed
      return ncclError(state, "ncclCommInitRankConfig");
    }
    if (Clock::now() > deadline) {
      c->abort();
      return timeoutError("NCCL did not connect all " + std::to_string(worldSize) + " ranks within " +
                          std::to_string(timeout.count() / 1000) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    c->abort();
    return ncclError(r, "ncclCommInitRankConfig");
  }
  return c;
}

NcclComm::~NcclComm() {
  if (comm_ && !aborted_) {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
  if (staging_) cudaFree(staging_);
  if (pinned_) cudaFreeHost(pinned_);
  if (done_) cudaEventDestroy(done_);
  if (stream_) cudaStreamDestroy(stream_);
}

void NcclComm::abort() {
  if (comm_ && !aborted_) ncclCommAbort(comm_);
  aborted_ = true;
}

Result<void> NcclComm::wait(cudaEvent_t event) {
  const auto deadline = Clock::now() + timeout_;
  for (int spins = 0;; ++spins) {
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return {};
    if (e != cudaErrorNotReady) return cudaError(e, "waiting for the GPU");
    (void)cudaGetLastError();  // "not ready" sticks as the last error and would fail the next launch check
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      abort();
      return ncclError(state, "NCCL all-reduce");
    }
    if (Clock::now() > deadline) {
      abort();
      return timeoutError("a GPU collective did not finish within " + std::to_string(timeout_.count() / 1000) + " s");
    }
    // Spin briefly (a step's tail is short), then yield the core.
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

Result<void> NcclComm::sync() {
  LOCKSTEP_CUDA(cudaEventRecord(done_, stream_));
  return wait(done_);
}

// A non-blocking communicator's call may return ncclInProgress while NCCL still connects and
// enqueues the kernel from a thread of its own: wait until it has (the next call would be refused
// before), bounded by the timeout.
Result<void> NcclComm::settle(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return {};
  if (r != ncclInProgress) return ncclError(r, what);
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state == ncclSuccess) return {};
    if (state != ncclInProgress) {
      abort();
      return ncclError(state, what);
    }
    if (Clock::now() > deadline) {
      abort();
      return timeoutError(std::string(what) + " did not start within " + std::to_string(timeout_.count() / 1000) + " s");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

Result<void> NcclComm::allReduceAsync(const Range* ranges, std::size_t n) {
  LOCKSTEP_NCCL(ncclGroupStart());
  for (std::size_t i = 0; i < n; ++i) {
    const ncclResult_t r = ncclAllReduce(ranges[i].data, ranges[i].data, ranges[i].count, ncclFloat, ncclSum, comm_, stream_);
    if (r != ncclSuccess && r != ncclInProgress) {
      ncclGroupEnd();
      return ncclError(r, "ncclAllReduce");
    }
  }
  return settle(ncclGroupEnd(), "ncclGroupEnd");
}

template <class Call>
Result<void> NcclComm::perOwner(const Split& split, const char* what, Call call) {
  LOCKSTEP_NCCL(ncclGroupStart());
  for (int owner = 0; owner + 1 < static_cast<int>(split.cuts.size()); ++owner) {
    const std::size_t begin = split.cuts[static_cast<std::size_t>(owner)];
    const std::size_t count = split.cuts[static_cast<std::size_t>(owner) + 1] - begin;
    if (count == 0) continue;  // every rank skips the same parts
    const ncclResult_t r = call(split.data + begin, count, owner);
    if (r != ncclSuccess && r != ncclInProgress) {
      ncclGroupEnd();
      return ncclError(r, what);
    }
  }
  return settle(ncclGroupEnd(), "ncclGroupEnd");
}

Result<void> NcclComm::reduceToOwnersAsync(const Split& split) {
  return perOwner(split, "ncclReduce", [&](float* part, std::size_t count, int owner) {
    return ncclReduce(part, part, count, ncclFloat, ncclSum, owner, comm_, stream_);
  });
}

Result<void> NcclComm::broadcastFromOwnersAsync(const Split& split) {
  return perOwner(split, "ncclBroadcast", [&](float* part, std::size_t count, int owner) {
    return ncclBroadcast(part, part, count, ncclFloat, owner, comm_, stream_);
  });
}

// A device buffer and a pinned host one: copies from pinned memory are asynchronous, so a peer
// that died mid-collective shows up in wait() (with its timeout), not in a copy that never returns.
Result<void> NcclComm::ensureStaging(std::size_t bytes) {
  if (bytes <= stagingBytes_) return {};
  if (staging_) cudaFree(staging_);
  if (pinned_) cudaFreeHost(pinned_);
  staging_ = pinned_ = nullptr;
  stagingBytes_ = 0;
  LOCKSTEP_CUDA(cudaMalloc(&staging_, bytes));
  LOCKSTEP_CUDA(cudaMallocHost(&pinned_, bytes));
  stagingBytes_ = bytes;
  return {};
}

Result<void> NcclComm::allReduceSum(float* hostData, std::size_t count) {
  const std::size_t bytes = count * sizeof(float);
  LOCKSTEP_TRY(ensureStaging(bytes));
  std::memcpy(pinned_, hostData, bytes);
  LOCKSTEP_CUDA(cudaMemcpyAsync(staging_, pinned_, bytes, cudaMemcpyHostToDevice, stream_));
  const Range range{static_cast<float*>(staging_), count};
  LOCKSTEP_TRY(allReduceAsync(&range, 1));
  LOCKSTEP_CUDA(cudaMemcpyAsync(pinned_, staging_, bytes, cudaMemcpyDeviceToHost, stream_));
  LOCKSTEP_TRY(sync());
  std::memcpy(hostData, pinned_, bytes);
  return {};
}

Result<void> NcclComm::broadcast(void* hostData, std::size_t bytes, int root) {
  LOCKSTEP_TRY(ensureStaging(bytes));
  std::memcpy(pinned_, hostData, bytes);
  LOCKSTEP_CUDA(cudaMemcpyAsync(staging_, pinned_, bytes, cudaMemcpyHostToDevice, stream_));
  LOCKSTEP_TRY(settle(ncclBroadcast(staging_, staging_, bytes, ncclChar, root, comm_, stream_), "ncclBroadcast"));
  LOCKSTEP_CUDA(cudaMemcpyAsync(pinned_, staging_, bytes, cudaMemcpyDeviceToHost, stream_));
  LOCKSTEP_TRY(sync());
  std::memcpy(hostData, pinned_, bytes);
  return {};
}

Result<void> NcclComm::barrier() {
  float one = 1.0f;
  return allReduceSum(&one, 1);
}

}  // namespace lockstep::trainer::gpu
