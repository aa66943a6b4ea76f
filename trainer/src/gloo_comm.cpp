#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <map>

#include "comm.h"
#include "kernels.h"

namespace lockstep::trainer {
namespace {

// Gloo's rendezvous talks to our TCP store through this adapter; Gloo expects exceptions.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(StoreClient& client, std::string prefix, std::chrono::milliseconds timeout)
      : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    check(client_.set(prefix_ + key, std::string(data.begin(), data.end())));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = client_.get(prefix_ + key, timeout_);
    check(value);
    return {value->begin(), value->end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& key : keys) check(client_.get(prefix_ + key, timeout));
  }

 private:
  template <class R>
  static void check(const R& r) {
    if (!r) throw gloo::IoException(r.error().message);
  }

  StoreClient& client_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

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
    } catch (const gloo::IoException& e) {
      const std::string message = e.what();
      const bool timedOut = message.find("imeout") != std::string::npos || message.find("imed out") != std::string::npos;
      return Error{timedOut ? ErrorCode::kTimeout : ErrorCode::kPeerLost,
                   std::string("Gloo ") + what + " failed: " + message};
    } catch (const std::exception& e) {
      return internalError(std::string("Gloo ") + what + " failed: " + e.what());
    }
  }

  std::shared_ptr<gloo::Context> context_;  // its pairs carry the timeout of every operation
  gloo::ReductionFunction<float> sum_;
  std::map<std::pair<float*, std::size_t>, std::unique_ptr<gloo::Algorithm>> allReduces_;
};

}  // namespace

Result<std::unique_ptr<Comm>> connectGloo(StoreClient& store, const GlooOptions& options) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.localHost;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.worldSize);
    context->setTimeout(options.timeout);
    GlooStore adapter(store, options.storePrefix, options.timeout);
    context->connectFullMesh(adapter, device);
    for (int peer = 0; peer < options.worldSize; ++peer) {
      if (peer != options.rank) context->getPair(peer)->setSync(true, /*busyPoll=*/false);
    }
    return std::unique_ptr<Comm>(std::make_unique<GlooComm>(std::move(context)));
  } catch (const std::exception& e) {
    return Error{ErrorCode::kUnavailable,
                 "rank " + std::to_string(options.rank) + " could not connect to its " +
                     std::to_string(options.worldSize - 1) + " peers within " +
                     std::to_string(options.timeout.count() / 1000) + " s: " + e.what() +
                     " (are all WORLD_SIZE ranks started, with the same MASTER_ADDR/MASTER_PORT?)"};
  }
}

}  // namespace lockstep::trainer
