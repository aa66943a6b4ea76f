#pragma once
// The CSV report's three files; private to report/ (write() is the public way in).

#include <string>
#include <string_view>

#include "lockstep/common/result.h"
#include "lockstep/history/history.h"

namespace lockstep::report::detail {

// One RFC 4180 field: quoted when it holds a comma, quote, CR or LF (quotes doubled).
std::string csvField(std::string_view text);

// One row per rank per step, in the history's order.
Result<std::string> stepsCsv(const history::History& history, const std::string& jobId);
// One row per stored GPU sample (raw or bucketed); unknown metrics are empty cells.
Result<std::string> gpuCsv(const history::History& history, const std::string& jobId);
// One row per network sample of the job's nodes while it ran, its columns the schema's fields
// (protocol/records.h); unknown counters are empty cells.
Result<std::string> networkCsv(const history::History& history, const std::string& jobId);

}  // namespace lockstep::report::detail
