#include "shm_comm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>

#include "kernels.h"

namespace lockstep::trainer {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kPage = 4096;

std::size_t roundUp(std::size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

// The segment's first bytes: the barrier counter, then each rank's pid (for its peers to watch).
struct alignas(64) Header {
  std::atomic<std::uint32_t> arrived{0};  // every rank's arrivals at a barrier, ever
};
constexpr std::size_t kPieceFloats = 4096;  // 16 KiB: a piece's sums are still in L1 to be copied
constexpr auto kPeerCheck = std::chrono::milliseconds(50);  // how often a wait looks for dead peers

std::int32_t* pidsOf(void* segment) { return reinterpret_cast<std::int32_t*>(static_cast<char*>(segment) + sizeof(Header)); }
std::size_t headerBytes(int world) { return roundUp(sizeof(Header) + sizeof(std::int32_t) * static_cast<std::size_t>(world)); }
// All-reduces of other buffers (the ranks' agreements, a rebalance) are small; they are copied
// through slots of at most this many floats.
constexpr std::size_t kMostStagingFloats = std::size_t{1} << 18;
std::size_t stagingFloats(std::size_t capacity) { return std::min(capacity, kMostStagingFloats); }
std::size_t segmentBytes(int world, std::size_t capacity) {
  const auto n = static_cast<std::size_t>(world);
  return headerBytes(world) + n * roundUp(capacity * sizeof(float)) + (n + 1) * roundUp(stagingFloats(capacity) * sizeof(float));
}
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && sizeof(std::atomic<std::uint32_t>) == 4);


std::string randomName() {
  std::random_device random;
  char name[40];
  std::snprintf(name, sizeof name, "/lockstep-comm-%08x%08x", random(), random());
  return name;
}

class ShmComm final : public Comm {
 public:
  ShmComm(std::unique_ptr<Comm> gloo, void* segment, std::size_t bytes, std::size_t capacity,
          std::chrono::milliseconds timeout)
      : gloo_(std::move(gloo)), segment_(segment), bytes_(bytes), capacity_(capacity),
        stagingFloats_(stagingFloats(capacity)), timeout_(timeout), header_(static_cast<Header*>(segment)) {
    // Watch every peer's process: a rank killed mid-run is seen at once, not at the timeout.
    for (int r = 0; r < worldSize(); ++r) {
      if (r == rank()) continue;
      const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pidsOf(segment_)[r], 0));
      if (fd >= 0) peers_.push_back({fd, r});
    }
  }
  ~ShmComm() override {
    for (const auto& p : peers_) ::close(p.fd);
    ::munmap(segment_, bytes_);
  }

  int rank() const override { return gloo_->rank(); }
  int worldSize() const override { return gloo_->worldSize(); }
  Result<void> broadcast(void* data, std::size_t bytes, int root) override { return gloo_->broadcast(data, bytes, root); }
  Result<void> barrier() override { return gloo_->barrier(); }
  void releaseBuffers() override { gloo_->releaseBuffers(); }

  float* inPlaceBuffer(std::size_t floats) override { return floats <= capacity_ ? own(rank()) : nullptr; }

  // In place only (the gradients): rank r sums its part over every rank's buffer, in rank order
  // as the all-reduce does, and writes it to its own buffer alone.
  Result<void> reduceScatterSum(float* data, std::size_t count, const std::vector<std::size_t>& parts) override {
    const auto r = static_cast<std::size_t>(rank());
    if (!(data >= own(r) && data + count <= own(r) + capacity_)) return allReduceSum(data, count);
    const std::size_t at = static_cast<std::size_t>(data - own(r)), lo = at + parts[r], hi = at + parts[r + 1];
    LOCKSTEP_TRY(arriveAndWait());
    for (std::size_t from = lo; from < hi; from += kPieceFloats) {
      const std::size_t floats = std::min(kPieceFloats, hi - from);
      sumInRankOrder(piece_.data(), [&](std::size_t k) { return own(k) + from; }, floats);
      std::memcpy(own(r) + from, piece_.data(), floats * sizeof(float));
    }
    // No rank may write its buffer again (the next backward) while another still reads it.
    return arriveAndWait();
  }
  bool reduceScatters() const override { return true; }

  // Through the sums' slot, a slot's worth at a time: each rank writes its part there, then
  // every rank copies the others'.
  Result<void> allGather(float* data, const std::vector<std::size_t>& parts) override {
    const auto r = static_cast<std::size_t>(rank());
    const std::size_t count = parts.back();
    float* shared = staging(static_cast<std::size_t>(worldSize()));
    for (std::size_t at = 0; at < count; at += stagingFloats_) {
      const std::size_t end = std::min(count, at + stagingFloats_);
      const std::size_t lo = std::clamp(parts[r], at, end), hi = std::clamp(parts[r + 1], at, end);
      std::memcpy(shared + (lo - at), data + lo, (hi - lo) * sizeof(float));
      LOCKSTEP_TRY(arriveAndWait());
      std::memcpy(data + at, shared, (lo - at) * sizeof(float));
      std::memcpy(data + hi, shared + (hi - at), (end - hi) * sizeof(float));
      LOCKSTEP_TRY(arriveAndWait());
    }
    return {};
  }

  Result<void> allReduceSum(float* data, std::size_t count) override {
    const auto n = static_cast<std::size_t>(worldSize()), r = static_cast<std::size_t>(rank());
    // This rank's share of the range, summed over every rank's copy in rank order: the same sum
    // on every rank, whichever computes it.
    const std::size_t lo = count * r / n, hi = count * (r + 1) / n;
    if (data >= own(r) && data + count <= own(r) + capacity_) {
      // In place: every rank's range sits at the same offset of its own buffer. The share's sum
      // is written to every rank's buffer, so nothing is copied in or out.
      // A piece at a time, so that the copies read the sums from the cache.
      const std::size_t at = static_cast<std::size_t>(data - own(r)) + lo;
      LOCKSTEP_TRY(arriveAndWait());
      for (std::size_t from = at; from < at + (hi - lo); from += kPieceFloats) {
        const std::size_t floats = std::min(kPieceFloats, at + (hi - lo) - from);
        sumInRankOrder(own(0) + from, [&](std::size_t k) { return own(k) + from; }, floats);
        for (std::size_t other = 1; other < n; ++other) std::memcpy(own(other) + from, own(0) + from, floats * sizeof(float));
      }
      return arriveAndWait();
    }
    if (count > stagingFloats_) return gloo_->allReduceSum(data, count);
    std::memcpy(staging(r), data, count * sizeof(float));
    LOCKSTEP_TRY(arriveAndWait());
    sumInRankOrder(staging(n) + lo, [&](std::size_t k) { return staging(k) + lo; }, hi - lo);
    LOCKSTEP_TRY(arriveAndWait());
    std::memcpy(data, staging(n), count * sizeof(float));
    // No rank may write the sums' slot again (the next collective: an all-gather uses it too)
    // while another still copies from it.
    return arriveAndWait();
  }

 private:
  // into = part(0) + part(1) + ... + part(n-1), added in that order (`into` may be part(0)).
  template <typename Part>
  void sumInRankOrder(float* into, Part part, std::size_t floats) const {
    kernels::sumFloats(into, part(0), part(1), floats);
    for (std::size_t k = 2; k < static_cast<std::size_t>(worldSize()); ++k) kernels::sumFloats(into, into, part(k), floats);
  }

  // Rank k's in-place buffer, then the copies' slots: one per rank and one for the sums.
  float* own(std::size_t k) const {
    return reinterpret_cast<float*>(static_cast<char*>(segment_) + headerBytes(worldSize()) + k * roundUp(capacity_ * sizeof(float)));
  }
  float* staging(std::size_t k) const {
    return reinterpret_cast<float*>(reinterpret_cast<char*>(own(static_cast<std::size_t>(worldSize()))) +
                                    k * roundUp(stagingFloats_ * sizeof(float)));
  }

  // A peer whose process ended, or -1.
  int lostPeer() const {
    std::vector<pollfd> fds;
    for (const auto& p : peers_) fds.push_back({p.fd, POLLIN, 0});
    if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return -1;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) return peers_[i].rank;
    }
    return -1;
  }
  // A barrier: the counter reaches this barrier's share of arrivals. Waiting blocks on a futex.
  Result<void> arriveAndWait() {
    const std::uint32_t target = (++barriers_) * static_cast<std::uint32_t>(worldSize());
    auto& arrived = header_->arrived;
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == target) {
      ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&arrived), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
      return {};
    }
    const auto deadline = Clock::now() + timeout_;
    for (std::uint32_t now; static_cast<std::int32_t>((now = arrived.load(std::memory_order_acquire)) - target) < 0;) {
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) {
        return Error{ErrorCode::kTimeout, "shared-memory all-reduce: a peer did not arrive within " +
                                              std::to_string(timeout_.count() / 1000) + " s"};
      }
      if (const int lost = lostPeer(); lost >= 0) {
        return Error{ErrorCode::kPeerLost, "shared-memory all-reduce: rank " + std::to_string(lost) + "'s process ended"};
      }
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::min<Clock::duration>(left, kPeerCheck)).count();
      timespec wait{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&arrived), FUTEX_WAIT, now, &wait, nullptr, 0);
    }
    return {};
  }

  std::unique_ptr<Comm> gloo_;
  void* segment_;
  std::size_t bytes_;
  std::size_t capacity_;       // floats of each rank's in-place buffer
  std::size_t stagingFloats_;  // the most a copied all-reduce takes; Gloo takes larger ones
  std::chrono::milliseconds timeout_;
  Header* header_;
  std::uint32_t barriers_ = 0;
  struct Peer {
    int fd;
    int rank;
  };
  std::vector<Peer> peers_;  // pidfds of the other ranks' processes
  std::vector<float> piece_ = std::vector<float>(kPieceFloats);  // a reduce-scatter's sums, a piece at a time
};

