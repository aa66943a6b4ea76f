#include "jobs/supervision.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <iterator>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "alerts/alert_desk.h"
#include "alerts/job_alerts.h"
#include "base/log.h"
#include "lockstep/client/agent_client.h"
#include "lockstep/client/elastic.h"
#include "lockstep/client/launch.h"
#include "lockstep/client/supervisor.h"
#include "lockstep/kpi/frame.h"
#include "lockstep/kpi/stall.h"
#include "lockstep/protocol/validate.h"

namespace lockstep::agent {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kCallTimeout = std::chrono::seconds(5);
constexpr auto kLaunchTimeout = std::chrono::seconds(15);
// The launching client starts the other nodes' parts once rank 0's started: until then a part
// that is not there yet is starting, not lost.
constexpr auto kPartsAppear = std::chrono::seconds(30);
constexpr auto kPollEvery = std::chrono::milliseconds(300);
// Between two polls the job's streams are read, and its frame made, this often while a client asked
// for the frame in the last kWatchedFor: one that shows it (the app, ten times a second) sees it this
// fresh. A job read only for its rules is read once a poll.
constexpr auto kReadEvery = std::chrono::milliseconds(100);
constexpr auto kWatchedFor = std::chrono::seconds(2);
constexpr int kMissesToLose = 3;
// After the job ended, its streams are read on (kPollEvery apart) until a read brings nothing of
// it, at least twice and at most kMostEndReads times: a part ends when its ranks were reaped, and
// their last reports may reach its stream a moment later.
constexpr int kLeastEndReads = 2;
constexpr int kMostEndReads = 10;
// A job without alert rules is read while clients ask for its frame, and this long after the last ask.
constexpr auto kAskedReadsFor = std::chrono::seconds(60);
// An alert's checkpoint,stop: how long the ranks have to write it before they are killed.
constexpr std::uint32_t kCheckpointGraceMs = 60'000;

const JobAgent* agentOf(const JobSpec& spec, const std::string& node) {
  for (const auto& a : spec.agents) {
    if (a.node == node) return &a;
  }
  return nullptr;
}

}  // namespace

