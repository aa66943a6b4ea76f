#pragma once
// Work the agent's event loop must not wait for (a path check on a hung file system, a rank's
// stacks), each piece on a detached thread of its own, at most `maxInFlight` at once. A finished
// piece's result waits with its id until take(); an eventfd the loop polls says one finished.
// Threads still running when the owner goes keep the shared state alive and finish alone, their
// results dropped. Preflight (preflight.h) and EvidenceTaker (evidence.h) are built on it.
//
// Not thread-safe: the event loop calls it; the work runs elsewhere.

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "lockstep/common/fd.h"
#include "lockstep/common/result.h"

namespace lockstep::agent {

template <class T>
class OffLoop {
 public:
  struct Done {
    std::uint64_t id;
    T result;
  };

  explicit OffLoop(std::size_t maxInFlight) : maxInFlight_(maxInFlight), shared_(std::make_shared<Shared>()) {}

  int wakeFd() const { return shared_->wake.get(); }
  // Threads not yet finished, abandoned ones included.
  std::size_t running() const { return shared_->running.load(); }

  // Starts `work` on a thread; `busy` is the error when maxInFlight pieces run already, `what`
  // names the work when no thread can be made.
  Result<void> submit(std::uint64_t id, std::function<T()> work, const Error& busy, const std::string& what) {
    if (shared_->running.load() >= maxInFlight_) return busy;
    ++shared_->running;
    try {
      std::thread([shared = shared_, id, work = std::move(work)] {
        T result = work();
        {
          std::lock_guard lock(shared->mutex);
          shared->finished.push_back(Done{id, std::move(result)});
        }
        const std::uint64_t one = 1;
        [[maybe_unused]] const ssize_t n = ::write(shared->wake.get(), &one, sizeof one);
        --shared->running;
      }).detach();
    } catch (const std::system_error& e) {
      --shared_->running;
      return Error{ErrorCode::kResourceExhausted, "cannot start a thread to " + what + ": " + e.what()};
    }
    return {};
  }

  // What finished since the last call (and clears the eventfd).
  std::vector<Done> take() {
    std::uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = ::read(shared_->wake.get(), &count, sizeof count);
    std::vector<Done> out;
    std::lock_guard lock(shared_->mutex);
    out.swap(shared_->finished);
    return out;
  }

 private:
  struct Shared {
    std::mutex mutex;
    std::vector<Done> finished;
    UniqueFd wake{::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
    std::atomic<std::size_t> running{0};
  };
  std::size_t maxInFlight_;
  std::shared_ptr<Shared> shared_;
};

// What the loop keeps of a piece of work it submitted, taken out of `pending` by the piece's id;
// nothing for a piece no longer waited for.
template <class Map>
std::optional<typename Map::mapped_type> takePending(Map& pending, const typename Map::key_type& id) {
  auto it = pending.find(id);
  if (it == pending.end()) return std::nullopt;
  std::optional<typename Map::mapped_type> out(std::move(it->second));
  pending.erase(it);
  return out;
}

}  // namespace lockstep::agent
