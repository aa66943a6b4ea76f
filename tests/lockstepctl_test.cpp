// Issue 3: lockstepctl as scripts use it: real agents, real trainers, exit codes and --json.

#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "safetensors.h"
#include "support/agent_support.h"

namespace lockstep::test {
namespace {

using namespace std::chrono_literals;

TEST(Lockstepctl, KeysTrustAndRefusalsAreSpelledOut) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  Ctl ctl{dir, dir.file("config")};
  const std::string where = agent.address().text();

  auto keygen = ctl({"keygen", "--json"});
  ASSERT_EQ(keygen.status.exitCode, 0) << keygen.err;
  const auto key = nlohmann::json::parse(keygen.out);
  EXPECT_TRUE(key["created"].get<bool>());
  const std::string clientKey = key["public_key"];
  EXPECT_EQ(nlohmann::json::parse(ctl({"keygen", "--json"}).out)["public_key"], clientKey);  // made once

  auto untrusted = ctl({"--agent", where, "nodes"});
  EXPECT_EQ(untrusted.status.exitCode, 4);
  EXPECT_NE(untrusted.err.find("lockstepctl trust " + where + " KEY"), std::string::npos) << untrusted.err;

  const std::string otherKey = generateKeyPair()->publicKey;
  auto unknownKey = ctl({"--agent", where, "--agent-key", otherKey, "nodes"});
  EXPECT_EQ(unknownKey.status.exitCode, 4);
  EXPECT_NE(unknownKey.err.find(fingerprint(otherKey)), std::string::npos) << unknownKey.err;
  EXPECT_NE(unknownKey.err.find("lockstepctl trust " + where + " " + otherKey), std::string::npos) << unknownKey.err;

  ASSERT_EQ(ctl({"trust", where, agent.publicKey()}).status.exitCode, 0);
  auto unauthorized = ctl({"--agent", where, "--timeout-s", "3", "nodes"});
  EXPECT_EQ(unauthorized.status.exitCode, 4);
  EXPECT_NE(unauthorized.err.find(clientKey), std::string::npos) << unauthorized.err;

  agent.authorize(clientKey);
  auto nodes = ctl({"nodes", "--json"});
  ASSERT_EQ(nodes.status.exitCode, 0) << nodes.err;
  const auto list = nlohmann::json::parse(nodes.out);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0]["node"], "node-a");
  EXPECT_GE(list[0]["cpu_cores"].get<int>(), 1);

  auto nobody = ctl({"--agent", "127.0.0.1:" + std::to_string(freePort()), "nodes"});
  EXPECT_EQ(nobody.status.exitCode, 4);  // not pinned comes first
}

TEST(Lockstepctl, StartWaitStatusLogsAndStop) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));

  auto done = ctl({"start", "--ranks", "2", "--wait", "--job-id", "ctl-1", "--layers", "16,32,4", "--dataset",
                   "synthetic:n=2048", "--steps", "50", "--lr", "0.05"});
  ASSERT_EQ(done.status.exitCode, 0) << done.out << done.err;
  EXPECT_NE(done.out.find("started job ctl-1: 2 ranks on node-a"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("job ctl-1: finished"), std::string::npos) << done.out;

  auto status = ctl({"status", "ctl-1", "--json"});
  ASSERT_EQ(status.status.exitCode, 0) << status.err;
  const auto job = nlohmann::json::parse(status.out);
  EXPECT_EQ(job["state"], "finished");
  EXPECT_EQ(job["ranks"].size(), 2u);
  auto logs = ctl({"logs", "ctl-1", "--rank", "0"});
  EXPECT_EQ(logs.status.exitCode, 0);
  EXPECT_NE(logs.out.find("[lockstep] done: steps 1..50"), std::string::npos) << logs.out;

  // A job spec file in protobuf JSON, then stop.
  std::ofstream(dir.file("job.json")) << R"({"jobId": "ctl-2", "backend": "BACKEND_CPU", "activation": "ACTIVATION_RELU",
      "precision": "PRECISION_FP32", "layers": [16, 32, 4], "dataset": {"synthetic": {"samples": "2048", "dim": 16,
      "classes": 4, "seed": "1"}}, "batchPerRank": 16, "accumSteps": 1, "optimizer": {"kind": "OPTIMIZER_KIND_SGD",
      "lr": 0.05}, "steps": "100000000", "bucketMb": 25, "timeoutS": 30, "worldSize": 1})";
  auto started = ctl({"start", "--ranks", "2", "--spec", dir.file("job.json"), "--price-core-hour", "0.04",
                      "--currency", "EUR", "--json"});
  ASSERT_EQ(started.status.exitCode, 0) << started.err;
  EXPECT_EQ(nlohmann::json::parse(started.out)["world_size"], 2);
  const auto running = nlohmann::json::parse(ctl({"status", "ctl-2", "--json"}).out);
  EXPECT_EQ(running["prices"]["core_hour"], 0.04);
  EXPECT_EQ(running["prices"]["gpu_hour"], 0.0);
  EXPECT_EQ(running["prices"]["currency"], "EUR");
  auto stopped = ctl({"stop", "ctl-2", "--json"});
  ASSERT_EQ(stopped.status.exitCode, 0) << stopped.err;
  EXPECT_EQ(nlohmann::json::parse(stopped.out)["state"], "stopped");
  EXPECT_TRUE(processesOfJob("ctl-2").empty());

  auto list = ctl({"status", "--json"});
  ASSERT_EQ(list.status.exitCode, 0);
  EXPECT_EQ(nlohmann::json::parse(list.out).size(), 2u);

  auto badPrice = ctl({"start", "--price-gpu-hour", "cheap", "--layers", "16,4", "--steps", "5"});
  EXPECT_EQ(badPrice.status.exitCode, 2);
  EXPECT_NE(badPrice.err.find("--price-gpu-hour needs a price, like 2.50"), std::string::npos) << badPrice.err;
  auto bad = ctl({"start", "--layers", "16,x,4", "--steps", "5"});
  EXPECT_EQ(bad.status.exitCode, 2);
  EXPECT_NE(bad.err.find("'x' is not a whole number"), std::string::npos) << bad.err;
  auto refused = ctl({"start", "--ranks", "64", "--layers", "16,4", "--dataset", "synthetic:n=64", "--steps", "5"});
  EXPECT_NE(refused.status.exitCode, 0);
  EXPECT_NE(refused.err.find("the job asks for 64 cores"), std::string::npos) << refused.err;
  auto missing = ctl({"status", "no-such-job"});
  EXPECT_EQ(missing.status.exitCode, 1);
  EXPECT_NE(missing.err.find("no agent knows job no-such-job"), std::string::npos);
}