class Supervisions::Worker {
 public:
  Worker(JobSpec spec, bool standby, std::string self, const CurveKeyPair& keys, AlertDesk& alerts, Log& log)
      : first_(std::move(spec)),
        standby_(standby),
        self_(std::move(self)),
        keys_(keys),
        desk_(alerts),
        log_(log),
        thread_([this] { run(); }) {}
  ~Worker() {
    requestStop();
    thread_.join();
  }
  // The agent stops: the thread ends after the call under way (each has a timeout), doing nothing more.
  void requestStop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
  }

  Supervision state() const {
    std::lock_guard lock(mutex_);
    return state_;
  }
  bool ended() const { return state().state == SupervisionState::kEnded; }
  bool finished() const { return finished_.load(); }  // its thread has nothing left to do
  // Whether it supervises the job: the first agent's worker, or the second's once it took over;
  // the second's may still take over while it stands by.
  enum class Role { kSupervises, kStandsBy, kStoodBy };
  Role role() const {
    std::lock_guard lock(mutex_);
    if (!standby_ || tookOver_) return Role::kSupervises;
    return state_.state == SupervisionState::kStandby ? Role::kStandsBy : Role::kStoodBy;
  }
  // The job's frame and supervision, as one moment's, and whether the job ended unread; the job's
  // streams are read while frames are asked for (kAskedReadsFor).
  struct Asked {
    std::shared_ptr<const JobFrame> frame;  // null until the reads caught up (again)
    Supervision supervision;
    std::string noLastFrame;  // why the ended job has none
  };
  Asked frameAsked() {
    std::lock_guard lock(mutex_);
    askedAt_ = Clock::now();
    return {frame_, state_, noLastFrame_};
  }
  // A user asked this agent to stop the job: however its parts then end (a rank of a program of
  // the user's own may fail as its peers go), it ended stopped, and is not restarted. A standby
  // keeps it for when it takes over.
  void stopAskedByUser(std::string why, std::uint32_t graceMs) {
    std::lock_guard lock(mutex_);
    if (!userStop_) userStop_ = UserStop{std::move(why), graceMs};
  }

 private:
  void run();
  void follow(Supervisor& supervisor);
  std::optional<Supervisor> standBy();
  // The node's part of the job, its spec left out when it is `attempt`'s (which this worker holds).
  std::optional<JobStatus> statusOn(const std::string& node, std::uint32_t attempt);
  std::vector<EndedPart> observe(const JobSpec& attempt, Clock::time_point since);
  EndedPart observeOn(const std::string& node, const JobSpec& attempt, bool mayBeStarting, const Result<JobsReply>& jobs);
  Result<JobSpec> restart(const JobSpec& ended, const RestartPlan& plan);
  void stopParts(const JobSpec& attempt, std::uint32_t graceMs = 0);
  JobAlerts makeAlerts(const JobSpec& spec);
  void pollAlerts(JobAlerts& alerts, Supervisor& supervisor);
  void heedUserStop(Supervisor& supervisor);
  bool heardUserStop(Supervisor& supervisor);  // a user's stop came: the supervisor was told
  void readToTheEnd(JobAlerts& alerts, const Supervisor& supervisor);
  void publishFrame(std::shared_ptr<const JobFrame> frame);
  bool reading(const JobAlerts& alerts) const;  // whether the job's streams are read (rules, or a frame asked)
  bool watched() const;  // whether a client asked for the frame just now (kWatchedFor)
  std::set<std::string> nodesLeft(const Supervisor& supervisor) const;
  // A node's connection where it answered the last poll; null while the agent stops.
  AgentClient* answering(const std::string& node);
  void noLastFrame(const std::string& why);
  bool lostRank(std::uint32_t rank) const;
  // Connects to those of `nodes` not connected, all at once: silent agents cost one timeout
  // together, not one each (a rack of k dead nodes would hold every poll k × 5 s).
  void connect(const std::set<std::string>& nodes);
  AgentClient* client(const std::string& node);  // connected, else connected now; null if it cannot be
  AgentClient* connected(const std::string& node) const;  // its connection; null where there is none
  void publish(SupervisionState state, const Supervisor& supervisor, JobState outcome = JobState::kRunning,
               const std::string& message = "");
  void publish(Supervision state);
  bool pause(Clock::duration d);  // false once the agent stops
  // kPollEvery, reading the job's streams every kReadEvery meanwhile while watched(); false once
  // the agent stops.
  bool pauseReading(JobAlerts& alerts, Supervisor& supervisor);
  bool stopping() const {
    std::lock_guard lock(mutex_);
    return stop_;
  }
  void say(const std::string& line) { log_.info("job " + first_.jobId + ": " + line); }

  const JobSpec first_;
  const bool standby_;  // the job's second agent: it takes over if the first stops answering
  const std::string self_;  // this agent's node
  const CurveKeyPair keys_;
  AlertDesk& desk_;
  Log& log_;
  bool stopAsked_ = false;  // by an alert's rule or a user: the supervisor was told, the parts stopped
  std::map<std::string, std::unique_ptr<AgentClient>> clients_;  // by node
  std::set<std::string> seen_;        // nodes whose part of this attempt was seen
  std::set<std::string> lost_;        // nodes lost in this attempt (they stay lost until the next)
  std::map<std::string, int> misses_; // polls in a row a node's agent did not answer
  std::vector<EndedPart> lastParts_;  // as last observed
  std::map<std::string, JobStatus> statuses_;  // each node's part as its agent last listed it
  std::set<std::string> unreachable_; // said once each
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  // From the start: a client listing the job sees it so.
  Supervision state_{standby_ ? SupervisionState::kStandby : SupervisionState::kFollowing, JobState::kRunning, {}, {}};
  std::shared_ptr<const JobFrame> frame_;  // after each read of the job's agents' streams
  std::optional<Clock::time_point> askedAt_;  // a client's last frame request
  bool read_ = false;                         // the job's streams were read at the last poll
  std::string noLastFrame_;                   // the job ended without a last frame: why
  struct UserStop {
    std::string why;
    std::uint32_t graceMs = 0;  // as the user asked it of this agent, for every part
  };
  std::optional<UserStop> userStop_;  // a user asked this agent to stop the job
  std::optional<UserStop> userStop() const {
    std::lock_guard lock(mutex_);
    return userStop_;
  }
  bool tookOver_ = false;                  // the standby, from the first agent
  std::atomic<bool> finished_{false};      // run() returned
  std::thread thread_;  // last: it runs once the members above exist
};

