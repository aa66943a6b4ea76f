#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

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

class GlooComm final : public Comm {
 public:
  GlooComm(std::shared_ptr<gloo::Context> context, std::chrono::milliseconds timeout)
      : context_(std::move(context)), timeout_(timeout) {}

  int rank() const override { return context_->rank; }
  int worldSize() const override { return context_->size; }

  Result<void> allReduceSum(float* data, std::size_t count) override {
    return guarded("all-reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, count);
      opts.setReduceFunction(gloo::AllreduceOptions::Func(&kernels::sumFloats));
      opts.setTag(nextTag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  Result<void> broadcast(void* data, std::size_t bytes, int root) override {
    return guarded("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<std::uint8_t*>(data), bytes);
      opts.setRoot(root);
      opts.setTag(nextTag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  Result<void> barrier() override {
    return guarded("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(nextTag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  std::uint32_t nextTag() { return tag_++; }

  template <class F>
  Result<void> guarded(const char* what, F&& f) {
    try {
      f();
      return {};
    } catch (const gloo::IoException& e) {
      const std::string message = e.what();
      const bool timedOut = message.find("Timed out") != std::string::npos;
      return Error{timedOut ? ErrorCode::kTimeout : ErrorCode::kPeerLost,
                   std::string("Gloo ") + what + " failed: " + message};
    } catch (const std::exception& e) {
      return internalError(std::string("Gloo ") + what + " failed: " + e.what());
    }
  }

  std::shared_ptr<gloo::Context> context_;
  std::chrono::milliseconds timeout_;
  std::uint32_t tag_ = 0;
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
    return std::unique_ptr<Comm>(std::make_unique<GlooComm>(std::move(context), options.timeout));
  } catch (const std::exception& e) {
    return Error{ErrorCode::kUnavailable,
                 "rank " + std::to_string(options.rank) + " could not connect to its " +
                     std::to_string(options.worldSize - 1) + " peers within " +
                     std::to_string(options.timeout.count() / 1000) + " s: " + e.what() +
                     " (are all WORLD_SIZE ranks started, with the same MASTER_ADDR/MASTER_PORT?)"};
  }
}

}  // namespace lockstep::trainer
