// lockstepctl alerts [JOB]: the alerts the agents hold (docs/alerts.md), as their supervising
// agents raised them: each rule's firing and resolution with its value and what it is about, and
// the webhooks that did not take one, and why. They are job events in each agent's stream, so the
// answer needs no client to have been connected when they fired.

#include <algorithm>
#include <cstdio>

#include "ctl.h"
#include "ctl_flags.h"
#include "lockstep/alerts/alert.h"
#include "lockstep/present/present.h"

namespace lockstep::ctl {
namespace {

using Json = nlohmann::ordered_json;
constexpr std::uint32_t kBatch = 20'000;

struct Found {
  std::vector<alerts::Alert> alerts;
  std::vector<JobEvent> undelivered;
};

// Every alert event an agent still holds, of one job or all that this client may see.
Result<void> collect(AgentClient& agent, const std::string& jobId, std::chrono::milliseconds timeout, Found& out) {
  const std::uint64_t last = agent.hello().lastSeq;
  for (std::uint64_t after = 0; after < last;) {
    LOCKSTEP_ASSIGN_OR_RETURN(const FetchReply batch, agent.fetch(after, kBatch, 0, timeout));
    if (batch.messages.empty()) break;
    for (const auto& m : batch.messages) {
      const auto* e = std::get_if<JobEvent>(&m.payload);
      if (e == nullptr || (!jobId.empty() && e->jobId != jobId)) continue;
      if (e->kind == JobEventKind::kAlertUndelivered) out.undelivered.push_back(*e);
      if (auto alert = alerts::alertOf(*e)) out.alerts.push_back(std::move(*alert));
    }
    after = batch.messages.back().seq;
  }
  return {};
}

std::string aboutText(const alerts::Alert& a) {
  std::string out;
  if (!a.ranks.empty()) {
    out = a.ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < a.ranks.size(); ++i) out += (i ? "," : "") + std::to_string(a.ranks[i]);
  }
  for (const auto& n : a.nodes) out += (out.empty() ? "" : " ") + n;
  return out.empty() ? std::string(present::kUnknown) : out;
}

void printTable(const Found& found) {
  if (found.alerts.empty()) std::printf("no alerts\n");
  else std::printf("%-19s  %-10s  %-8s  %s\n", "TIME", "JOB", "STATE", "ALERT");
  for (const auto& a : found.alerts) {
    std::printf("%-19s  %-10s  %-8s  %s\n", timeText(a.timeUs).c_str(), a.jobId.c_str(),
                std::string(alerts::stateName(a.state)).c_str(), a.text.c_str());
    std::printf("%-19s  %-10s  %-8s  about: %s%s\n", "", "", "", aboutText(a).c_str(),
                a.notify || a.notNotifiedWhy.empty() ? "" : ("; not notified: " + a.notNotifiedWhy).c_str());
  }
  for (const auto& e : found.undelivered) {
    std::printf("%-19s  %-10s  %-8s  %s\n", timeText(e.timeUnixUs).c_str(), e.jobId.c_str(), "-", e.message.c_str());
  }
}

void printJson(const Found& found) {
  Json list = Json::array();
  for (const auto& a : found.alerts) list.push_back(Json::parse(alerts::alertJson(a)));
  Json undelivered = Json::array();
  for (const auto& e : found.undelivered) {
    undelivered.push_back({{"job", e.jobId}, {"time_us", e.timeUnixUs}, {"message", e.message}});
  }
  std::printf("%s\n", Json{{"alerts", list}, {"undelivered", undelivered}}.dump().c_str());
}

}  // namespace

int cmdAlerts(const Globals& g, const std::vector<std::string>& args) {
  std::vector<std::string> job;
  LOCKSTEP_TRY_OR_FAIL(Flags("usage: lockstepctl alerts [JOB]").arguments(&job, 0, 1).parse(args));
  const std::string jobId = job.empty() ? "" : job[0];
  auto agents = jobId.empty() ? connectAgents(g) : connectAgentsFor(g, jobId);
  if (!agents) return fail(agents.error());
  Found found;
  for (AgentClient* agent : agents->all()) LOCKSTEP_TRY_OR_FAIL(collect(*agent, jobId, g.timeout, found));
  const auto byTime = [](const auto& a, const auto& b) { return a.timeUs < b.timeUs; };
  std::stable_sort(found.alerts.begin(), found.alerts.end(), byTime);
  if (g.json) printJson(found);
  else printTable(found);
  return kOk;
}

}  // namespace lockstep::ctl
