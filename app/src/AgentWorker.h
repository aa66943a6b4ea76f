#pragma once
// One agent connection, on a thread of its own (a ZeroMQ socket belongs to one thread). It connects,
// says hello, lists jobs, then long-polls the agent's stream from its last sequence number; on any
// error it reconnects with backoff and resumes from that number, so nothing is lost or repeated.
// The records of jobs watched fanned in (FanIn.h) are left out of the stream; for those of them
// that its agent supervises, it asks the agent for the job's frame ten times a second instead.
// Everything it learns goes to the GUI thread through queued signals; commands come in through
// queued slots. Create it, move it to its thread, then call start() through the thread.

#include <QObject>
#include <QTimer>
#include <chrono>
#include <map>
#include <memory>
#include <utility>

#include "FanIn.h"
#include "Types.h"
#include "lockstep/client/agent_client.h"
#include "lockstep/client/frames.h"

namespace lockstep::app {

class AgentWorker : public QObject {
  Q_OBJECT

 public:
  // fanIn: which jobs are watched fanned in (null: none).
  AgentWorker(QString id, AgentAddress address, CurveKeyPair keys, std::string agentKey,
              std::shared_ptr<FanInBook> fanIn = nullptr);
  ~AgentWorker() override;

 public Q_SLOTS:
  void start();
  void stop();
  // Commands; each answers with commandDone(tag, ok, message).
  // storeSecret: rank 0's agent's (from its jobStarted), for the other agents; empty for rank 0's.
  void startJob(quint64 tag, lockstep::JobSpec spec, QString storeSecret);
  void stopJob(quint64 tag, QString jobId);

 Q_SIGNALS:
  void stateChanged(QString id, lockstep::app::AgentState state, QString message);
  void helloReceived(QString id, lockstep::app::HelloPtr hello);
  void jobsReceived(QString id, lockstep::app::JobList jobs);
  void messagesReceived(QString id, lockstep::app::MessageBatch messages);
  // A fanned-in job's frame, from this agent, which supervises the job.
  void frameReceived(QString id, lockstep::app::FramePtr frame);
  void jobStarted(quint64 tag, QString id, quint32 rendezvousPort, QString storeSecret);
  // The agent's clock against this machine's (AgentClient::measureClock): on connecting, then
  // every minute. An agent too old to say its time sends none.
  void clockMeasured(QString id, QString node, lockstep::ClockOffset offset);
  // errorCode: an lockstep::ErrorCode when !ok (a timeout means the agent may still start the job).
  void commandDone(quint64 tag, bool ok, QString message, int errorCode);

 private:
  void tick();
  void connectNow();
  void fail(const Error& error);
  void setState(AgentState state, const QString& message);
  bool refreshJobs();
  void measureClock();
  // The fanned-in jobs of the newest list: which to leave out of the stream, which to ask frames of.
  void noteFannedIn(const std::vector<JobStatus>& jobs);
  bool askFrames();
  void forgetFrames();

  const QString id_;
  const AgentAddress address_;
  const CurveKeyPair keys_;
  const std::string agentKey_;
  std::unique_ptr<AgentClient> client_;
  QTimer* timer_ = nullptr;
  AgentState state_ = AgentState::kConnecting;
  QString stateMessage_;  // what the last stateChanged said: a retry that fails the same way says nothing new
  std::uint64_t lastSeq_ = 0;
  std::uint64_t instanceId_ = 0;
  // The agent's (instance, jobs version) when the jobs were last listed for its messages.
  std::pair<std::uint64_t, std::uint64_t> jobsVersion_{0, 0};
  std::chrono::milliseconds backoff_{500};
  std::chrono::steady_clock::time_point nextJobsRefresh_{};
  std::vector<JobAttempt> knownSpecs_;  // the specs this connection brought: later lists leave them out
  std::chrono::steady_clock::time_point nextClock_{};
  const std::shared_ptr<FanInBook> fanIn_;
  std::vector<std::string> leftOut_;     // the fanned-in jobs the agent lists (at most kMaxJobsLeftOut)
  std::vector<std::string> supervised_;  // those of them it supervises: their frames come from here
  // Those asked no more: their last frame came, or the agent said it will not answer (it stood by
  // and the job ended, or it ended while nobody asked).
  std::vector<std::string> done_;
  std::map<std::string, FrameCursor> cursors_;  // each fanned-in job's events, of this instance of the agent
  std::chrono::steady_clock::time_point nextFrames_{};
};

}  // namespace lockstep::app
