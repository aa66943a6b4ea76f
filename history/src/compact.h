#pragma once
// Downsampling the history's samples older than the raw horizon into one row per bucket
// (docs/history.md), and the clocks' thinning (NodeClocks::thin) in the same transaction.
// Private to history/.

#include <cstdint>

#include "clocks.h"
#include "lockstep/history/history.h"

namespace lockstep::history::detail {

class Compactor {
 public:
  Compactor(sqlite3* db, Options options, NodeClocks& clocks);

  // Relative to `nowUnixUs`.
  Result<CompactStats> compact(std::int64_t nowUnixUs);

 private:
  Result<void> downsample(std::int64_t bucketUs, std::int64_t cutoffUs);
  // The sample tables' rows, into `gpu`, `process` and `net`.
  Result<void> count(std::uint64_t& gpu, std::uint64_t& process, std::uint64_t& net);

  sqlite3* db_;
  Options options_;
  NodeClocks& clocks_;
};

}  // namespace lockstep::history::detail
