#pragma once
// Starting a placed job on its agents, as a plain state machine that both clients drive
// (lockstepctl through launchJob, the app through its agent threads): rank 0's node first (its
// agent hosts the store and returns its port and secret), then every other node at once; when a
// part fails to start, the parts already started are to be stopped, and so is one whose answer
// did not come (it may still start: a stop cancels a start under way).

#include <string>
#include <vector>

#include "lockstep/common/result.h"
#include "lockstep/protocol/types.h"

namespace lockstep {

class Launcher {
 public:
  struct Start {
    std::string node;  // the node whose agent this goes to
    JobSpec spec;
    std::string storeSecret;
  };

  explicit Launcher(JobSpec placed);

  // What to send now: rank 0's node's start first; once it answered, the others'. Each is handed
  // out once; empty while answers are awaited, or when the launch is over.
  std::vector<Start> next();
  void started(const std::string& node, const StartJobReply& reply);
  void failed(const std::string& node, const Error& error);

  bool finished() const;  // every start answered, or one failed and no other answer is awaited
  bool ok() const { return finished() && !error_; }
  // Why it failed, naming the node: "starting job J on node-b; stopping the parts already started: ...".
  const std::optional<Error>& error() const { return error_; }
  // The nodes whose part must be stopped because the launch failed (each handed out once).
  std::vector<std::string> toStop();
  const JobSpec& spec() const { return spec_; }  // with the store's port once rank 0's part started

 private:
  JobSpec spec_;
  std::vector<std::string> order_;  // rank 0's node first
  std::size_t handedOut_ = 0;
  std::size_t awaited_ = 0;
  std::vector<std::string> started_;
  std::vector<std::string> stopping_;  // started (or unanswered) parts of a failed launch
  std::string storeSecret_;
  std::optional<Error> error_;
};

}  // namespace lockstep