using Refusals = std::vector<std::pair<std::vector<std::string>, std::string>>;

// Each command line is bad usage (exit 2) and says what was wrong.
void expectEachRefused(const Ctl& ctl, const Refusals& cases) {
  for (const auto& [args, says] : cases) {
    const auto run = ctl(args);
    EXPECT_EQ(run.status.exitCode, 2) << args.back() << ": " << run.out << run.err;
    EXPECT_NE(run.err.find(says), std::string::npos) << run.err;
  }
}

// lockstepctl start took the trainer's process flags and dropped them: a job's ranks never saw
// them. Each is now refused with what to do instead, and nothing starts.
TEST(Lockstepctl, TheTrainersOwnFlagsAreRefusedWithTheirReasonNotDropped) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));
  const Refusals flags = {
      {{"--threads", "4"}, "--threads is lockstep-trainer's own, not a job's: the agent gives each rank"},
      {{"--log-every", "5"}, "--log-every is lockstep-trainer's own"},
      {{"--quiet"}, "--quiet is lockstep-trainer's own"},
      {{"--resume", "--checkpoint-dir", dir.file("ck")}, "a job resumes only in its own restarts"},
      {{"--nproc", "2"}, "give --ranks or --ranks-per-agent"},
      {{"--metrics-out", dir.file("m.jsonl")}, "--metrics-out is lockstep-trainer's own"},
      {{"--save-weights", dir.file("w.safetensors")}, "give --checkpoint-dir and --checkpoint-every"},
      {{"--keep-checkpoints", "0", "--checkpoint-dir", dir.file("ck")}, "--keep-checkpoints must be at least 1"},
  };
  Refusals cases;
  for (const auto& [given, says] : flags) {
    cases.push_back({join({"start", "--ranks", "1", "--job-id", "flags", "--layers", "8,2", "--steps", "2"}, given), says});
  }
  expectEachRefused(ctl, cases);
  EXPECT_EQ(nlohmann::json::parse(ctl({"status", "--json"}).out).size(), 0u) << "nothing started";
}

// Malformed values were read as 0 (`stop --grace-ms abc` stopped at once), and global options
// were taken from a program's own arguments after `--`.
TEST(Lockstepctl, MalformedValuesAreRefusedAndAProgramKeepsItsOwnArguments) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));
  expectEachRefused(ctl, {
      {{"stop", "job", "--grace-ms", "abc"}, "--grace-ms needs a whole number from 0 to 3600000 (not 'abc')"},
      {{"logs", "job", "--rank", "x"}, "--rank needs a whole number"},
      {{"--timeout-s", "soon", "nodes"}, "--timeout-s needs a whole number from 1 to 86400 (not 'soon')"},
      {{"start", "--ranks", "two", "--layers", "8,2", "--steps", "2"}, "--ranks needs a whole number"},
      {{"start", "--ranks-per-agent", "1,x", "--layers", "8,2", "--steps", "2"}, "--ranks-per-agent needs a whole number"},
      {{"nodes", "extra"}, "unexpected argument 'extra'"},
      {{"history", "--limit", "0"}, "--limit needs a whole number from 1"},
      {{"report", "job"}, "--out is missing"},
  });
  const auto own = ctl({"start", "--ranks", "1", "--job-id", "own-args", "--wait", "--", "/bin/sh", "-c",
                        "echo \"$0 $1\"", "--json", "--agent"});
  EXPECT_EQ(own.status.exitCode, 0) << own.out << own.err;
  EXPECT_NE(ctl({"logs", "own-args", "--rank", "0"}).out.find("--json --agent"), std::string::npos);
}

TEST(Lockstepctl, AFailedJobExitsFiveAndWatchShowsTheRanks) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));
  // Initial weights that are not there: rank 0 fails at start-up, so the job fails.
  auto failed = ctl({"start", "--ranks", "2", "--wait", "--job-id", "ctl-bad", "--layers", "16,4", "--dataset",
                     "synthetic:n=64", "--steps", "5", "--init-weights", dir.file("missing.safetensors")});
  EXPECT_EQ(failed.status.exitCode, 5) << failed.out << failed.err;
  EXPECT_NE(failed.out.find("job ctl-bad: failed"), std::string::npos) << failed.out;

  ASSERT_EQ(ctl({"start", "--ranks", "2", "--job-id", "ctl-watch", "--layers", "16,32,4", "--dataset",
                 "synthetic:n=2048", "--steps", "300"}).status.exitCode, 0);
  auto watch = ctl({"watch", "ctl-watch", "--json"});
  EXPECT_EQ(watch.status.exitCode, 0) << watch.err;
  const auto lines = [&] {
    std::vector<nlohmann::json> out;
    std::istringstream in(watch.out);
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    }
    return out;
  }();
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["state"], "finished");
  ASSERT_EQ(lines.back()["ranks"].size(), 2u);
  EXPECT_EQ(lines.back()["ranks"][0]["step"], 300);
  EXPECT_EQ(lines.back()["ranks"][1]["node"], "node-a");
  // Issue 42: the collectives by kind; the trainer's gradients are all-reduced once a step or more.
  const auto& kinds = lines.back()["collectives"];
  const auto allReduce = std::find_if(kinds.begin(), kinds.end(), [](const auto& c) { return c["kind"] == "all_reduce"; });
  ASSERT_NE(allReduce, kinds.end()) << lines.back().dump();
  EXPECT_GE((*allReduce)["per_step"].get<double>(), 1.0) << allReduce->dump();
  // Issue 46: MFU for the job and each rank, a fraction, null until the ranks count FLOPs against a peak.
  for (const auto& figures : {lines.back(), lines.back()["ranks"][0]}) {
    for (const char* name : {"model_flops_utilization", "model_flops_per_second", "peak_flops"}) {
      ASSERT_TRUE(figures.contains(name)) << name << " " << figures.dump();
      EXPECT_TRUE(figures[name].is_null() || figures[name].get<double>() >= 0) << name << " " << figures.dump();
    }
  }
  EXPECT_TRUE(lines.back().contains("flops_basis") && lines.back().contains("peak_basis")) << lines.back().dump();
  // The trainer counts its FLOPs and the test agent has a CPU peak: known while the job runs.
  EXPECT_TRUE(std::any_of(lines.begin(), lines.end(), [](const nlohmann::json& l) {
    return l["model_flops_utilization"].is_number() && l["model_flops_utilization"].get<double>() > 0;
  })) << watch.out.substr(0, 2000);
}

