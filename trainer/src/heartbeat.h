#pragma once
// Sends the main thread's progress to the store every second, so that a rank whose collective
// times out can tell which peer is not in it (computing, writing a checkpoint, or frozen).

#include <condition_variable>
#include <mutex>
#include <thread>

#include "lockstep/common/store.h"
#include "rank_progress.h"

namespace lockstep::trainer {

class Heartbeat {
 public:
  Heartbeat(StoreClient& store, const Progress& progress);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

 private:
  void run();

  StoreClient& store_;
  const Progress& progress_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace lockstep::trainer
