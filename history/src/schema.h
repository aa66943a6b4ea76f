#pragma once
// The history file's schema: its migrations, one per version.
// Private to history/.

#include <array>

#include "lockstep/history/history.h"

namespace lockstep::history::detail {

inline constexpr int kApplicationId = 0x4C4B5354;  // "LKST": marks the file as a Lockstep history

// Migration i brings a file from schema version i to i + 1. Append; never edit a shipped one.
extern const std::array<const char*, kSchemaVersion> kMigrations;

}  // namespace lockstep::history::detail
