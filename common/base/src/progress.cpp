#include "lockstep/common/progress.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "lockstep/common/clock.h"
#include "lockstep/common/fd.h"
#include "lockstep/common/files.h"

namespace lockstep::progress {
namespace {

std::string phaseText(const char (&phase)[kPhaseBytes]) {
  std::string text(phase, strnlen(phase, kPhaseBytes));
  // Written by the rank: shown to people, so printable ASCII only.
  for (char& c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  return text;
}

// A time the rank wrote, kept within 1970..2100: whatever it wrote, differences of two cannot
// overflow in the reader.
std::int64_t sane(std::int64_t unixUs) { return std::clamp<std::int64_t>(unixUs, 0, 4'102'444'800'000'000); }

Snapshot snapshotOf(const Record& r) {
  Snapshot s;
  s.step = std::max<std::int64_t>(0, r.step);
  s.stepBeganUs = sane(r.stepBeganUs);
  s.phase = phaseText(r.phase);
  s.phaseBeganUs = sane(r.phaseBeganUs);
  s.collectives = r.collectives;
  s.inCollective = (r.flags & kInCollective) != 0;
  s.collectiveBeganUs = sane(r.collectiveBeganUs);
  s.bucket = r.bucket;
  s.buckets = r.buckets;
  s.collectiveKind = r.collectiveKind;
  s.announced = (r.flags & kAnnounced) != 0;
  s.reportsSteps = (r.flags & kReportsSteps) != 0;
  // Only the real-time signals are sent: a program that never registered one is not killed by it.
  s.stackSignal = r.stackSignal >= static_cast<std::uint32_t>(SIGRTMIN) && r.stackSignal <= static_cast<std::uint32_t>(SIGRTMAX)
                      ? static_cast<int>(r.stackSignal)
                      : 0;
  s.pid = r.pid;
  return s;
}

void copyPhase(char (&to)[kPhaseBytes], std::string_view phase) {
  const std::size_t n = std::min(phase.size(), kPhaseBytes - 1);
  std::memcpy(to, phase.data(), n);
  std::memset(to + n, 0, kPhaseBytes - n);
}

}  // namespace

Result<void> create(const std::string& path) {
  // A new file, never one a rank left there (a link to another file, say): it writes this directory.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ioError("cannot replace " + path + ": " + std::strerror(errno));
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd.valid()) return ioError("cannot create " + path + ": " + std::strerror(errno));
  const Record empty{};
  if (::pwrite(fd.get(), &empty, sizeof empty, 0) != static_cast<ssize_t>(sizeof empty)) {
    return ioError("cannot write " + path + ": " + std::strerror(errno));
  }
  return {};
}

Result<Snapshot> read(const std::string& path) {
  auto opened = openRegularFile(path, "the rank's progress record", O_RDONLY | O_NOFOLLOW);
  if (!opened) return opened.error();
  UniqueFd fd(*opened);
  for (int attempt = 0; attempt < 50; ++attempt) {
    Record r;
    if (::pread(fd.get(), &r, sizeof r, 0) != static_cast<ssize_t>(sizeof r)) {
      return invalidArgument(path + " is not a progress record (shorter than " + std::to_string(kBytes) + " bytes)");
    }
    if (r.magic == 0) return notFound(path + ": the rank has not written its progress yet");
    if (r.magic != kMagic || r.version != kVersion) return invalidArgument(path + " is not a version 1 progress record");
    std::uint64_t after = 0;
    if (::pread(fd.get(), &after, sizeof after, offsetof(Record, sequence)) != sizeof after) break;
    if (r.sequence % 2 == 0 && after == r.sequence) return snapshotOf(r);
    std::this_thread::yield();
  }
  return unavailable(path + ": the rank was writing its progress on every read");
}

Writer Writer::fromEnvironment() {
  const char* path = std::getenv(kEnv);
  return path != nullptr && *path != '\0' ? Writer(path) : Writer();
}

Writer::Writer(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return;
  if (::ftruncate(fd.get(), kBytes) != 0) return;
  void* mapped = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapped == MAP_FAILED) return;
  record_ = static_cast<Record*>(mapped);
  write([](Record& r) {
    r.magic = kMagic;
    r.version = kVersion;
    r.pid = static_cast<std::int32_t>(::getpid());
    r.phaseBeganUs = r.stepBeganUs = unixMicrosNow();
    copyPhase(r.phase, "start-up");
  });
}

Writer::~Writer() {
  if (record_ != nullptr) ::munmap(record_, kBytes);
}

Writer::Writer(Writer&& other) noexcept : record_(std::exchange(other.record_, nullptr)) {}

Writer& Writer::operator=(Writer&& other) noexcept {
  if (this != &other) {
    if (record_ != nullptr) ::munmap(record_, kBytes);
    record_ = std::exchange(other.record_, nullptr);
  }
  return *this;
}

template <typename F>
void Writer::write(F&& change) {
  if (record_ == nullptr) return;
  while (busy_.test_and_set(std::memory_order_acquire)) {
  }
  auto& sequence = *reinterpret_cast<std::atomic<std::uint64_t>*>(&record_->sequence);
  const std::uint64_t s = sequence.load(std::memory_order_relaxed);
  sequence.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  change(*record_);
  sequence.store(s + 2, std::memory_order_release);
  busy_.clear(std::memory_order_release);
}

void Writer::stepDone(std::int64_t step, std::string_view phase) {
  const std::int64_t now = unixMicrosNow();
  write([&](Record& r) {
    r.step = step;
    r.stepBeganUs = r.phaseBeganUs = now;
    r.flags = (r.flags | kReportsSteps) & ~static_cast<std::uint32_t>(kAnnounced);
    copyPhase(r.phase, phase);
  });
}

void Writer::phase(std::string_view phase, bool announced) {
  const std::int64_t now = unixMicrosNow();
  write([&](Record& r) {
    r.phaseBeganUs = now;
    r.flags = announced ? (r.flags | kAnnounced) : (r.flags & ~static_cast<std::uint32_t>(kAnnounced));
    copyPhase(r.phase, phase);
  });
}

void Writer::collectiveBegin(std::uint32_t bucket, std::uint32_t buckets, std::uint32_t kind) {
  const std::int64_t now = unixMicrosNow();
  write([&](Record& r) {
    ++r.collectives;
    r.collectiveBeganUs = now;
    r.bucket = bucket;
    r.buckets = buckets;
    r.collectiveKind = kind;
    r.flags |= kInCollective;
  });
}

void Writer::collectiveEnd() {
  write([&](Record& r) {
    r.collectiveBeganUs = 0;
    r.flags &= ~static_cast<std::uint32_t>(kInCollective);
  });
}

}  // namespace lockstep::progress
