#include "gloo_mesh.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

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

}  // namespace

Result<std::shared_ptr<gloo::Context>> connectGlooMesh(StoreClient& store, const GlooOptions& options, bool synchronousPairs) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.localHost;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(options.rank, options.worldSize);
    context->setTimeout(options.timeout);
    GlooStore adapter(store, options.storePrefix, options.timeout);
    context->connectFullMesh(adapter, device);
    for (int peer = 0; synchronousPairs && peer < options.worldSize; ++peer) {
      if (peer != options.rank) context->getPair(peer)->setSync(true, /*busyPoll=*/false);
    }
    return std::shared_ptr<gloo::Context>(std::move(context));
  } catch (const std::exception& e) {
    return Error{ErrorCode::kUnavailable,
                 "rank " + std::to_string(options.rank) + " could not connect to its " +
                     std::to_string(options.worldSize - 1) + " peers within " +
                     std::to_string(options.timeout.count() / 1000) + " s: " + e.what() +
                     " (are all WORLD_SIZE ranks started, with the same MASTER_ADDR/MASTER_PORT?)"};
  }
}

Error glooError(const char* what, const std::exception& e) {
  const std::string message = e.what();
  if (dynamic_cast<const gloo::IoException*>(&e) == nullptr) return internalError(std::string("Gloo ") + what + " failed: " + message);
  const bool timedOut = message.find("imeout") != std::string::npos || message.find("imed out") != std::string::npos;
  return Error{timedOut ? ErrorCode::kTimeout : ErrorCode::kPeerLost, std::string("Gloo ") + what + " failed: " + message};
}

}  // namespace lockstep::trainer