// Issue 31: watch shows each node's network against its link, in --json and as text. The agent
// lives in a network namespace whose one interface (a veth) carries watch's own traffic to it.
TEST(Lockstepctl, WatchShowsEachNodesNetworkAgainstItsLink) {
  TempDir dir;
  NamespacedLink link(dir);
  if (!link.made) GTEST_SKIP() << "network namespaces cannot be made here (they need root): " << link.why;
  AgentProcess agent(dir, "node-n", {"--sample-hz", "10"}, {link.nsAddress, link.ns});
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));
  // Long enough for watch to draw while the job streams (it draws once a second): a job that ended
  // within a second left it only the first and the last drawing, each of the newest sampling
  // interval, in which nothing may have crossed the link (a CI run saw 0 in both).
  ASSERT_EQ(ctl({"start", "--ranks", "1", "--job-id", "net-watch", "--layers", "16,32,4", "--dataset", "synthetic:n=2048",
                 "--steps", "100000"}).status.exitCode, 0);
  auto watch = ctl({"watch", "net-watch", "--json"});
  ASSERT_EQ(watch.status.exitCode, 0) << watch.err;
  std::istringstream in(watch.out);
  std::string line;
  double seen = 0;
  nlohmann::json last;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    last = nlohmann::json::parse(line);
    for (const auto& node : last["nodes"]) {
      EXPECT_EQ(node["node"], "node-n");
      for (const auto& i : node["interfaces"]) {
        EXPECT_EQ(i["interface"].get<std::string>().rfind("lsw", 0), 0u) << i;  // the namespace's end of the veth
        seen = std::max(seen, i["rx_bytes_per_s"].get<double>() + i["tx_bytes_per_s"].get<double>());
      }
    }
  }
  ASSERT_EQ(last["nodes"].size(), 1u) << watch.out;
  EXPECT_GT(seen, 0) << "watch's own fetches cross the veth";
  // As text, for the ended job: a line per node with its busiest interface.
  const auto text = ctl({"watch", "net-watch"});
  EXPECT_NE(text.out.find("node node-n: lsw"), std::string::npos) << text.out;
}