void Supervisions::Worker::run() {
  if (!standby_) {
    say("supervised by this agent (restarts allowed: " + std::to_string(first_.maxRestarts) + ")");
    Supervisor supervisor(first_);
    follow(supervisor);
  } else if (auto taken = standBy()) {
    {
      std::lock_guard lock(mutex_);
      tookOver_ = true;
    }
    follow(*taken);
  }
  clients_.clear();  // each holds a connection to its node's agent
  finished_ = true;
}

// The standby's wait: it mirrors the first agent's supervision until that ends (then this ends
// too), or until the first agent misses kMissesToLose polls in a row, or no longer supervises the
// job (it restarted without it): then it takes over where the job stands.
std::optional<Supervisor> Supervisions::Worker::standBy() {
  const std::string primary = supervisorOf(first_)->node, self = self_;
  JobSpec current = first_;
  Supervision last;
  int misses = 0;
  while (pause(kPollEvery)) {
    // Each agent listed once a poll: the latest attempt either knows, and whether the first still
    // supervises.
    const auto there = statusOn(primary, current.attempt);
    for (const auto& status : {there, statusOn(self, current.attempt)}) {
      // A newer attempt is never left out (only the one named is), but a stub must never become the spec.
      if (status && !status->specOmitted && status->spec.attempt > current.attempt) current = status->spec;
    }
    if (stopping()) return std::nullopt;
    const bool supervising = there && there->supervision.state != SupervisionState::kNone;
    if (!supervising) {
      if (++misses < kMissesToLose) continue;
      say("took over its supervision from node " + primary + "'s agent, which " +
          (there ? "no longer supervises it" : "stopped answering"));
      for (const auto& r : current.ranks) seen_.insert(r.node);  // launched long ago: not "starting"
      return Supervisor(current, last.attempts);
    }
    misses = 0;
    last = there->supervision;
    if (last.state == SupervisionState::kEnded) {
      publish(last);
      return std::nullopt;
    }
    Supervision mirrored = last;
    mirrored.state = SupervisionState::kStandby;
    publish(mirrored);
  }
  return std::nullopt;
}

std::optional<JobStatus> Supervisions::Worker::statusOn(const std::string& node, std::uint32_t attempt) {
  AgentClient* c = client(node);
  auto jobs = c ? c->listJobs(kCallTimeout, {{first_.jobId, attempt}})
                : Result<JobsReply>(Error{ErrorCode::kUnavailable, "unreachable"});
  if (!jobs) {
    clients_.erase(node);
    return std::nullopt;
  }
  for (auto& j : jobs->jobs) {
    if (j.spec.jobId == first_.jobId) return std::move(j);
  }
  return std::nullopt;
}

void Supervisions::Worker::follow(Supervisor& supervisor) {
  auto since = Clock::now();
  JobAlerts alerts = makeAlerts(supervisor.spec());
  publish(SupervisionState::kFollowing, supervisor);
  while (pauseReading(alerts, supervisor)) {
    lastParts_ = observe(supervisor.spec(), since);
    if (stopping()) break;  // what the agent's own answers said while it stopped is not acted on
    heedUserStop(supervisor);
    pollAlerts(alerts, supervisor);
    auto action = supervisor.observe(lastParts_, Clock::now());
    using Kind = Supervisor::Action::Kind;
    if (action.kind == Kind::kStop) {
      say("failed; stopping its other parts");
      stopParts(supervisor.spec());
      continue;
    }
    if (action.kind == Kind::kRestart) {
      publish(SupervisionState::kRestarting, supervisor, JobState::kRunning, action.message);
      if (stopping()) break;
      auto placed = heardUserStop(supervisor) ? Result<JobSpec>(Error{ErrorCode::kCancelled, "a user stopped the job"})
                                              : restart(supervisor.spec(), action.plan);
      if (placed) {
        say(action.message + "; restart " + std::to_string(placed->attempt) + " of " +
            std::to_string(placed->maxRestarts) + " with " + std::to_string(placed->worldSize) + " rank(s)");
        supervisor.restarted(*placed);
        alerts.restarted(action.message, *placed);
        since = Clock::now();
        seen_.clear();
        lost_.clear();
        misses_.clear();
        publish(SupervisionState::kFollowing, supervisor);
        continue;
      }
      (void)heardUserStop(supervisor);  // while it restarted (the agents it reached refused it)
      action = supervisor.restartFailed(placed.error().message);
    }
    if (action.kind == Kind::kEnd) {
      say("supervision ended: " + std::string(jobStateName(action.state)) +
          (action.message.empty() ? "" : " (" + action.message + ")"));
      publish(SupervisionState::kEnded, supervisor, action.state, action.message);
      alerts.ended(action.state, action.message);
      pollAlerts(alerts, supervisor);
      readToTheEnd(alerts, supervisor);
      break;
    }
  }
}

