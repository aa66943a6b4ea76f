#pragma once
// A report's "Job spec" table: the built-in trainer's settings, or what a command job ran.
// Private to report/.

#include <string>
#include <vector>

#include "lockstep/protocol/types.h"

namespace lockstep::report::detail {

std::vector<std::vector<std::string>> specSettings(const JobSpec& spec);

}  // namespace lockstep::report::detail