// Issue 5: what start --wait and watch saw is in the history; reports in every format, read back
// by tests/check_reports.py (CSV columns and rows, JSON against docs/report.schema.json, the HTML's
// charts and figures, the PDF's pages and text through pdftotext); compare; delete.
TEST(Lockstepctl, HistoryReportsCompareAndDelete) {
  TempDir dir;
  AgentProcess agent(dir, "node-a");
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));
  const std::vector<std::string> job = {"--layers", "16,32,4", "--dataset", "synthetic:n=2048", "--steps", "40",
                                        "--price-core-hour", "0.05"};
  auto start = [&](const std::string& id, const std::string& ranks) {
    std::vector<std::string> args = {"start", "--ranks", ranks, "--wait", "--job-id", id, "--name", "scaling-run"};
    args.insert(args.end(), job.begin(), job.end());
    return ctl(args);
  };
  auto two = start("h-2", "2");
  ASSERT_EQ(two.status.exitCode, 0) << two.out << two.err;
  auto one = start("h-1", "1");
  ASSERT_EQ(one.status.exitCode, 0) << one.out << one.err;
  ASSERT_EQ(ctl({"start", "--ranks", "1", "--job-id", "h-watched", "--layers", "16,4", "--dataset", "synthetic:n=512",
                 "--steps", "30"}).status.exitCode, 0);
  ASSERT_EQ(ctl({"watch", "h-watched", "--json"}).status.exitCode, 0);

  auto listed = ctl({"history", "--json"});
  ASSERT_EQ(listed.status.exitCode, 0) << listed.err;
  const auto jobs = nlohmann::json::parse(listed.out);
  ASSERT_EQ(jobs.size(), 3u) << listed.out;
  EXPECT_EQ(jobs[0]["job_id"], "h-watched");  // newest first
  EXPECT_EQ(jobs[0]["step_reports"], 30);
  EXPECT_EQ(jobs[2]["job_id"], "h-2");
  EXPECT_EQ(jobs[2]["state"], "finished");
  EXPECT_EQ(jobs[2]["step_reports"], 80) << "every step of both ranks";
  EXPECT_EQ(jobs[2]["nodes"], nlohmann::json::array({"node-a"}));
  ASSERT_TRUE(jobs[2]["kpis"].is_object()) << "final KPIs once the job ended";
  EXPECT_EQ(jobs[2]["kpis"]["steps"], 40);
  EXPECT_GT(jobs[2]["kpis"]["samples_per_s"].get<double>(), 0);
  EXPECT_TRUE(jobs[2]["kpis"]["gpu_utilization_pct"].is_null()) << "a CPU job: unknown, not 0";
  auto table = ctl({"history", "--search", "H-1"});
  EXPECT_NE(table.out.find("h-1"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("h-2"), std::string::npos) << table.out;
  EXPECT_EQ(ctl({"history", "--state", "sideways"}).status.exitCode, 2);

  for (const char* format : {"csv", "json", "html", "pdf"}) {
    auto written = ctl({"report", "h-2", "--out", dir.file(std::string("h-2.") + format)});
    EXPECT_EQ(written.status.exitCode, 0) << format << ": " << written.err;
  }
  auto check = runProcess({"/usr/bin/python3", LOCKSTEP_SOURCE_DIR "/tests/check_reports.py", dir.path().string(),
                           "h-2", "2", "40", LOCKSTEP_SOURCE_DIR "/docs/report.schema.json"},
                          {}, dir, 120s);
  EXPECT_EQ(check.status.exitCode, 0) << check.out << check.err;
  // One meaning per figure (issue 15): an ended job's samples/s in `history` is the report's
  // training throughput (the mean over the job), not the last 10 s.
  const auto reportJson = nlohmann::json::parse(readText(dir.file("h-2.json")));
  EXPECT_DOUBLE_EQ(jobs[2]["kpis"]["samples_per_s"].get<double>(), reportJson["kpis"]["mean_samples_per_second"].get<double>());
  EXPECT_DOUBLE_EQ(jobs[2]["kpis"]["end_samples_per_s"].get<double>(), reportJson["kpis"]["samples_per_second"].get<double>());

  auto missing = ctl({"report", "h-2", "--out", dir.file("no/such/dir/r.html")});
  EXPECT_EQ(missing.status.exitCode, 1);
  EXPECT_NE(missing.err.find("no/such/dir"), std::string::npos) << missing.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("no")));
  auto unknownFormat = ctl({"report", "h-2", "--out", dir.file("r.docx")});
  EXPECT_EQ(unknownFormat.status.exitCode, 2);
  EXPECT_NE(unknownFormat.err.find("--format"), std::string::npos) << unknownFormat.err;

  auto compared = ctl({"compare", "h-1", "h-2", "--json"});
  ASSERT_EQ(compared.status.exitCode, 0) << compared.err;
  const auto c = nlohmann::json::parse(compared.out);
  ASSERT_EQ(c["scaling"].size(), 2u) << "same workload at 1 and 2 ranks: a scaling curve";
  EXPECT_EQ(c["scaling"][0][0], 1);
  EXPECT_EQ(c["scaling"][1][0], 2);
  // The 2-rank job's efficiency: its throughput over twice the 1-rank job's, from their history.
  const auto throughputOf = [&](const std::string& id) {
    for (const auto& j : jobs) {
      if (j["job_id"] == id) return j["kpis"]["samples_per_s"].get<double>();
    }
    return 0.0;
  };
  EXPECT_NEAR(c["scaling_efficiency"][1][1].get<double>(), 100 * throughputOf("h-2") / (2 * throughputOf("h-1")), 0.01)
      << compared.out;
  // What more ranks would buy (issue 19): h-1's step at 1 rank, h-2's all-reduce beyond, to 4x.
  ASSERT_TRUE(c.contains("projected_scaling")) << compared.out;
  const auto& projected = c["projected_scaling"];
  ASSERT_EQ(projected.size(), 4u) << compared.out;
  for (std::size_t i = 0; i < projected.size(); ++i) {
    EXPECT_EQ(projected[i][0], 1 << i) << compared.out;
    EXPECT_GT(projected[i][1].get<double>(), 0) << compared.out;
  }
  auto text = ctl({"compare", "h-1", "h-2"});
  EXPECT_NE(text.out.find("projected (docs/kpis.md):"), std::string::npos) << text.out;
  auto apart = ctl({"compare", "h-1", "h-watched", "--json"});
  EXPECT_FALSE(nlohmann::json::parse(apart.out).contains("scaling")) << "different workloads do not make a curve";

  ASSERT_EQ(ctl({"history", "delete", "h-1"}).status.exitCode, 0);
  EXPECT_EQ(nlohmann::json::parse(ctl({"history", "--json"}).out).size(), 2u);
  auto again = ctl({"history", "delete", "h-1"});
  EXPECT_EQ(again.status.exitCode, 1);
  EXPECT_NE(again.err.find("no job h-1"), std::string::npos) << again.err;
}

// Issue 7: elastic restarts, followed by lockstepctl start --wait (rank 0's agent supervises them).

// Starts `lockstepctl start --wait ...` in the background; its output goes to DIR/NAME.out.
pid_t startWaiting(const Ctl& ctl, const std::string& name, std::vector<std::string> args) {
  args.insert(args.begin(), lockstepctlPath());
  return startProcess(args, {{"LOCKSTEP_CONFIG_DIR", ctl.configDir}, {"LOCKSTEP_HISTORY", ctl.historyPath()}},
                      ctl.dir.file(name + ".out"), ctl.dir.file(name + ".err"));
}

int exitCodeOf(pid_t pid, std::chrono::seconds timeout) {
  auto status = waitProcess(pid, timeout);
  if (!status || !*status) {
    ::kill(pid, SIGKILL);
    (void)waitProcess(pid, 5s);
    return -1;
  }
  return (*status)->signal ? 128 + (*status)->signal : (*status)->exitCode;
}

bool hasCheckpoint(const std::string& dir, std::uint64_t step) {
  char name[64];
  std::snprintf(name, sizeof name, "/step-%08llu.safetensors", static_cast<unsigned long long>(step));
  return std::filesystem::exists(dir + name);
}

// Norm-wise relative difference over all tensors of two safetensors files (weights and optimizer).
double checkpointDifference(const std::string& a, const std::string& b) {
  auto x = trainer::readSafetensors(a), y = trainer::readSafetensors(b);
  if (!x || !y) return INFINITY;
  double diff = 0, norm = 0;
  for (const auto& [name, t] : x->tensors) {
    const auto it = y->tensors.find(name);
    if (it == y->tensors.end() || it->second.data.size() != t.data.size()) return INFINITY;
    for (std::size_t i = 0; i < t.data.size(); ++i) {
      diff += std::pow(double(t.data[i]) - it->second.data[i], 2);
      norm += std::pow(double(t.data[i]), 2);
    }
  }
  return std::sqrt(diff / norm);
}

