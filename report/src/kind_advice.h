#pragma once
// Which kind of data parallelism fits a workload (issue 45), from recorded jobs of it run under
// different kinds: the one that reached the target loss soonest (or, without a target, trained
// fastest), and what each other kind traded, in words with the figures. Private to report/.

#include <span>
#include <string>
#include <vector>

#include "lockstep/history/history.h"

namespace lockstep::report::detail {

// Empty when no workload was run under two kinds with final KPIs.
std::vector<std::string> kindAdvice(std::span<const history::JobRecord> jobs);

}  // namespace lockstep::report::detail
