#pragma once
// Domain values carried between threads by queued signals. Shared, immutable batches keep the
// copies cheap.

#include <QMetaType>
#include <QString>
#include <memory>
#include <vector>

#include "lockstep/common/clock.h"
#include "lockstep/protocol/types.h"

namespace lockstep::app {

enum class AgentState {
  kConnecting,
  kConnected,
  kReconnecting,   // was connected, or never answered: trying again with backoff
  kNotAuthorized,  // the agent refused this app's key
  kWrongKey,       // the agent does not hold the pinned key
};
QString agentStateText(AgentState state);

using MessageBatch = std::shared_ptr<const std::vector<StreamMessage>>;
using JobList = std::shared_ptr<const std::vector<JobStatus>>;
using HelloPtr = std::shared_ptr<const NodeHello>;
// Alert events (kAlertFiring, kAlertResolved, kAlertUndelivered), as the ingest thread read them.
using EventBatch = std::shared_ptr<const std::vector<JobEvent>>;
// A fanned-in job's frame, from its supervising agent (docs/fan-in.md).
using FramePtr = std::shared_ptr<const FrameReply>;

void registerMetaTypes();

}  // namespace lockstep::app

Q_DECLARE_METATYPE(lockstep::app::AgentState)
Q_DECLARE_METATYPE(lockstep::app::MessageBatch)
Q_DECLARE_METATYPE(lockstep::app::JobList)
Q_DECLARE_METATYPE(lockstep::app::HelloPtr)
Q_DECLARE_METATYPE(lockstep::app::EventBatch)
Q_DECLARE_METATYPE(lockstep::app::FramePtr)
Q_DECLARE_METATYPE(lockstep::JobSpec)
Q_DECLARE_METATYPE(lockstep::ClockOffset)