const std::vector<std::string> kElasticJob = {
    "--layers", "64,256,10", "--dataset", "synthetic:n=3072,dim=64,seed=3", "--no-shuffle", "--lr", "0.05",
    "--momentum", "0.9", "--checkpoint-every", "50", "--keep-checkpoints", "1000", "--timeout-s", "10"};

// Two agents on this machine and a job under `lockstepctl start --wait` (or, with follow false,
// started by a lockstepctl that then exits), past its checkpoint at step 100. (This machine has 2
// cores and an agent runs at most a rank per core: 3 ranks need two.)
struct SupervisedJob {
  SupervisedJob(const std::string& jobId, const std::string& ranksPerAgent, const std::string& batch,
                const std::string& steps, const std::string& restarts, const std::string& timeoutS = "5",
                bool follow = true, const std::vector<std::string>& extra = {})
      : a(dir, "node-a"), b(dir, "node-b"), ctl{dir, dir.file("config")}, ckpt(dir.file("ckpt")), id(jobId) {
    paired = ctl.pairWith(a) && ctl.pairWith(b);
    std::vector<std::string> args = join({"--timeout-s", timeoutS, "start", "--ranks-per-agent", ranksPerAgent, "--job-id",
                                          id, "--batch-per-rank", batch, "--steps", steps, "--checkpoint-dir", ckpt,
                                          "--max-restarts", restarts},
                                         join(kElasticJob, extra));
    if (follow) {
      args.insert(args.begin() + 5, "--wait");
      pid = startWaiting(ctl, id, args);
    } else {
      started = ctl(args);
    }
    running = paired && waitUntil([&] { return hasCheckpointFrom(ckpt, 100); }, 60s);
  }
  std::string out() const { return readText(dir.file(id + ".out")); }
  std::string err() const { return readText(dir.file(id + ".err")); }

  TempDir dir;
  AgentProcess a, b;
  Ctl ctl;
  std::string ckpt, id;
  bool paired = false, running = false;
  pid_t pid = -1;
  ProcessResult started;  // of a lockstepctl that did not follow
};

TEST(Lockstepctl, ALostRankRestartsTheJobWithTheRanksLeftFromItsLastCheckpoint) {
  // Fixed buckets: the comparison below needs the same sums in the same order, and backward cuts
  // its GEMMs at bucket ends (measured plans may differ between two runs).
  SupervisedJob job("el-1", "2,1", "64", "6000", "2", "5", true, {"--bucket-mb", "1"});
  ASSERT_TRUE(job.running) << job.err();
  const TempDir& dir = job.dir;
  const std::string& ckpt = job.ckpt;
  const pid_t ctlPid = job.pid;
  Ctl& ctl = job.ctl;
  AgentProcess& agent = job.a;
  const auto victim = rankProcess("el-1", 1);
  ASSERT_TRUE(victim);
  ::kill(*victim, SIGKILL);
  ASSERT_TRUE(waitUntil([&] { return readText(dir.file("el-1.out")).find("restart 1 of 2") != std::string::npos; }, 60s))
      << readText(dir.file("el-1.out"));
  EXPECT_EQ(exitCodeOf(ctlPid, 180s), 0) << readText(dir.file("el-1.out")) << readText(dir.file("el-1.err"));
  const std::string out = readText(dir.file("el-1.out"));
  EXPECT_NE(out.find("rank 1 on node-"), std::string::npos) << out;  // the agents' order decides which node
  EXPECT_NE(out.find("killed by signal 9"), std::string::npos) << out;
  EXPECT_NE(out.find("restart 1 of 2 with 2 ranks from the last checkpoint"), std::string::npos) << out;
  EXPECT_NE(out.find("job el-1: finished"), std::string::npos) << out;

  // The second attempt: 2 ranks of 96 rows (the global batch kept), from a checkpoint, to the end.
  const auto lines = readJsonLines(agent.stateDir() + "/jobs/el-1/metrics.jsonl");
  ASSERT_FALSE(lines.empty());
  std::uint64_t first = ~0ull;
  for (const auto& l : lines) {
    EXPECT_EQ(l["attempt"], 1);
    EXPECT_EQ(l["world_size"], 2);
    EXPECT_EQ(l["samples"], 96);
    first = std::min(first, l["step"].get<std::uint64_t>());
  }
  const std::uint64_t resumedFrom = first - 1;
  ASSERT_EQ(resumedFrom % 50, 0u) << "resumed at a checkpoint";
  ASSERT_GE(resumedFrom, 100u);
  ASSERT_TRUE(hasCheckpoint(ckpt, 6000));
  // --keep-checkpoints 1000 reached the job (lockstepctl once dropped it, and kept 3).
  ASSERT_TRUE(hasCheckpoint(ckpt, resumedFrom)) << "the checkpoint it resumed from was pruned";
  ASSERT_TRUE(hasCheckpoint(ckpt, 100));

  // Its end equals a 2-rank run resumed by hand from that same checkpoint.
  const std::string manual = dir.file("manual");
  std::filesystem::create_directories(manual);
  char name[64];
  std::snprintf(name, sizeof name, "/step-%08llu.safetensors", static_cast<unsigned long long>(resumedFrom));
  std::filesystem::copy_file(ckpt + name, manual + name);
  // One BLAS thread per rank, as each agent gave its one rank one core (--cpus-per-rank 1, the
  // default): the same sums in the same order.
  auto byHand = runProcess(join({trainerPath(), "--nproc", "2", "--threads", "1", "--batch-per-rank", "96", "--steps",
                                 "6000", "--checkpoint-dir", manual, "--resume", "--quiet", "--bucket-mb", "1"},
                                kElasticJob),
                           {}, dir, 300s);
  ASSERT_TRUE(byHand.status.success()) << byHand.err;
  EXPECT_LE(checkpointDifference(ckpt + "/step-00006000.safetensors", manual + "/step-00006000.safetensors"), 1e-6);

  // The history keeps both attempts' reports, marked as such.
  auto report = ctl({"report", "el-1", "--out", dir.file("el-1.json")});
  ASSERT_EQ(report.status.exitCode, 0) << report.err;
  const auto json = nlohmann::json::parse(readText(dir.file("el-1.json")));
  EXPECT_EQ(json["kpis"]["attempts"], 2);
  bool restartEvent = false;
  for (const auto& e : json["events"]) {
    const std::string m = e["message"];
    restartEvent |= m.find("restart 1 started on node-") != std::string::npos && m.find("with 2 ranks") != std::string::npos &&
                    m.find("resuming after step " + std::to_string(resumedFrom)) != std::string::npos &&
                    m.find("killed by signal 9") != std::string::npos;
  }
  EXPECT_TRUE(restartEvent) << json["events"].dump();
}

