#pragma once
// NCCL between the ranks' GPUs. As a Comm it serves the trainer's host-side collectives (start-up
// broadcasts, the final barrier) through a device staging buffer; the GPU training loop uses its
// stream and allReduceAsync to reduce gradient buckets without the host waiting.
//
// Rendezvous through the job's store: rank 0 makes the unique id and publishes it, the others read
// it. A dead or stuck peer must not hang the job: wait() polls the communicator's asynchronous
// error and aborts it when the job's timeout passes.

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <vector>

#include "comm.h"
#include "lockstep/common/store.h"

namespace lockstep::trainer::gpu {

class NcclComm final : public Comm {
 public:
  // store may be null for a world of one (no rendezvous).
  static Result<std::unique_ptr<NcclComm>> connect(StoreClient* store, const std::string& keyPrefix, int rank,
                                                   int worldSize, std::chrono::milliseconds timeout);
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int worldSize() const override { return worldSize_; }
  Result<void> allReduceSum(float* hostData, std::size_t count) override;
  Result<void> broadcast(void* hostData, std::size_t bytes, int root) override;
  Result<void> barrier() override;

  cudaStream_t stream() const { return stream_; }
  // Enqueues in-place sums of device ranges on stream(), in one NCCL group.
  struct Range {
    float* data;
    std::size_t count;
  };
  Result<void> allReduceAsync(const Range* ranges, std::size_t n);
  // A device range split among the ranks (--shard, shard.h): rank r owns data[cuts[r], cuts[r+1]).
  struct Split {
    float* data;
    std::vector<std::size_t> cuts;  // worldSize + 1, from 0 to the range's length
  };
  // Enqueues on stream(), in one NCCL group: each part summed onto its owner, in place there (the
  // others' copies keep their own values); a reduce-scatter of uneven parts.
  Result<void> reduceToOwnersAsync(const Split& split);
  // Each owner's part sent to every rank, in place; an all-gather of uneven parts.
  Result<void> broadcastFromOwnersAsync(const Split& split);

  // Waits for `event` (recorded on any stream), polling for NCCL errors; past the timeout, aborts
  // the communicator and fails (Timeout), naming nobody: the caller asks the store who is gone.
  Result<void> wait(cudaEvent_t event);
  // Ends the communicator and its kernels in flight: after an error, before anything waits on them.
  void abort();
  bool aborted() const { return aborted_; }

 private:
  NcclComm() = default;
  Result<void> sync();  // waits for stream_
  // One NCCL group over the split's non-empty parts: `call(part, count, owner)` enqueues one.
  template <class Call>
  Result<void> perOwner(const Split& split, const char* what, Call call);
  Result<void> ensureStaging(std::size_t bytes);
  Result<void> settle(ncclResult_t r, const char* what);

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* staging_ = nullptr;
  void* pinned_ = nullptr;
  std::size_t stagingBytes_ = 0;
  int rank_ = 0, worldSize_ = 1;
  std::chrono::milliseconds timeout_{60000};
  bool aborted_ = false;
};

// The device this rank uses: 0 when the agent (or the user) set CUDA_VISIBLE_DEVICES to its GPU,
// else the local rank among the visible devices. Fails when there is no usable GPU, saying so.
Result<int> pickDevice(std::uint32_t localRank);

}  // namespace lockstep::trainer::gpu
