#pragma once
// The history file's schema: its migrations, one per version, and running them on open.
// Private to history/.

#include <array>

#include "sqlite.h"

#include "lockstep/history/history.h"

namespace lockstep::history::detail {

inline constexpr int kApplicationId = 0x4C4B5354;  // "LKST": marks the file as a Lockstep history

// Migration i brings a file from schema version i to i + 1. Append; never edit a shipped one.
extern const std::array<const char*, kSchemaVersion> kMigrations;

// Brings the file to kSchemaVersion, each migration in one transaction; refuses a file that is not
// a Lockstep history or was written by a newer version, saying so, and leaves it as it is.
Result<void> migrate(sqlite3* db);

}  // namespace lockstep::history::detail