// Every node is asked at once, then each answer taken in turn: a poll waits one round trip, not
// one a node (2,048 of them at 16,384 GPUs).
std::vector<EndedPart> Supervisions::Worker::observe(const JobSpec& attempt, Clock::time_point since) {
  std::set<std::string> nodes, reached;
  for (const auto& r : attempt.ranks) nodes.insert(r.node);
  std::set_difference(nodes.begin(), nodes.end(), lost_.begin(), lost_.end(), std::inserter(reached, reached.end()));
  connect(reached);
  std::map<std::string, AgentClient*> asked;
  for (const auto& [node, c] : clients_) {
    if (stopping()) return {};
    // Every 300 ms from every node of the job: without the spec this attempt's is (it places every
    // rank of the job: 420 KB at 16,384 ranks).
    if (reached.count(node) && c->sendListJobs({{first_.jobId, attempt.attempt}})) asked.emplace(node, c.get());
  }
  const bool early = Clock::now() - since < kPartsAppear;
  const auto deadline = Clock::now() + kCallTimeout;
  std::vector<EndedPart> parts;
  for (const auto& node : nodes) {
    if (stopping()) break;
    const auto a = asked.find(node);
    auto jobs = a == asked.end() ? Result<JobsReply>(Error{ErrorCode::kUnavailable, "not reached"})
                                 : a->second->receiveListJobs(deadline, kCallTimeout);
    parts.push_back(observeOn(node, attempt, early && !seen_.count(node), jobs));
  }
  return parts;
}

// One node's part: as its agent listed it (`jobs`: its answer, or why none came); starting while it
// may not be there yet; else lost.
EndedPart Supervisions::Worker::observeOn(const std::string& node, const JobSpec& attempt, bool mayBeStarting,
                                          const Result<JobsReply>& jobs) {
  const JobAgent* a = agentOf(first_, node);
  EndedPart part{node, a ? a->address : node, {}, true, JobState::kRunning, 0, ""};
  if (lost_.count(node)) return part;
  if (!jobs) clients_.erase(node);
  if (jobs) {
    misses_[node] = 0;
    for (const auto& status : jobs->jobs) {
      if (status.spec.jobId != first_.jobId || status.spec.attempt < attempt.attempt) continue;
      seen_.insert(node);
      statuses_[node] = status;
      return EndedPart{node,          part.agent,          status.ranks,     false, status.state,
                       status.spec.attempt, status.message, status.stopAsked};
    }
    if (!mayBeStarting) {  // it answers, and has no such part: it never started, or was lost
      lost_.insert(node);
      return part;
    }
  }
  // Not answering: lost after kMissesToLose polls in a row (one slow answer is not a lost node), or
  // at once when the part never appeared in its time.
  const bool seen = seen_.count(node) > 0;
  if (mayBeStarting || (seen && ++misses_[node] < kMissesToLose)) {
    part.agentLost = false;
    part.state = seen ? JobState::kRunning : JobState::kStarting;
    part.attempt = attempt.attempt;
    if (seen) {
      for (const auto& p : lastParts_) {
        if (p.node == node && !p.agentLost) part = p;  // as it was last seen
      }
    }
    return part;
  }
  lost_.insert(node);
  return part;
}

