#pragma once
// One supervised job as its supervision reads it, on the supervision's thread (jobs/supervision.cpp):
// what the job's agents stream (this one's included) is fetched through the same connections the
// supervision uses and read by the KPI engine, when the job has alert rules or a client asked for
// its frame. The job's rules are evaluated on the result (alerts/book.h) each time the supervision
// reads (once a poll, ten times a second while a client watches the frame): a changed alert is
// published through the agent's AlertDesk, and the ones that fired are handed back for the supervision to act on (stop, checkpoint, restart). The same KPIs, the job's
// events and its stall make its frame (docs/fan-in.md).

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "lockstep/alerts/alert.h"
#include "lockstep/alerts/book.h"
#include "lockstep/kpi/kpi.h"
#include "lockstep/protocol/types.h"

namespace lockstep {
class AgentClient;
}

namespace lockstep::agent {

class AlertDesk;

// The job as its supervision last saw it across its agents, for the clients that ask this agent
// for it instead of reading every agent's stream (FrameRequest; docs/fan-in.md).
struct JobFrame {
  std::int64_t timeUnixUs = 0;  // the KPIs' moment: the newest report's in the job's last frame
  bool ended = false;           // the job's last frame: it ended and its agents' streams were read to their end
  kpi::JobKpis head;            // without its rows, which follow
  std::vector<kpi::RankKpis> ranks;
  std::vector<kpi::GpuKpis> gpus;
  std::vector<kpi::NodeBlock> nodeBlocks;  // the heatmap's rows (kpi/frame.h), for the clients that ask
  std::shared_ptr<const std::vector<StreamMessage>> events;  // the job's events, numbered from 1
  std::optional<Stall> stall;
};

class JobAlerts {
 public:
  // `self`: this agent's node (its disk is measured where the job writes).
  JobAlerts(const JobSpec& spec, std::vector<alerts::Rule> rules, std::string self, AlertDesk& desk);

  using ClientOf = std::function<AgentClient*(const std::string&)>;
  // Reads what each of `nodes`' agents streamed since the last call (`client` gives the
  // connection; null: not reachable now) and, once caught up, evaluates the rules. Returns the
  // alerts that fired.
  std::vector<alerts::Alert> poll(const std::set<std::string>& nodes, const ClientOf& client);
  // What a read brought: the job's records, and whether every node was read to its stream's end.
  struct Read {
    std::size_t taken = 0;
    bool complete = false;
  };
  // Only reads (poll's first half): after the job ended, for its last records still on their way.
  Read read(const std::set<std::string>& nodes, const ClientOf& client);
  bool hasRules() const { return !rules_.empty(); }
  // The nodes the last read asked that did not answer in its time (a timeout, nobody there), given a
  // second at least.
  const std::vector<std::string>& silent() const { return silent_; }
  // Whether every node of the last read was once read to the end of its stream. Before, the KPIs
  // lack what the agents held when reading began (a frame asked for mid-job, or after a lapse), and
  // are neither a frame nor evaluated.
  bool caughtUp() const { return caughtUp_; }
  // Reading stopped for a while: what was read stays, but the next reads must catch up again.
  void lapsed();
  // The job's stall as the supervision sees it across its parts (kpi::jobStall): each agent
  // reports the stall its own ranks show, and only the whole job says which rank is behind.
  void stalled(const Stall& stall);
  // What the supervision decided, evaluated at the next poll.
  void ended(JobState state, const std::string& message);
  void restarted(const std::string& why, const JobSpec& attempt);  // the attempt placed now
  // The job's KPIs of the last read (their rows moved out), its events and `stall`; `last`: the job
  // ended and its streams were read to their end, so the KPIs are taken at its newest report, as a
  // client that read every stream shows an ended job.
  std::shared_ptr<const JobFrame> takeFrame(const std::optional<Stall>& stall, bool last);

 private:
  struct Cursor {
    std::uint64_t instance = 0;
    std::uint64_t afterSeq = 0;
    bool reachedEnd = false;  // once
  };
  struct Batch {
    std::size_t taken = 0;  // the job's records in it
    bool more = false;      // the agent holds more after it
  };
  void readRound(const std::vector<std::string>& nodes, const ClientOf& client,
                 const std::function<void(const std::string&, const std::optional<Batch>&)>& took);
  // A node's answer to the read's fetch (null: none came).
  std::optional<Batch> take(const std::string& node, const AgentClient& client, Result<FetchReply> reply);
  bool take(const StreamMessage& message);  // whether it was the job's
  void measureDisk();

  JobSpec spec_;
  std::vector<alerts::Rule> rules_;
  std::string self_;
  AlertDesk& desk_;
  std::vector<std::string> urls_;
  kpi::JobTracker tracker_;
  std::vector<RankPlacement> placement_;  // the current attempt's: its nodes are the heatmap's
  alerts::AlertBook book_;
  alerts::NodeFacts facts_;
  std::map<std::string, Cursor> cursors_;
  std::vector<std::string> silent_;  // of the last read
  std::set<std::string, std::less<>> answered_;  // the nodes whose batch the last read took
  std::int64_t diskMeasuredUs_ = 0;
  std::int64_t createdUs_;
  std::int64_t stallEndedUs_ = 0;  // the newest stall_ended seen: a stall from before it is over
  std::int64_t polledUs_ = 0;       // when kpis_ was computed
  bool caughtUp_ = false;
  kpi::JobKpis kpis_;               // at the last read
  std::uint64_t eventCount_ = 0;
  std::deque<StreamMessage> events_;  // the newest of the job's events, numbered by eventCount_
  std::shared_ptr<const std::vector<StreamMessage>> sharedEvents_;  // events_ as last framed
};

}  // namespace lockstep::agent
