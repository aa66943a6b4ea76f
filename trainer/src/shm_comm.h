#pragma once
// All-reduce between ranks of one node through shared memory, for CPU jobs whose ranks are all
// local. Loopback TCP (Gloo) copies every byte through the kernel twice each way. Here each rank
// keeps its gradients in its own buffer inside a shared segment (Comm::inPlaceBuffer); an
// all-reduce of a range of it sums this rank's share of the range over every rank's buffer and
// writes the sum into every rank's buffer, so nothing is copied in or out (measured:
// docs/benchmarks.md). Other buffers' all-reduces (small: the ranks' agreements) are copied
// through slots of the segment; broadcasts, barriers and larger ones go to the Gloo communicator
// it wraps.
//
// Each all-reduce is two barriers on a counter in the segment; a rank waits on it with a futex
// (blocking, so a waiting rank leaves its core to its compute), bounded by the job's timeout: a
// peer that never arrives is a Timeout, which the trainer then explains as for Gloo.
//
// The segment: POSIX shared memory named by rank 0 (a random name, published in the job's store),
// mode 0600, unlinked as soon as every rank has it open, so nothing is left behind.

#include <chrono>
#include <memory>
#include <string>

#include "comm.h"
#include "lockstep/common/store.h"

namespace lockstep::trainer {

// Wraps `gloo` (the job's communicator among worldSize local ranks): all-reduces of up to
// `capacityFloats` go through shared memory. Collective: every rank calls it at the same point.
Result<std::unique_ptr<Comm>> connectSharedMemory(std::unique_ptr<Comm> gloo, StoreClient& store,
                                                  const std::string& keyPrefix, std::size_t capacityFloats,
                                                  std::chrono::milliseconds timeout);

}  // namespace lockstep::trainer