void Supervisions::Worker::connect(const std::set<std::string>& nodes) {
  std::map<std::string, std::unique_ptr<AgentClient>> greeted;
  const auto unreachable = [&](const std::string& node, const Error& why) {
    if (unreachable_.insert(node).second) say("cannot reach node " + node + "'s agent: " + why.message);
  };
  for (const auto& node : nodes) {
    const JobAgent* a = agentOf(first_, node);
    if (clients_.count(node) || !a) continue;
    auto address = parseAgentAddress(a->address);
    auto opened = address ? AgentClient::open(*address, keys_, a->publicKey)
                          : Result<std::unique_ptr<AgentClient>>(address.error());
    auto sent = opened ? (*opened)->sendHello() : Result<void>(opened.error());
    if (!sent) unreachable(node, sent.error());
    else greeted.emplace(node, std::move(*opened));
  }
  const auto deadline = Clock::now() + kCallTimeout;
  for (auto& [node, c] : greeted) {
    if (auto hello = c->receiveHello(deadline, kCallTimeout); !hello) {
      unreachable(node, hello.error());
      continue;
    }
    unreachable_.erase(node);
    clients_.emplace(node, std::move(c));
  }
}

AgentClient* Supervisions::Worker::client(const std::string& node) {
  connect({node});
  return connected(node);
}

AgentClient* Supervisions::Worker::connected(const std::string& node) const {
  const auto it = clients_.find(node);
  return it == clients_.end() ? nullptr : it->second.get();
}

// The job's rules as this agent runs them; ones it can no longer run (its own defaults changed
// since the job was checked) are said and left out.
JobAlerts Supervisions::Worker::makeAlerts(const JobSpec& spec) {
  auto rules = desk_.rulesFor(spec);
  if (!rules) say("its alert rules are not evaluated: " + rules.error().message);
  return JobAlerts(spec, rules ? std::move(*rules) : std::vector<alerts::Rule>{}, self_, desk_);
}

// The job's nodes not lost: those its streams are read from.
std::set<std::string> Supervisions::Worker::nodesLeft(const Supervisor& supervisor) const {
  std::set<std::string> nodes;
  for (const auto& r : supervisor.spec().ranks) {
    if (!lost_.count(r.node)) nodes.insert(r.node);
  }
  return nodes;
}

// A silent node is not read (none is connected to anew here: that is the supervision's to do, and
// a dead node must not hold up a poll), and counts as not read to its end.
AgentClient* Supervisions::Worker::answering(const std::string& node) {
  const auto missed = misses_.find(node);
  if (stopping() || (missed != misses_.end() && missed->second > 0)) return nullptr;
  return connected(node);
}

void Supervisions::Worker::noLastFrame(const std::string& why) {
  std::lock_guard lock(mutex_);
  noLastFrame_ = why;
}

bool Supervisions::Worker::reading(const JobAlerts& alerts) const {
  std::lock_guard lock(mutex_);
  return alerts.hasRules() || (askedAt_ && Clock::now() - *askedAt_ < kAskedReadsFor);
}

bool Supervisions::Worker::watched() const {
  std::lock_guard lock(mutex_);
  return askedAt_ && Clock::now() - *askedAt_ < kWatchedFor;
}

