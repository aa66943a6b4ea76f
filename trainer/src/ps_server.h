#pragma once
// The parameter server (--sync parameter-server, docs/trainer.md): the master model and the
// optimizer, on a thread of rank 0's process, which is rank W of the workers' PsLink mesh. Every
// rank is a worker: it pushes its gradient (the flat buffer's header, carrying the samples, the
// loss and a stop vote, and the parameters' gradients) and pulls the weights the server sends back.
//
// With --ps-ranks N the server is split by parameter ranges (a ShardPlan of N parts): part s is a
// thread of rank s's process and rank W+s of the mesh, and holds its range of the master and of the
// optimizer state. A message to or from part s is the header and that range. The parts act alike
// (synchronous only: each sees every push's header); for a checkpoint the others send their range
// and state to part 0, which writes the file.
//
// Staleness 0 is synchronous: the server waits for every worker's gradient, sums them in rank
// order (as the all-reduce does) and makes one update of the global batch. Staleness K >= 1 is
// asynchronous: each gradient is an update of its own, as it arrives, and the bound is kept by the
// order of updates: the server applies the queued gradient computed on the oldest weights, and
// holds it while a worker still computing on older weights would then find its own gradient more
// than K updates old. With W workers a gradient is W-1 updates old even in lockstep, so K >= W-1.
//
// Threading: the server's thread owns its master and optimizer from start() to join(); the worker
// of its rank's process trains on the weights it pulls meanwhile.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "checkpoint.h"
#include "dist_env.h"
#include "lockstep/jobflags/options.h"
#include "optimizer.h"
#include "ps_link.h"
#include "shard.h"

namespace lockstep::trainer {

// Where a message's own header sits in the flat buffer's header region: floats 0..2 keep the
// step's loss sum, samples and stop votes (model.h's HeaderSlot), in a push and in a pull.
struct PsHeader {
  std::uint64_t version = 0;    // push: the weights' version it was computed on; pull: the master's after it
  std::uint32_t done = 0;       // push: end the run (the worker reached the target loss); pull: the run is over
  std::uint32_t staleness = 0;  // pull: updates between the gradient's weights and its own update
  std::uint32_t applied = 0;    // pull: the gradient made an update (not: no samples, or the run was over first)
  std::uint32_t stopped = 0;    // pull: the run was ended by a stop signal (a rank's vote)
};
inline constexpr std::size_t kPsHeaderAt = 8;
PsHeader readPsHeader(const float* buffer);
void writePsHeader(float* buffer, const PsHeader& header);

// Each update's learning rate. Synchronous, an update is the global batch's, as all-reduce's;
// asynchronous, it is one worker's batch, which --lr-scaling linear scales by instead.
double serverLearningRate(const JobSpec& spec);

struct PsServerSetup {
  const jobflags::TrainerOptions* options = nullptr;
  const DistEnv* env = nullptr;
  const std::vector<float>* master = nullptr;  // the weights to start from (read when the server is made)
  Optimizer* optimizer = nullptr;  // over this part's range of the parameters
  CheckpointWriter* checkpoints = nullptr;  // null: none
  const ResumeSettings* resume = nullptr;
  std::uint64_t firstStep = 0, totalSteps = 0;
  std::string storePrefix;  // the mesh's, in the job's store
  const ParamLayout* layout = nullptr;
  const ShardPlan* parts = nullptr;  // the server's parts, one per server rank
  int part = 0;                      // this one's
};

// The floats of a message to or from part `part`: the header, then its range.
std::size_t psMessageFloats(const ShardPlan& parts, int part);

class ParameterServer {
 public:
  // Starts the server's thread, which joins the mesh through a store connection of its own.
  explicit ParameterServer(PsServerSetup setup);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  // Waits until every worker has been told the run is over; the server's error, if it failed (its
  // mesh is closed then, so that no worker waits for it).
  Result<void> join();
  // Stops waiting for pushes or a part's state (its rank's worker failed): join() then returns
  // soon, Cancelled.
  void abort();
  // What the server holds: the gradients it receives and queues (one buffer per worker and one
  // being received), and its optimizer state.
  std::uint64_t gradientBytes() const;
  // Its range of the master (and the message header it is sent with).
  std::uint64_t masterBytes() const { return master_.size() * sizeof(float); }

 private:
  Result<void> serve();
  // The sender, once it is in; abort() ends the wait.
  Result<int> waitFor(PsLink::Receive& receive);
  Result<void> received(int worker);
  Result<void> applySynchronous();
  Result<bool> applyOldestIfBounded();
  // One update of the master; `endAsked`: a worker reached the target loss.
  Result<void> update(const float* gradient, bool endAsked);
  Result<void> reply(int worker, const float* headerFrom, std::uint32_t staleness, bool applied);
  Result<void> checkpointIfDue(bool stopVoted);
  // Part 0: every part's range of the master and of the optimizer state, into the whole.
  Result<void> assembleCheckpoint(std::vector<float>& params, Optimizer& whole);
  std::size_t partBegin() const { return setup_.parts->begin(setup_.part); }

  PsServerSetup setup_;
  std::atomic<bool> aborting_{false};
  std::mutex pendingMutex_;
  PsLink::Receive* pending_ = nullptr;  // the receive the thread waits in, for abort()
  const int workers_;
  const std::size_t floats_;  // of a message: the header and this part's range
  std::vector<float> master_;  // the header's room, then this part's range of the master
  std::unique_ptr<PsLink> link_;
  std::vector<std::vector<float>> queued_;  // per worker: its gradient waiting for its update; empty: none
  std::vector<float> receiving_;
  std::vector<std::uint64_t> version_;      // per worker: the weights it computes on
  std::vector<bool> told_;                  // per worker: it was told the run is over
  std::uint64_t updates_ = 0;               // the master's version
  bool over_ = false;
  bool stopVoted_ = false;   // a rank's stop signal ended the run
  Result<void> result_;
  std::thread thread_;
};

}  // namespace lockstep::trainer
