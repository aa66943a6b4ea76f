#pragma once
// A finished job's KPIs in the history's final_kpis table, written and read by column name
// through one list of columns. Private to history/.

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>

#include "lockstep/common/result.h"
#include "lockstep/kpi/kpi.h"

namespace lockstep::history::detail {

Result<void> writeFinalKpis(sqlite3* db, const std::string& jobId, const kpi::JobKpis& k, std::int64_t computedUnixUs);
Result<std::optional<kpi::JobKpis>> readFinalKpis(sqlite3* db, const std::string& jobId);

}  // namespace lockstep::history::detail