// Evaluates the job's rules on what the job's agents that answer streamed (a lost or silent one is
// left out), and carries out what the rules that fired ask: stop, with time for a checkpoint first
// where they ask for one. The job then ends stopped, and is not restarted. What was read is the
// job's frame, once the reads caught up. A job without rules whose frame nobody asked for lately
// is not read; when its reads lapse, its frame goes until they catch up again.
void Supervisions::Worker::pollAlerts(JobAlerts& alerts, Supervisor& supervisor) {
  if (!reading(alerts)) {
    if (std::exchange(read_, false)) {
      alerts.lapsed();
      publishFrame(nullptr);
    }
    return;
  }
  read_ = true;
  const std::set<std::string> nodes = nodesLeft(supervisor);
  std::vector<const JobStatus*> parts;
  for (const auto& [node, status] : statuses_) {
    if (nodes.count(node) && misses_[node] == 0 && status.spec.attempt == supervisor.spec().attempt) {
      parts.push_back(&status);
    }
  }
  const auto stall = kpi::jobStall(parts);
  if (stall) alerts.stalled(*stall);
  const auto fired = alerts.poll(nodes, [this](const std::string& node) { return answering(node); });
  // A node silent to a read missed a poll, as one silent to a status request: the next poll connects
  // to it again, and no read waits for it meanwhile.
  for (const auto& node : alerts.silent()) {
    clients_.erase(node);
    ++misses_[node];
  }
  if (alerts.caughtUp()) publishFrame(alerts.takeFrame(stall, false));
  for (const auto& alert : fired) {
    if (stopAsked_ || !alerts::has(alert.actions, alerts::Action::kStop) || stopping()) continue;
    const bool checkpoint = alerts::has(alert.actions, alerts::Action::kCheckpoint);
    const std::string why = "alert rule '" + alert.rule + "' fired: stopping the job" + (checkpoint ? " after a checkpoint" : "");
    say(why);
    stopAsked_ = true;
    supervisor.stopAsked(why);
    stopParts(supervisor.spec(), checkpoint ? kCheckpointGraceMs : 0);
  }
}

// A user's stop, asked of this agent: every part is asked too, the stop may have reached this
// agent alone.
void Supervisions::Worker::heedUserStop(Supervisor& supervisor) {
  const auto asked = userStop();
  if (!asked || stopAsked_) return;
  // One that came once every part had ended, and none on a stop, came too late to change how it
  // ended; it still keeps the job from restarting (heardUserStop).
  const bool over = std::all_of(lastParts_.begin(), lastParts_.end(), [](const EndedPart& p) {
    return p.agentLost || (jobStateEnded(p.state) && !p.stopAsked);
  });
  if (over) return;
  (void)heardUserStop(supervisor);
  stopParts(supervisor.spec(), asked->graceMs);
}

// Whether a user's stop came, where the job was to restart: the supervisor is told, and ends the job
// stopped rather than restart it (a stop that came once every part had ended came before the restart).
bool Supervisions::Worker::heardUserStop(Supervisor& supervisor) {
  const auto asked = userStop();
  if (!asked) return false;
  if (!stopAsked_) supervisor.stopAsked(asked->why);
  stopAsked_ = true;
  return true;
}

// After the job ended: its streams read on until every node's was read to its end and a read brought
// nothing more of it (at least kLeastEndReads reads), and its last frame published, at its newest
// report. Without that, no last frame: a client is told why, not shown less as the job's last.
void Supervisions::Worker::readToTheEnd(JobAlerts& alerts, const Supervisor& supervisor) {
  const std::string ended = "job " + first_.jobId + " ended";
  if (!reading(alerts)) {
    noLastFrame(ended + " while no client asked node " + self_ + " for its frame");
    return;
  }
  // Every node left is asked, one a read just found silent too (connected again, if it answers).
  const std::set<std::string> nodes = nodesLeft(supervisor);
  connect(nodes);
  const auto reached = [this](const std::string& node) { return stopping() ? nullptr : connected(node); };
  bool done = false;
  for (int i = 0; !done && i < kMostEndReads && pause(kPollEvery); ++i) {
    const auto read = alerts.read(nodes, reached);
    done = read.complete && read.taken == 0 && i + 1 >= kLeastEndReads;
  }
  if (stopping()) return;
  if (!done) {
    publishFrame(nullptr);
    noLastFrame(ended + ", and node " + self_ + " could not read every one of its agents' streams to the end");
    return;
  }
  publishFrame(alerts.takeFrame(std::nullopt, true));
}

// The old frame (a 16,384-rank job's is some MB) leaves in `frame`, freed after the lock is released.
void Supervisions::Worker::publishFrame(std::shared_ptr<const JobFrame> frame) {
  std::lock_guard lock(mutex_);
  std::swap(frame_, frame);
}

