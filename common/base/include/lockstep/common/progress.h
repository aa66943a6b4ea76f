#pragma once
// A rank's progress record: 128 bytes in a file of its job's directory (LOCKSTEP_PROGRESS) that
// the rank maps and writes, and its agent reads, also while the rank is stuck or after it died.
// Writing costs no system call (the clock is the vDSO's); the agent never maps the file (a rank
// could truncate it under the mapping), it reads it.
//
// Layout (little-endian, version 1), which python/lockstep/_progress.py writes too:
//
//   0 u32 magic "LSPR"            56 u32 bucket (1-based; 0: none)
//   4 u32 version                 60 u32 buckets
//   8 u64 sequence (odd: writing) 64 u32 stack signal (0: none; the signal that dumps stacks)
//  16 i64 last completed step     68 u32 flags (kAnnounced, kInCollective, kReportsSteps)
//  24 i64 step began (unix µs)    72 char[32] phase, NUL-padded
//  32 i64 phase began (unix µs)  104 i32 pid
//  40 u64 collectives entered    108 u32 collective kind (lockstep.proto's CollectiveKind; 0: not said)
//                                112..127 reserved (0)
//  48 i64 collective began (unix µs; 0 outside one)
//
// A seqlock: the writer makes the sequence odd, writes, makes it even; a reader retries a copy
// whose sequence was odd or changed.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "lockstep/common/result.h"

namespace lockstep::progress {

inline constexpr std::uint32_t kMagic = 0x5250534cu;  // "LSPR"
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::size_t kBytes = 128;
inline constexpr std::size_t kPhaseBytes = 32;
inline constexpr const char* kEnv = "LOCKSTEP_PROGRESS";
inline constexpr const char* kStacksEnv = "LOCKSTEP_STACKS";

enum Flags : std::uint32_t {
  kAnnounced = 1,     // the program named the phase (checkpoint, eval): judged by its own history
  kInCollective = 2,  // inside collective number `collectives`
  kReportsSteps = 4,  // the program reports steps: its progress can be judged at all
};

struct Record {
  std::uint32_t magic = 0;
  std::uint32_t version = 0;
  std::uint64_t sequence = 0;
  std::int64_t step = 0;
  std::int64_t stepBeganUs = 0;
  std::int64_t phaseBeganUs = 0;
  std::uint64_t collectives = 0;
  std::int64_t collectiveBeganUs = 0;
  std::uint32_t bucket = 0;
  std::uint32_t buckets = 0;
  std::uint32_t stackSignal = 0;
  std::uint32_t flags = 0;
  char phase[kPhaseBytes] = {};
  std::int32_t pid = 0;
  std::uint32_t collectiveKind = 0;
  std::uint32_t reserved[4] = {};
};
static_assert(sizeof(Record) == kBytes);

// What a reader keeps of a record: checked, with the phase as text.
struct Snapshot {
  std::int64_t step = 0;
  std::int64_t stepBeganUs = 0;
  std::string phase;  // "" before the program said anything
  std::int64_t phaseBeganUs = 0;
  std::uint64_t collectives = 0;
  bool inCollective = false;
  std::int64_t collectiveBeganUs = 0;
  std::uint32_t bucket = 0, buckets = 0;
  std::uint32_t collectiveKind = 0;  // of the newest collective entered (0: not said)
  bool announced = false;
  bool reportsSteps = false;
  int stackSignal = 0;
  pid_t pid = 0;
  bool operator==(const Snapshot&) const = default;
};

// Creates (or empties) the record file a rank will write, mode 0600 (the rank's user owns it).
Result<void> create(const std::string& path);
// Reads a record written by an untrusted rank: a file that is not a record, or a record that
// is being written on every try, is an error.
Result<Snapshot> read(const std::string& path);

// The writer a rank keeps. Inactive (every call a no-op) without LOCKSTEP_PROGRESS or when the
// file cannot be mapped. Safe from several threads of one process (a spin lock, uncontended).
class Writer {
 public:
  // From the environment's LOCKSTEP_PROGRESS.
  static Writer fromEnvironment();
  explicit Writer(const std::string& path);
  Writer() = default;
  ~Writer();
  Writer(Writer&& other) noexcept;
  Writer& operator=(Writer&& other) noexcept;
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  bool active() const { return record_ != nullptr; }
  // A step completed: the next one begins now, in phase `phase`.
  void stepDone(std::int64_t step, std::string_view phase = {});
  // The rank is now in `phase` (announced: a phase the program named, judged by its own history).
  void phase(std::string_view phase, bool announced = false);
  // `kind`: lockstep.proto's CollectiveKind (0: not said, read as an all-reduce).
  void collectiveBegin(std::uint32_t bucket = 0, std::uint32_t buckets = 0, std::uint32_t kind = 0);
  void collectiveEnd();

 private:
  template <typename F>
  void write(F&& change);

  Record* record_ = nullptr;
  std::atomic_flag busy_;
};

}  // namespace lockstep::progress