// Kills a node of the job: its agent and its ranks.
void killNode(const std::string& jobId, AgentProcess& node) {
  std::vector<pid_t> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    if (auto pid = rankProcess(jobId, rank, node.stateDir())) ranks.push_back(*pid);
  }
  ASSERT_EQ(ranks.size(), 2u);
  node.kill();
  for (pid_t pid : ranks) ::kill(pid, SIGKILL);
}

// The agents' order decides which node runs rank 0, and so supervises the job.
bool supervises(const std::string& jobId, const AgentProcess& node) { return rankProcess(jobId, 0, node.stateDir()).has_value(); }

TEST(Lockstepctl, ALostNodeLeavesTheJobToTheOtherNode) {
  SupervisedJob job("el-2", "2,2", "32", "6000", "1", "3");
  ASSERT_TRUE(job.running) << job.err();
  const TempDir& dir = job.dir;
  const pid_t ctlPid = job.pid;
  // The node that does not supervise the job goes.
  const bool aSupervises = supervises("el-2", job.a);
  AgentProcess& survivor = aSupervises ? job.a : job.b;
  AgentProcess& lost = aSupervises ? job.b : job.a;
  killNode("el-2", lost);
  EXPECT_EQ(exitCodeOf(ctlPid, 180s), 0) << readText(dir.file("el-2.out")) << readText(dir.file("el-2.err"));
  const std::string out = readText(dir.file("el-2.out"));
  EXPECT_NE(out.find("node " + lost.name() + " (agent " + lost.address().text() + ") stopped answering"), std::string::npos)
      << out;
  EXPECT_NE(out.find("restart 1 of 1 with 2 ranks"), std::string::npos) << out;
  const auto lines = readJsonLines(survivor.stateDir() + "/jobs/el-2/metrics.jsonl");
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["step"], 6000);
  EXPECT_EQ(lines.back()["world_size"], 2);
  EXPECT_EQ(lines.back()["samples"], 64);  // 4 x 32, now on 2 ranks

  // Each attempt chose its buckets for its own world (issue 34): rank 0's notes, through its agent.
  const std::string path = dir.file("el-2.json");
  auto report = job.ctl({"report", "el-2", "--out", path});
  ASSERT_EQ(report.status.exitCode, 0) << report.err;
  bool plannedForFour = false, plannedForTwo = false;
  const auto json = nlohmann::json::parse(readText(path));
  for (const auto& e : json["events"]) {
    const std::string m = e["message"];
    if (e["kind"] == "note" && m.rfind("buckets: ", 0) == 0) {
      plannedForFour |= m.find("among 4 ranks") != std::string::npos;
      plannedForTwo |= m.find("among 2 ranks") != std::string::npos;
    }
  }
  EXPECT_TRUE(plannedForFour && plannedForTwo) << readText(path);
}

// Issue 15: the supervisor is rank 0's agent; when its node goes, the second agent, standing by,
// takes over and restarts the job on the node left.
TEST(Lockstepctl, LosingTheSupervisingNodeLeavesTheJobToTheStandby) {
  SupervisedJob job("el-5", "2,2", "32", "6000", "1", "3");
  ASSERT_TRUE(job.running) << job.err();
  const bool aSupervises = supervises("el-5", job.a);
  AgentProcess& supervisor = aSupervises ? job.a : job.b;
  AgentProcess& standby = aSupervises ? job.b : job.a;
  killNode("el-5", supervisor);
  EXPECT_EQ(exitCodeOf(job.pid, 180s), 0) << job.out() << job.err();
  EXPECT_NE(job.out().find("node " + supervisor.name() + " (agent " + supervisor.address().text() + ") stopped answering"),
            std::string::npos)
      << job.out();
  EXPECT_NE(job.out().find("restart 1 of 1 with 2 ranks"), std::string::npos) << job.out();
  EXPECT_NE(readText(standby.stateDir() + "/agent.log").find("took over its supervision from node " + supervisor.name()),
            std::string::npos);
  const auto lines = readJsonLines(standby.stateDir() + "/jobs/el-5/metrics.jsonl");
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["step"], 6000);
  EXPECT_EQ(lines.back()["world_size"], 2);
}

// A stop asked of one node's agent reaches the other node's ranks through the trainer's stop vote,
// before that node's agent is asked or without it. That part stopped: it did not fail, and a job
// that may restart is not restarted. (The standby is asked here: it passes the stop on to no one.)
TEST(Lockstepctl, AStopAskedOfOneNodeStopsTheJobOnEveryNodeWithoutARestart) {
  SupervisedJob job("half", "1,1", "32", "100000000", "1", "5", false);
  ASSERT_EQ(job.started.status.exitCode, 0) << job.started.err;
  ASSERT_TRUE(job.running) << job.started.err;
  const bool aSupervises = supervises("half", job.a);
  const AgentProcess& supervisor = aSupervises ? job.a : job.b;
  const AgentProcess& asked = aSupervises ? job.b : job.a;
  ASSERT_TRUE(connectAuthorized(asked, job.dir)->stopJob("half", 0, 10s).ok());
  auto client = connectAuthorized(supervisor, job.dir);
  const auto status = jobVerdict(*client, "half");
  ASSERT_TRUE(status && status->supervision.state == SupervisionState::kEnded);
  EXPECT_EQ(status->supervision.outcome, JobState::kStopped) << status->supervision.message;
  EXPECT_EQ(status->spec.attempt, 0u) << "not restarted";
  EXPECT_EQ(status->state, JobState::kStopped) << status->message;
  EXPECT_FALSE(status->stopAsked);
  EXPECT_NE(status->message.find("before node " + supervisor.name() + "'s agent was asked to stop them"), std::string::npos)
      << status->message;
  const auto shown = nlohmann::json::parse(job.ctl({"--json", "status", "half"}).out);
  EXPECT_EQ(shown["state"], "stopped") << shown.dump();
  for (const auto& r : shown["ranks"]) {
    EXPECT_EQ(r["state"], "stopped") << r.dump();
    // The supervising node's rank ended at its peer's vote, as the trainer ends on a stop signal.
    if (r["node"] == supervisor.name()) {
      EXPECT_EQ(r["exit_code"], 128 + SIGTERM) << r.dump();
    }
  }
}