void Supervisions::Worker::stopParts(const JobSpec& attempt, std::uint32_t graceMs) {
  std::set<std::string> nodes;
  for (const auto& r : attempt.ranks) nodes.insert(r.node);
  connect(nodes);
  if (stopping()) return;
  // A lost node too: if it answers again, what it still runs of the job must not run on.
  std::vector<std::string> asked;
  std::vector<AgentClient*> agents;
  for (const auto& node : nodes) {
    if (AgentClient* c = connected(node)) {  // none where it did not answer just now
      asked.push_back(node);
      agents.push_back(c);
    }
  }
  const auto stopped = stopJobOnEach(agents, first_.jobId, graceMs, kCallTimeout);
  for (std::size_t i = 0; i < stopped.size(); ++i) {
    if (!stopped[i]) say("could not stop its part on " + asked[i] + ": " + stopped[i].error().message);
  }
}

bool Supervisions::Worker::lostRank(std::uint32_t rank) const {
  for (const auto& p : lastParts_) {
    for (const auto& r : p.ranks) {
      if (r.rank == rank) return rankLost(r, first_.isCommand());
    }
  }
  return false;
}

// The next attempt on the nodes the plan keeps; CUDA ranks keep the GPUs the job had there, but
// those of its lost ranks (the GPU may be what failed).
Result<JobSpec> Supervisions::Worker::restart(const JobSpec& ended, const RestartPlan& plan) {
  std::vector<PlacementNode> nodes;
  std::vector<std::uint32_t> counts;
  std::vector<AgentClient*> clients;
  for (const auto& [node, ranks] : plan.ranksPerNode) {
    const JobAgent* a = agentOf(first_, node);
    AgentClient* c = client(node);
    if (!a || !c) return Error{ErrorCode::kUnavailable, "cannot reach node " + node + "'s agent"};
    PlacementNode p{c->address(), a->publicKey, node, {}};
    for (const auto& r : ended.ranks) {
      if (r.node == node && r.gpuIndex && !lostRank(r.rank)) p.freeGpus.push_back(*r.gpuIndex);
    }
    nodes.push_back(std::move(p));
    counts.push_back(ranks);
    clients.push_back(c);
  }
  LOCKSTEP_ASSIGN_OR_RETURN(auto placed, placeJob(nodes, counts, plan.next));
  LOCKSTEP_TRY(validateJobSpec(placed));
  LOCKSTEP_TRY(launchJob(clients, placed, kLaunchTimeout));
  return placed;
}

void Supervisions::Worker::publish(SupervisionState state, const Supervisor& supervisor, JobState outcome,
                                   const std::string& message) {
  std::lock_guard lock(mutex_);
  state_.state = state;
  state_.outcome = outcome;
  state_.message = message;
  state_.attempts = supervisor.attempts();
}

void Supervisions::Worker::publish(Supervision state) {
  std::lock_guard lock(mutex_);
  state_ = std::move(state);
}

bool Supervisions::Worker::pauseReading(JobAlerts& alerts, Supervisor& supervisor) {
  const auto until = Clock::now() + kPollEvery;
  while (pause(std::min(until - Clock::now(), Clock::duration(watched() ? kReadEvery : kPollEvery)))) {
    if (Clock::now() >= until) return true;
    pollAlerts(alerts, supervisor);
  }
  return false;
}

bool Supervisions::Worker::pause(Clock::duration d) {
  std::unique_lock lock(mutex_);
  return !wake_.wait_for(lock, d, [this] { return stop_; });
}

Supervisions::Supervisions(std::string node, CurveKeyPair nodeKeys, AlertDesk& alerts, Log& log, Held held)
    : node_(std::move(node)), keys_(std::move(nodeKeys)), alerts_(alerts), log_(log), held_(std::move(held)) {}

Result<void> Supervisions::checkAlerts(const JobSpec& spec) const {
  LOCKSTEP_TRY(alerts_.rulesFor(spec));
  return {};
}

SupervisingRole Supervisions::roleIn(const JobSpec& spec) const {
  return supervisingRole(spec, [&](const JobAgent& a) { return a.node == node_; });
}

bool Supervisions::supervises(const JobSpec& spec) const { return static_cast<bool>(roleIn(spec)); }

Supervisions::~Supervisions() {
  std::lock_guard lock(mutex_);
  for (auto& [id, worker] : workers_) worker->requestStop();  // all at once, then each joined
  workers_.clear();
  retiring_.clear();  // told to stop already
}

