#pragma once
// The rank's place in the job, from torchrun's environment variables.

#include <chrono>
#include <cstdint>
#include <string>

#include "lockstep/common/result.h"

namespace lockstep::trainer {

struct DistEnv {
  std::uint32_t rank = 0;
  std::uint32_t worldSize = 1;
  std::uint32_t localRank = 0;
  std::uint32_t localWorldSize = 1;
  std::string masterAddr = "127.0.0.1";
  std::uint16_t masterPort = 0;
  // LOCKSTEP_AGENT_STORE=1: the launcher (or agent) hosts the store, not rank 0.
  bool storeHostedByLauncher = false;
  std::string storeSecret;     // LOCKSTEP_STORE_SECRET: the job's, for the rendezvous store; "" open
  std::string reportEndpoint;  // LOCKSTEP_REPORT
  std::uint32_t attempt = 0;   // LOCKSTEP_ATTEMPT: restarts of the job so far
};

// Reads RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT (all absent: a world of
// one) and the LOCKSTEP_* variables. Malformed or inconsistent values are InvalidArgument.
Result<DistEnv> distEnvFromEnvironment();

// LOCKSTEP_TEST_SLOWDOWN=RANK:FACTOR makes that rank compute FACTOR times slower (the loops idle
// for the difference): the load-balancing and asynchronous tests and benchmarks stand in for
// slower hardware with it. Returns this rank's factor: 1 unless it is RANK.
Result<double> testSlowdown(std::uint32_t rank);

// LOCKSTEP_TEST_COMM_DELAY=RANK:MICROS:STEP makes that rank's every collective of the step's
// gradients (and gathered layers) MICROS longer from the STEP-th step this process runs on (a
// resumed run counts from its first step again); RANK "all" makes every
// rank's longer. The re-planning test stands in for a link that became slower with it (a link slows
// every rank alike, while one rank's delay reads, on the others, as waiting for a late rank); the
// GPU tests use it to hold back the communication stream, so that a missing wait shows. Returns
// this rank's delay in its `step`-th step (1-based): zero unless set for it.
std::chrono::microseconds testCommDelay(int rank, std::uint64_t step);

// Who sends a record of the job's (a StepReport, a PhaseReport): the job, this rank, the world
// size and the attempt.
template <class Record>
void stampSender(Record& record, const std::string& jobId, const DistEnv& env) {
  record.jobId = jobId;
  record.rank = env.rank;
  record.worldSize = env.worldSize;
  record.attempt = env.attempt;
}

}  // namespace lockstep::trainer
