#pragma once
// A rank's side of the parameter server (--sync parameter-server; ps_server.h has the server),
// whichever loop computes its gradients: CpuLoop with BLAS, CudaLoop on its GPU (which copies them
// to the host first). It starts this rank's part of the server where it holds one, joins the
// workers' mesh to the parts, and per step pushes the gradient to every part and pulls back its
// range of the weights.
//
// The messages travel over Gloo between host buffers on either backend: an asynchronous server
// takes each push from whichever worker sends first, which NCCL's point-to-point calls (each
// naming its peer) cannot express, and the server's master, optimizer and queued gradients live in
// host memory, as in the classic design (a GPU holds only its worker's model).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps_link.h"
#include "ps_server.h"
#include "rank_host.h"
#include "reducer.h"

namespace lockstep::trainer {

// One step's exchange with the server.
struct PsExchange {
  PsHeader reply;        // the server's word (part 0's: the parts answer alike)
  KindTotals push, pull; // one of each per part
  Clock::time_point pushStart, end;
};

class PsWorker {
 public:
  // Every rank calls it at the same point, before its first step. On a rank holding a part of the
  // server it makes the rank state's optimizer that part's (the server applies it); elsewhere an
  // optimizer with no state. Fails clearly on settings that cannot work (validateStaleness).
  static Result<std::unique_ptr<PsWorker>> start(RankHost& host, const std::string& keyPrefix);
  ~PsWorker();
  PsWorker(const PsWorker&) = delete;
  PsWorker& operator=(const PsWorker&) = delete;

  // Pushes `grads` (the flat layout; its header holds the step's loss sum, samples and stop vote)
  // and pulls the weights after the update into `weights` (the flat layout). Afterwards grads'
  // header holds the update's sums, as an all-reduce leaves them. `voteToStop`: this worker
  // reached the target loss, so the server ends the run.
  Result<PsExchange> pushAndPull(float* grads, float* weights, bool voteToStop);
  // On a rank holding a part of the server: the part's own error once it has ended. `stopFirst`:
  // this rank's worker failed, so the part stops waiting for pushes; else it ends once it has told
  // every worker the run is over.
  std::optional<Error> serverError(bool stopFirst);
  // The weights' version (the server's update count) the next push is computed on.
  std::uint64_t version() const { return version_; }

  // What the step's report says: the bytes this rank holds for the server (its part's master,
  // queued gradients and optimizer state, the messages' copies) besides `workerParamFloats` of
  // weights and `workerGradFloats` of gradients; staleness; one push and one pull per part.
  void addFigures(const PsExchange& exchange, std::size_t workerParamFloats, std::size_t workerGradFloats,
                  StepReport& report) const;

 private:
  explicit PsWorker(RankHost& host);
  Result<void> connect(const std::string& keyPrefix);
  // Part `part`'s message within the flat buffer `flat` (part 0's is its start), or its copy.
  float* message(int part, float* flat, std::vector<std::vector<float>>& copies) const;

  RankHost& host_;
  std::unique_ptr<ShardPlan> parts_;
  std::unique_ptr<ParameterServer> server_;  // this rank's part, if it holds one
  std::unique_ptr<PsLink> link_;
  std::vector<std::vector<float>> pushes_, pulls_;  // per part after the first: the message's copy
  std::uint64_t version_ = 0;
};

}  // namespace lockstep::trainer