void Supervisions::supervise(const JobSpec& spec) {
  std::vector<std::unique_ptr<Worker>> gone;  // finished: joined (at once) once the lock is let go
  std::lock_guard lock(mutex_);
  for (auto it = workers_.begin(); it != workers_.end();) {
    const bool reused = it->first == spec.jobId && spec.attempt == 0;
    if (it->second->ended() && (reused || (held_ && !held_(it->first)))) {
      it->second->requestStop();
      retiring_.push_back(std::move(it->second));
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  const auto done = std::stable_partition(retiring_.begin(), retiring_.end(), [](const auto& w) { return !w->finished(); });
  std::move(done, retiring_.end(), std::back_inserter(gone));
  retiring_.erase(done, retiring_.end());
  const SupervisingRole role = roleIn(spec);
  if (workers_.count(spec.jobId) || !role) return;
  workers_.emplace(spec.jobId, std::make_unique<Worker>(spec, role.standby, node_, keys_, alerts_, log_));
}

Result<FrameReply> Supervisions::frameOf(const FrameRequest& request) const {
  Worker::Asked asked;
  {
    std::lock_guard lock(mutex_);
    const auto it = workers_.find(request.jobId);
    const auto role = it == workers_.end() ? Worker::Role::kStoodBy : it->second->role();
    if (role == Worker::Role::kStoodBy) {
      return Error{ErrorCode::kFailedPrecondition, "node " + node_ + " does not supervise job " + request.jobId +
                                                       ": ask its supervising agent (its first agent, or its second "
                                                       "once that took over)"};
    }
    asked = it->second->frameAsked();  // a standby asked reads once it took over
    if (role == Worker::Role::kStandsBy) {  // it may take over: not a final no
      return Error{ErrorCode::kUnavailable, "node " + node_ + " stands by for job " + request.jobId +
                                                "'s supervision: it answers once it takes over"};
    }
  }
  const auto& frame = asked.frame;
  if (!asked.noLastFrame.empty()) {  // what frame there is, from an earlier ask, is not its last
    return Error{ErrorCode::kFailedPrecondition,
                 asked.noLastFrame + ": watch it without --fan-in (its agents' streams hold it)"};
  }
  if (!frame) {
    return Error{ErrorCode::kUnavailable, "node " + node_ + " reads job " + request.jobId +
                                              "'s streams for its frame: ask again in a moment"};
  }
  const Supervision& supervision = asked.supervision;
  const JobState state = supervision.state == SupervisionState::kEnded ? supervision.outcome : JobState::kRunning;
  FrameReply reply{request.jobId, frame->timeUnixUs, frame->ended, state, "", {}, 0, frame->stall};
  if (frame->timeUnixUs != request.heldUnixUs || frame->ended) {  // else the caller holds its KPIs
    kpi::JobKpis k = kpi::withRanks(frame->head, frame->ranks, frame->gpus, request.ranksFrom, request.ranksCount);
    if (request.nodeBlocks) k.nodeBlocks = frame->nodeBlocks;
    reply.kpis = kpi::encodeFrame(k);
  }
  const auto& events = *frame->events;
  reply.lastEvent = events.empty() ? 0 : events.back().seq;
  for (const auto& e : events) {
    if (e.seq <= request.eventsAfter) continue;
    if (reply.events.size() == kMaxFrameEvents) break;
    reply.events.push_back(e);
  }
  return reply;
}

void Supervisions::stopAskedByUser(const std::string& jobId, std::string why, std::uint32_t graceMs) {
  std::lock_guard lock(mutex_);
  const auto it = workers_.find(jobId);
  if (it != workers_.end()) it->second->stopAskedByUser(std::move(why), graceMs);
}

bool Supervisions::goesOn(const std::string& jobId) const {
  std::lock_guard lock(mutex_);
  const auto it = workers_.find(jobId);
  return it != workers_.end() && !it->second->ended();
}

Supervision Supervisions::of(const std::string& jobId) const {
  std::lock_guard lock(mutex_);
  auto it = workers_.find(jobId);
  return it == workers_.end() ? Supervision{} : it->second->state();
}

}  // namespace lockstep::agent
