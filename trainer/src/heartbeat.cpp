#include "heartbeat.h"

namespace lockstep::trainer {
namespace {

constexpr auto kHeartbeatInterval = std::chrono::seconds(1);

}  // namespace

Heartbeat::Heartbeat(StoreClient& store, const Progress& progress) : store_(store), progress_(progress) {
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Heartbeat::run() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, kHeartbeatInterval, [this] { return stop_; })) {
    lock.unlock();
    // A failed heartbeat is not fatal: the collectives detect lost peers, this only explains them.
    (void)store_.heartbeat(progress_.step(), progress_.phase(), progress_.millisInPhase());
    lock.lock();
  }
}

}  // namespace lockstep::trainer