// Rank 0 makes the segment and publishes its name; the others open it. Empty on failure.
void* openSegment(int rank, StoreClient& store, const std::string& key, std::size_t bytes,
                  std::chrono::milliseconds timeout, std::string& name) {
  int fd = -1;
  if (rank == 0) {
    name = randomName();
    fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    // Its pages are taken now: a /dev/shm too small for them refuses here (and the job keeps to
    // Gloo), rather than failing a write mid-step with SIGBUS. The pages start zeroed.
    if (fd >= 0 && (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 || ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) != 0)) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      fd = -1;
    }
    (void)store.set(key, fd >= 0 ? name : "");
  } else if (auto published = store.get(key, timeout); published && !published->empty()) {
    name = *published;
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  }
  if (fd < 0) return nullptr;
  void* segment = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return segment == MAP_FAILED ? nullptr : segment;
}

}  // namespace

Result<std::unique_ptr<Comm>> connectSharedMemory(std::unique_ptr<Comm> gloo, StoreClient& store,
                                                  const std::string& keyPrefix, std::size_t capacityFloats,
                                                  std::chrono::milliseconds timeout) {
  const int rank = gloo->rank(), world = gloo->worldSize();
  const std::size_t bytes = segmentBytes(world, capacityFloats);
  std::string name;
  void* segment = openSegment(rank, store, keyPrefix + "segment", bytes, timeout, name);
  // The segment starts zeroed (ftruncate): the counter is 0; each rank writes its own pid.
  if (segment != nullptr) pidsOf(segment)[rank] = static_cast<std::int32_t>(::getpid());
  // Every rank has it, or none uses it: a rank that could not open it must not be waited for.
  std::vector<float> opened = {segment != nullptr ? 1.0f : 0.0f};
  auto agreed = gloo->allReduceSum(opened.data(), opened.size());
  gloo->releaseBuffers();
  if (rank == 0 && !name.empty()) ::shm_unlink(name.c_str());
  if (!agreed) {
    if (segment != nullptr) ::munmap(segment, bytes);
    return agreed.error();
  }
  if (opened[0] < static_cast<float>(world)) {
    if (segment != nullptr) ::munmap(segment, bytes);
    return gloo;  // Gloo it is, on every rank alike
  }
  return std::unique_ptr<Comm>(std::make_unique<ShmComm>(std::move(gloo), segment, bytes, capacityFloats, timeout));
}

}  // namespace lockstep::trainer