// A trainer rank given SIGTERM by something other than Lockstep (its node shutting down) stops every
// rank at its vote, and no agent was asked: a job that may restart goes on, as after a lost rank.
TEST(Lockstepctl, ATrainerRankStoppedFromOutsideRestartsAJobThatMayRestart) {
  SupervisedJob job("outside", "1,1", "32", "100000000", "1", "5", false);
  ASSERT_EQ(job.started.status.exitCode, 0) << job.started.err;
  ASSERT_TRUE(job.running) << job.started.err;
  // `watch` follows the job through its restart: its parts all ended, but its supervisor goes on.
  const pid_t watching = startWaiting(job.ctl, "watch", {"watch", "outside", "--json"});
  std::this_thread::sleep_for(1s);
  ::kill(*rankProcess("outside", 1), SIGTERM);
  ASSERT_TRUE(waitForRankOfAttempt("outside", 0, 1, 60s))
      << readText(job.a.stateDir() + "/agent.log") << readText(job.b.stateDir() + "/agent.log");
  const auto early = waitProcess(watching, 0ms);
  EXPECT_TRUE(early && !*early) << "watch ended before the restart: " << readText(job.dir.file("watch.out"));
  EXPECT_EQ(job.ctl({"stop", "outside"}).status.exitCode, 0);
  EXPECT_EQ(exitCodeOf(watching, 60s), 6) << "stopped: " << readText(job.dir.file("watch.err"));
}

// A program of the user's own fails as its peer goes. Its supervising agent, asked by a user to
// stop the job, asks every part to stop too, and the job ended stopped however its parts ended.
TEST(Lockstepctl, AStopAskedOfTheSupervisingAgentEndsAnOwnProgramStoppedThoughAPeerFailed) {
  TempDir dir;
  AgentProcess a(dir, "node-a"), b(dir, "node-b");
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(a) && ctl.pairWith(b));
  // Rank 0 holds rank 1's connection; rank 1 fails once it reads that rank 0 went, as a collective would.
  const char* program = R"(
import os, socket, sys, time
at = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
if os.environ["RANK"] == "0":
    peer, _ = socket.create_server(at).accept()
    time.sleep(3600)
for _ in range(600):
    try:
        peer = socket.create_connection(at)
        break
    except OSError:
        time.sleep(0.05)
peer.recv(1)
sys.exit(1))";
  auto run = ctl({"start", "--ranks-per-agent", "1,1", "--job-id", "own-half", "--", "/usr/bin/python3", "-c", program});
  ASSERT_EQ(run.status.exitCode, 0) << run.out << run.err;
  auto client = connectAuthorized(a, dir);
  const auto started = jobStatusOn(*client, "own-half");
  ASSERT_TRUE(started.has_value());
  if (started->spec.agents.front().node != a.name()) client = connectAuthorized(b, dir);
  std::optional<JobStatus> status;
  ASSERT_TRUE(waitUntil(
      [&] {
        status = jobStatusOn(*client, "own-half");
        return status && status->state == JobState::kRunning && status->supervision.state == SupervisionState::kFollowing;
      },
      30s));
  std::this_thread::sleep_for(500ms);  // rank 1 connected
  const pid_t watching = startWaiting(ctl, "watch", {"watch", "own-half", "--json"});
  std::this_thread::sleep_for(1s);
  ASSERT_TRUE(client->stopJob("own-half", 0, 10s).ok());
  status = jobVerdict(*client, "own-half");
  ASSERT_TRUE(status && status->supervision.state == SupervisionState::kEnded);
  EXPECT_EQ(status->supervision.outcome, JobState::kStopped) << status->supervision.message;
  EXPECT_EQ(status->supervision.message, "stopped on request");
  // lockstepctl shows the supervisor's verdict, though one part failed.
  const auto shown = nlohmann::json::parse(ctl({"--json", "status", "own-half"}).out);
  EXPECT_EQ(shown["state"], "stopped") << shown.dump();
  // So does `watch` (it waits for the verdict), and the history it recorded the job in.
  EXPECT_EQ(exitCodeOf(watching, 60s), 6) << readText(dir.file("watch.out")) << readText(dir.file("watch.err"));
  const auto kept = nlohmann::json::parse(ctl({"history", "--json"}).out);
  ASSERT_EQ(kept.size(), 1u) << kept.dump();
  EXPECT_EQ(kept[0]["state"], "stopped") << kept.dump();
}

