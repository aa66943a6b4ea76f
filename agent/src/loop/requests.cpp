#include "loop/requests.h"

#include <set>

#include "lockstep/protocol/job_list.h"

namespace lockstep::agent {
namespace {

// Whether each route sits at its kind's index (a kind without one would hold kind 0 and no handler).
constexpr bool inKindOrder(const auto& routes) {
  for (std::size_t i = 0; i < routes.size(); ++i) {
    if (routes[i].kind != i || routes[i].handle == nullptr) return false;
  }
  return true;
}

}  // namespace

// Request kind → handler, in the order of Request::body's alternatives (checked below).
constexpr std::array<Requests::Route, Requests::kKinds> Requests::routes() {
  return {{
      routeOf<HelloRequest, &Requests::hello>(),     // the node's facts, its time and the stream's end
      routeOf<StartJobRequest, &Requests::start>(),  // checked off the loop, then started (jobs/starts.h)
      routeOf<StopJobRequest, &Requests::stop>(),    // a start being checked, or a job's ranks
      routeOf<FetchRequest, &Requests::fetch>(),     // the long poll (stream/fetches.h)
      routeOf<ListJobsRequest, &Requests::list>(),   // the jobs the key sees, with supervision and progress
      routeOf<LogsRequest, &Requests::logs>(),       // a rank's log
      routeOf<StacksRequest, &Requests::stacks>(),   // evidence taken off the loop (stalls/stalls.h)
      routeOf<FrameRequest, &Requests::frame>(),     // a supervised job's KPIs, fanned in (jobs/supervision.h)
  }};
}

void Requests::handle(const std::string& client, const std::string& key, Request request) {
  const std::uint64_t id = request.requestId;
  auto caller = parts_.access.callerOf(key, request);
  if (!caller) {
    parts_.replies.replyError(client, id, caller.error());
    return;
  }
  static constexpr auto kRoutes = routes();
  static_assert(inKindOrder(kRoutes), "every kind of request has its handler, at its kind's place");
  const Route& route = kRoutes[request.body.index()];
  (this->*route.handle)(Call{client, key, id, *caller}, request.body);
}

bool Requests::denied(const Call& call, const std::string& jobId) {
  auto may = parts_.access.mayActOn(call.caller, jobId, parts_.starts.pendingOwner(jobId));
  if (!may) parts_.replies.replyError(call.client, call.id, may.error());
  return !may;
}

void Requests::hello(const Call& call, HelloRequest& body) {
  if (body.protocolVersion != kProtocolVersion) {
    parts_.replies.replyError(
        call.client, call.id,
        Error{ErrorCode::kFailedPrecondition, "this agent speaks protocol version " + std::to_string(kProtocolVersion) +
                                                  ", the client " + std::to_string(body.protocolVersion) +
                                                  ": upgrade the older one"});
    return;
  }
  parts_.replies.reply(call.client, Reply{call.id, parts_.hello()});
}

void Requests::start(const Call& call, StartJobRequest& body) {
  parts_.starts.onStartJob(call.client, call.key, call.caller, call.id, std::move(body.spec),
                           std::move(body.storeSecret));
}

void Requests::stop(const Call& call, StopJobRequest& body) {
  if (denied(call, body.jobId)) return;
  parts_.log.info("job " + body.jobId + ": stop asked by " + call.caller.describe);
  if (call.caller.user) {
    parts_.starts.stoppedByUser(body.jobId);  // it is not restarted here
    parts_.supervisions.stopAskedByUser(body.jobId, "stopped on request", body.graceMs);
  }
  if (parts_.starts.cancel(body.jobId)) {
    parts_.replies.reply(call.client, Reply{call.id, StopJobReply{body.jobId, JobState::kStopped}});
    return;
  }
  auto stopped = parts_.jobs.stop(body.jobId, body.graceMs);
  if (stopped) {
    parts_.replies.reply(call.client, Reply{call.id, *stopped});
  } else {
    parts_.replies.replyError(call.client, call.id, stopped.error());
  }
}

void Requests::fetch(const Call& call, FetchRequest& body) {
  parts_.fetches.onFetch(call.client, call.key, call.caller.streamScope(), call.id, body);
}

// With the supervision of the jobs this agent supervises, and each running job's progress; the
// specs the client says it holds left out.
void Requests::list(const Call& call, ListJobsRequest& body) {
  std::vector<JobStatus> jobs = parts_.access.visibleJobs(call.key, call.caller);
  const std::set<JobAttempt> known(body.knownSpecs.begin(), body.knownSpecs.end());
  for (auto& j : jobs) {
    j.supervision = parts_.supervisions.of(j.spec.jobId);
    parts_.stalls.withProgress(j);
    if (known.count({j.spec.jobId, j.spec.attempt}) != 0) omitSpec(j);
  }
  parts_.replies.reply(call.client, Reply{call.id, JobsReply{std::move(jobs)}});
}

void Requests::logs(const Call& call, LogsRequest& body) {
  if (denied(call, body.jobId)) return;
  auto logs = parts_.jobs.logs(body.jobId, body.rank, body.maxBytes);
  if (logs) {
    parts_.replies.reply(call.client, Reply{call.id, *logs});
  } else {
    parts_.replies.replyError(call.client, call.id, logs.error());
  }
}

void Requests::stacks(const Call& call, StacksRequest& body) {
  if (!denied(call, body.jobId)) parts_.stalls.onStacks(call.client, call.id, body);
}

// A job this agent holds: an ended job dropped from the table has no owner left to check a key against.
void Requests::frame(const Call& call, FrameRequest& body) {
  if (!parts_.jobs.ownerOf(body.jobId)) {
    parts_.replies.replyError(call.client, call.id, Error{ErrorCode::kNotFound, "no job " + body.jobId + " on this agent"});
    return;
  }
  if (denied(call, body.jobId)) return;
  auto frame = parts_.supervisions.frameOf(body);
  if (frame) {
    parts_.replies.reply(call.client, Reply{call.id, std::move(*frame)});
  } else {
    parts_.replies.replyError(call.client, call.id, frame.error());
  }
}

}  // namespace lockstep::agent
