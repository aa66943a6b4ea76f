#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/context.h>

#include <algorithm>
#include <map>

#include "comm.h"
#include "gloo_mesh.h"
#include "kernels.h"

namespace lockstep::trainer {
namespace {

// Gloo's algorithm objects with bound buffers, over pairs in synchronous mode: the calling thread
// does its own blocking socket I/O. Measured on 2 busy cores (docs/benchmarks.md), this is several
// times faster than the unbound-buffer API (gloo::allreduce), whose every transfer hops through
// Gloo's event-loop thread and a ready-to-receive handshake.
class GlooComm final : public Comm {
 public:
  explicit GlooComm(std::shared_ptr<gloo::Context> context)
      : context_(std::move(context)), sum_(gloo::SUM, &sumInto) {}

  int rank() const override { return context_->rank; }
  int worldSize() const override { return context_->size; }

  Result<void> allReduceSum(float* data, std::size_t count) override {
    return guarded("all-reduce", [&] {
      // One algorithm per buffer range, built on first use and reused: its buffers stay
      // registered with the peers. Every rank reduces the same ranges in the same order, so the
      // slots they allocate match.
      auto& algorithm = allReduces_[{data, count}];
      if (!algorithm) {
        algorithm = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(
            context_, std::vector<float*>{data}, static_cast<int>(count), &sum_);
      }
      algorithm->run();
    });
  }

  Result<void> broadcast(void* data, std::size_t bytes, int root) override {
    return guarded("broadcast", [&] {
      // Gloo counts elements in an int: send large buffers in pieces.
      constexpr std::size_t kChunk = std::size_t{1} << 30;
      auto* bytesAt = static_cast<char*>(data);
      for (std::size_t offset = 0; offset < bytes; offset += kChunk) {
        const auto n = static_cast<int>(std::min(kChunk, bytes - offset));
        gloo::BroadcastOneToAll<char> algorithm(context_, {bytesAt + offset}, n, root);
        algorithm.run();
      }
    });
  }

  void releaseBuffers() override { allReduces_.clear(); }

  Result<void> barrier() override {
    return guarded("barrier", [&] {
      gloo::BarrierAllToAll algorithm(context_);
      algorithm.run();
    });
  }

 private:
  static void sumInto(float* x, const float* y, std::size_t n) { kernels::sumFloats(x, x, y, n); }

  template <class F>
  Result<void> guarded(const char* what, F&& f) {
    try {
      f();
      return {};
    } catch (const std::exception& e) {
      return glooError(what, e);
    }
  }

  std::shared_ptr<gloo::Context> context_;  // its pairs carry the timeout of every operation
  gloo::ReductionFunction<float> sum_;
  std::map<std::pair<float*, std::size_t>, std::unique_ptr<gloo::Algorithm>> allReduces_;
};

}  // namespace

Result<std::unique_ptr<Comm>> connectGloo(StoreClient& store, const GlooOptions& options) {
  LOCKSTEP_ASSIGN_OR_RETURN(auto context, connectGlooMesh(store, options, /*synchronousPairs=*/true));
  return std::unique_ptr<Comm>(std::make_unique<GlooComm>(std::move(context)));
}

}  // namespace lockstep::trainer