// An agent keeps its newest --keep-jobs jobs; an ended job's supervision goes with it, and its id may
// name a new job, which is supervised as any other: before, it showed the old job's verdict, nothing
// supervised it, and the agent refused its restarts because a user had stopped the old one.
TEST(Lockstepctl, AJobIdTheAgentDroppedNamesANewSupervisedJob) {
  TempDir dir;
  AgentProcess agent(dir, "node-a", {"--keep-jobs", "1"});
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));
  const auto job = [&](const std::string& id, const std::string& steps) {
    return join({"start", "--job-id", id, "--ranks", "2", "--steps", steps, "--max-restarts", "1", "--checkpoint-dir",
                 dir.file("ckpt-" + id + steps)},
                kElasticJob);
  };
  ASSERT_EQ(ctl(job("again", "100000000")).status.exitCode, 0);
  ASSERT_EQ(ctl({"stop", "again"}).status.exitCode, 0);
  auto other = job("other", "20");
  other.insert(other.begin() + 1, "--wait");
  ASSERT_EQ(ctl(other).status.exitCode, 0);
  const auto dropped = ctl({"status", "again"});
  EXPECT_NE(dropped.status.exitCode, 0) << "the table keeps one job: " << dropped.out;

  const auto started = ctl(job("again", "200000000"));
  ASSERT_EQ(started.status.exitCode, 0) << started.err;
  nlohmann::json shown;
  ASSERT_TRUE(waitUntil(
      [&] {
        shown = nlohmann::json::parse(ctl({"--json", "status", "again"}).out, nullptr, false);
        return shown.is_object() && shown["state"] != "starting";
      },
      30s));
  EXPECT_EQ(shown["state"], "running") << shown.dump();
  EXPECT_EQ(shown["supervision"]["state"], "following") << shown.dump();
  ASSERT_TRUE(waitUntil([&] { return rankProcess("again", 1).has_value(); }, 30s));
  ::kill(*rankProcess("again", 1), SIGKILL);
  EXPECT_TRUE(waitForRankOfAttempt("again", 0, 1, 60s)) << "restarted: " << ctl({"status", "again"}).out;
  ASSERT_EQ(ctl({"stop", "again"}).status.exitCode, 0);
  shown = nlohmann::json::parse(ctl({"--json", "status", "again"}).out);
  EXPECT_EQ(shown["state"], "stopped") << shown.dump();
  EXPECT_EQ(shown["supervision"]["message"], "stopped on request") << shown.dump();
}

// The history keeps one job per id, and an agent takes an id again once it forgot its job (here it
// keeps one): start refuses an id the history holds, until that job is deleted from it.
TEST(Lockstepctl, ANewJobMayNotTakeTheIdOfAJobInTheHistory) {
  TempDir dir;
  AgentProcess agent(dir, "node-a", {"--keep-jobs", "1"});
  Ctl ctl{dir, dir.file("config")};
  ASSERT_TRUE(ctl.pairWith(agent));
  const auto run = [&](const std::string& id) {
    return ctl({"start", "--ranks", "1", "--wait", "--job-id", id, "--layers", "16,4", "--steps", "5"});
  };
  ASSERT_EQ(run("kept").status.exitCode, 0);
  ASSERT_EQ(run("other").status.exitCode, 0);  // the agent forgets "kept"
  const auto again = run("kept");
  EXPECT_EQ(again.status.exitCode, 1) << again.out;
  EXPECT_NE(again.err.find("job id kept names a job in the history already (it started "), std::string::npos)
      << again.err;
  EXPECT_NE(again.err.find("(lockstepctl history delete kept)"), std::string::npos) << again.err;
  EXPECT_EQ(nlohmann::json::parse(ctl({"history", "--json"}).out).size(), 2u);
  ASSERT_EQ(ctl({"history", "delete", "kept"}).status.exitCode, 0);
  EXPECT_EQ(run("kept").status.exitCode, 0) << "deleted from the history, the id is free";
}

TEST(Lockstepctl, ExhaustedRestartsFailWithWhatHappened) {
  SupervisedJob job("el-3", "2,1", "64", "9000", "1");
  ASSERT_TRUE(job.running) << job.err();
  const TempDir& dir = job.dir;
  const pid_t ctlPid = job.pid;
  ::kill(*rankProcess("el-3", 2), SIGKILL);
  // Once the restart runs (2 ranks, attempt 1), lose another rank.
  ASSERT_TRUE(waitUntil([&] { return readText(dir.file("el-3.out")).find("restart 1 of 1") != std::string::npos; }, 60s))
      << readText(dir.file("el-3.out"));
  const auto second = waitForRankOfAttempt("el-3", 1, 1, 30s);
  ASSERT_TRUE(second);
  ::kill(*second, SIGKILL);
  EXPECT_EQ(exitCodeOf(ctlPid, 120s), 5);
  const std::string out = readText(dir.file("el-3.out"));
  EXPECT_NE(out.find("what happened:"), std::string::npos) << out;
  EXPECT_NE(out.find("attempt 0 with 3 ranks: rank 2 on node-"), std::string::npos) << out;
  EXPECT_NE(out.find("attempt 1 with 2 ranks: rank 1 on node-"), std::string::npos) << out;
  EXPECT_NE(out.find("not restarted: no restarts left (1 allowed)"), std::string::npos) << out;
}

// Issue 15: the restart is the supervising agent's, so it happens with no client connected, and a
// client that comes later sees what happened.
TEST(Lockstepctl, AJobRestartsWithNoClientAndALaterClientSeesWhy) {
  SupervisedJob job("el-4", "2,1", "64", "3000", "1", "5", false);
  ASSERT_EQ(job.started.status.exitCode, 0) << job.started.err;
  ASSERT_TRUE(job.running) << job.started.err;
  ::kill(*rankProcess("el-4", 1), SIGKILL);
  ASSERT_TRUE(waitForRankOfAttempt("el-4", 0, 1, 60s))
      << readText(job.a.stateDir() + "/agent.log");
  auto status = job.ctl({"status", "el-4"});
  ASSERT_EQ(status.status.exitCode, 0) << status.err;
  EXPECT_NE(status.out.find("what happened:"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("attempt 0 with 3 ranks: rank 1 on node-"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("killed by signal 9"), std::string::npos) << status.out;
  ASSERT_TRUE(waitUntil(
      [&] {
        auto s = job.ctl({"--json", "status", "el-4"});
        if (s.status.exitCode != 0) return false;
        const auto j = nlohmann::json::parse(s.out);
        return j.contains("supervision") && j["supervision"]["state"] == "ended";
      },
      180s));
  const auto done = nlohmann::json::parse(job.ctl({"--json", "status", "el-4"}).out);
  EXPECT_EQ(done["supervision"]["message"], "") << done.dump();  // it finished: nothing went wrong at the end
  const auto lines = readJsonLines(job.a.stateDir() + "/jobs/el-4/metrics.jsonl");
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back()["step"], 3000);
  EXPECT_EQ(lines.back()["attempt"], 1);
}

}  // namespace
}  // namespace lockstep::test
