#pragma once
// Sharded training's bookkeeping (--shard, docs/trainer.md): which part of the flat parameter
// buffer each rank owns, and moving optimizer state between its full form (checkpoints, which
// hold every parameter's state) and a rank's part.
//
// Rank r owns [bounds[r], bounds[r+1]) of the parameters (the header, which carries the step's
// loss and votes, is all-reduced and owned by nobody). With --shard optimizer a rank keeps the
// optimizer state of its part only, applies the optimizer to it alone, and the parameters are
// all-gathered after each step; the gradients are reduce-scattered onto the owners as backward
// produces them, bucket by bucket.

#include <cstddef>
#include <memory>
#include <vector>

#include "comm.h"
#include "model.h"
#include "optimizer.h"

namespace lockstep::trainer {

class ShardPlan {
 public:
  ShardPlan(const ParamLayout& layout, int worldSize);

  std::size_t begin(int rank) const { return bounds_[static_cast<std::size_t>(rank)]; }
  std::size_t end(int rank) const { return bounds_[static_cast<std::size_t>(rank) + 1]; }
  int count() const { return static_cast<int>(bounds_.size()) - 1; }
  // Each rank's part of [begin, end) as offsets from `begin` (worldSize + 1 of them, from 0 to
  // end - begin): what Comm::reduceScatterSum and Comm::allGather take.
  std::vector<std::size_t> partsOf(std::size_t begin, std::size_t end) const;

 private:
  std::vector<std::size_t> bounds_;  // worldSize + 1: from the header's end to the buffer's
};

// The optimizer state of every parameter, all-gathered from the ranks' parts onto every rank
// (collective: every rank calls it at the same point), as a full optimizer at `part`'s step.
Result<std::unique_ptr<Optimizer>> gatherOptimizer(Comm& comm, const ShardPlan& plan, Optimizer& part,
                                                   const ParamLayout& layout);

// An optimizer for this rank's part that continues `full` (its state there, its step count).
std::unique_ptr<Optimizer> partOf(Optimizer& full, const ShardPlan& plan, int rank);

}  // namespace lockstep::trainer
