#pragma once
// The collectives a data-parallel rank needs, behind one interface so that backends (Gloo on CPUs,
// NCCL on GPUs) are chosen at run time. Calls are blocking, each bounded by the timeout given at
// connection; one thread at a time may call (the reducer's thread during a step, otherwise main).

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/common/store.h"

namespace lockstep::trainer {

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int worldSize() const = 0;
  // Sums `count` floats across all ranks, in place.
  virtual Result<void> allReduceSum(float* data, std::size_t count) = 0;
  // Copies `bytes` bytes from `root` to every rank.
  virtual Result<void> broadcast(void* data, std::size_t bytes, int root) = 0;
  virtual Result<void> barrier() = 0;
  // Sums `count` floats across all ranks; after it, rank r's part of them, [parts[r], parts[r+1])
  // (parts: worldSize()+1 ascending offsets from 0 to count), holds its sum, and the rest of the
  // buffer is unspecified. A backend without a reduce-scatter of its own all-reduces (the same
  // sums, more bytes), and says so: `reduceScatters()` false.
  virtual Result<void> reduceScatterSum(float* data, std::size_t count, const std::vector<std::size_t>& parts) {
    (void)parts;
    return allReduceSum(data, count);
  }
  virtual bool reduceScatters() const { return false; }
  // Each rank's part of `data` (parts as above) to every rank. By default, each part is broadcast
  // from its rank: every rank receives the others' parts once, as in a ring all-gather.
  virtual Result<void> allGather(float* data, const std::vector<std::size_t>& parts) {
    for (int r = 0; r < worldSize(); ++r) {
      const std::size_t from = parts[static_cast<std::size_t>(r)], to = parts[static_cast<std::size_t>(r) + 1];
      if (to > from) LOCKSTEP_TRY(broadcast(data + from, (to - from) * sizeof(float), r));
    }
    return {};
  }
  // A buffer of `floats` whose ranges this communicator all-reduces in place without copying them
  // (shared memory: the peers read and write it directly), or null where it has none. It lives as
  // long as the communicator; a rank keeps its gradients there.
  virtual float* inPlaceBuffer(std::size_t /*floats*/) { return nullptr; }
  // Forgets what the backend keeps per buffer (Gloo's algorithms bound to each buffer range), once
  // those buffers are no longer reduced. Every rank calls it at the same point.
  virtual void releaseBuffers() {}
};

// `comm`'s in-place buffer of `floats` where it has one (null: none), else `fallback`, zeroed to size.
inline float* reducibleBuffer(Comm* comm, std::size_t floats, std::vector<float>& fallback) {
  if (float* inPlace = comm != nullptr ? comm->inPlaceBuffer(floats) : nullptr) return inPlace;
  fallback.assign(floats, 0.0f);
  return fallback.data();
}

struct GlooOptions {
  int rank = 0;
  int worldSize = 1;
  std::string storePrefix;  // namespaces this job's keys in the store
  std::string localHost;    // address this rank's Gloo pairs listen on
  std::chrono::milliseconds timeout{60000};
};

// Connects the full mesh through the store. The store client must outlive the call only.
Result<std::unique_ptr<Comm>> connectGloo(StoreClient& store, const GlooOptions& options);

}  // namespace lockstep::trainer
