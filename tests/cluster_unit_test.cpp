// Issue 17's parts on their own: the agent's metrics page and its HTTP server, and what
// lockstepctl reads from Slurm's tools.

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <thread>

#include "lockstep/client/slurm.h"
#include "prometheus/page.h"
#include "support/test_support.h"

namespace lockstep::agent {
namespace {

using namespace std::chrono_literals;

JobStatus runningJob() {
  JobStatus s;
  s.spec.jobId = "j\"1";  // a quote, to be escaped in labels
  s.spec.worldSize = 2;
  s.spec.backend = Backend::kCuda;
  s.spec.ranks = {{0, "n", 0, 0u}, {1, "n", 1, 1u}};
  s.spec.prices = {3.6, 0.0, 0.0, "EUR"};
  s.state = JobState::kRunning;
  return s;
}

StepReport step(std::uint32_t rank, std::uint64_t n, std::int64_t timeUs) {
  StepReport r;
  r.jobId = "j\"1";
  r.rank = rank;
  r.worldSize = 2;
  r.step = n;
  r.samples = 50;
  r.loss = 0.25f;
  r.dataTimeUs = 100'000;
  r.computeTimeUs = 600'000;
  r.exposedCommTimeUs = 300'000;
  r.stepTimeUs = 1'000'000;
  r.timeUnixUs = timeUs;
  return r;
}

// One line of the page: "NAME{LABELS} VALUE", or empty when there is none.
std::string line(const std::string& page, const std::string& start) {
  const auto at = page.find("\n" + start);
  return at == std::string::npos ? "" : page.substr(at + 1, page.find('\n', at + 1) - at - 1);
}

TEST(MetricsPage, BaseUnitsCountersAndLabelsFromTheStreamAlone) {
  const std::vector<JobStatus> jobs = {runningJob()};
  const auto list = [&] { return jobs; };
  MetricsPage page("n");
  const std::int64_t t0 = 1'700'000'000'000'000;
  GpuSample gpu;
  gpu.node = "n";
  gpu.gpuIndex = 1;
  gpu.jobId = "j\"1";
  gpu.utilizationPct = 87.5f;
  gpu.memoryUsedBytes = 1u << 30;
  gpu.powerMilliwatts = 412'000;
  gpu.energyMillijoules = 5'000'000;
  gpu.smClockMhz = 1980;
  page.observe(gpu, list);  // no temperature: left out, not 0
  for (std::uint64_t s = 1; s <= 4; ++s) {
    page.observe(step(0, s, t0 + static_cast<std::int64_t>(s) * 1'000'000), list);
    page.observe(step(1, s, t0 + static_cast<std::int64_t>(s) * 1'000'000), list);
  }
  const std::string text = page.render(t0 + 4'000'000, jobs);

  EXPECT_EQ(line(text, "lockstep_gpu_utilization_ratio"), R"(lockstep_gpu_utilization_ratio{node="n",gpu="1",job_id="j\"1"} 0.875)");
  EXPECT_EQ(line(text, "lockstep_gpu_power_watts{"), R"(lockstep_gpu_power_watts{node="n",gpu="1",job_id="j\"1"} 412)");
  EXPECT_EQ(line(text, "lockstep_gpu_energy_joules_total"), R"(lockstep_gpu_energy_joules_total{node="n",gpu="1",job_id="j\"1"} 5000)");
  EXPECT_EQ(line(text, "lockstep_gpu_sm_clock_hertz{"), R"(lockstep_gpu_sm_clock_hertz{node="n",gpu="1",job_id="j\"1"} 1980000000)");
  EXPECT_EQ(line(text, "lockstep_gpu_temperature_celsius{"), "");
  EXPECT_NE(text.find("# TYPE lockstep_gpu_energy_joules counter\n# UNIT lockstep_gpu_energy_joules joules\n"), std::string::npos);
  // Each rank: 50 samples a second, a 1 s step of which 0.3 s exposed communication.
  EXPECT_EQ(line(text, "lockstep_rank_steps_total"), R"(lockstep_rank_steps_total{node="n",job_id="j\"1",rank="0"} 4)");
  EXPECT_EQ(line(text, "lockstep_rank_samples_per_second"), R"(lockstep_rank_samples_per_second{node="n",job_id="j\"1",rank="0"} 50)");
  EXPECT_EQ(line(text, "lockstep_rank_step_seconds"), R"(lockstep_rank_step_seconds{node="n",job_id="j\"1",rank="0"} 1)");
  EXPECT_EQ(line(text, "lockstep_rank_exposed_communication_seconds{"),
            R"(lockstep_rank_exposed_communication_seconds{node="n",job_id="j\"1",rank="0"} 0.3)");
  EXPECT_EQ(line(text, "lockstep_rank_communication_overhead_ratio{"),
            R"(lockstep_rank_communication_overhead_ratio{node="n",job_id="j\"1",rank="0"} 0.3)");
  EXPECT_EQ(line(text, "lockstep_job_state{"), R"(lockstep_job_state{node="n",job_id="j\"1",state="running"} 1)");
  EXPECT_EQ(line(text, "lockstep_job_world_size{"), R"(lockstep_job_world_size{node="n",job_id="j\"1"} 2)");
  EXPECT_EQ(line(text, "lockstep_job_stalled{"), R"(lockstep_job_stalled{node="n",job_id="j\"1"} 0)");
  // Issue 32: stalled, with the seconds since each rank's progress moved.
  auto stalled = jobs;
  stalled[0].stall = Stall{t0, "rank 1 did not reach all-reduce #3", {1}};
  RankProgress still;
  still.rank = 1;
  still.recorded = true;
  still.stillMs = 43'500;
  stalled[0].progress = {still};
  const std::string stuck = page.render(t0 + 4'000'000, stalled);
  EXPECT_EQ(line(stuck, "lockstep_job_stalled{"), R"(lockstep_job_stalled{node="n",job_id="j\"1"} 1)");
  EXPECT_EQ(line(stuck, "lockstep_rank_progress_age_seconds{"),
            R"(lockstep_rank_progress_age_seconds{node="n",job_id="j\"1",rank="1"} 43.5)");
  // Two GPUs (the placements) for 4 s: 8 GPU-seconds, at 3.6 EUR an hour: 0.008 EUR.
  EXPECT_EQ(line(text, "lockstep_job_gpu_seconds_total"), R"(lockstep_job_gpu_seconds_total{node="n",job_id="j\"1"} 8)");
  const std::string cost = line(text, "lockstep_job_cost_total");
  ASSERT_EQ(cost.rfind(R"(lockstep_job_cost_total{node="n",job_id="j\"1",currency="EUR"} )", 0), 0u) << cost;
  EXPECT_NEAR(std::stod(cost.substr(cost.rfind(' ') + 1)), 0.008, 1e-12);
  EXPECT_EQ(text.substr(text.size() - 6), "# EOF\n");

  // Ended: the counters and the state stay, the rates go; a job the agent forgot goes entirely.
  auto ended = jobs;
  ended[0].state = JobState::kFinished;
  ended[0].endedUnixUs = t0 + 4'000'000;
  const std::string after = page.render(t0 + 9'000'000, ended);
  EXPECT_NE(line(after, "lockstep_rank_steps_total"), "");
  EXPECT_EQ(line(after, "lockstep_rank_samples_per_second"), "");
  EXPECT_EQ(line(after, "lockstep_job_state{"), R"(lockstep_job_state{node="n",job_id="j\"1",state="finished"} 1)");
  const std::string forgotten = page.render(t0 + 9'000'000, {});
  EXPECT_EQ(line(forgotten, "lockstep_rank_steps_total"), "");
  EXPECT_EQ(line(forgotten, "lockstep_job_state{"), "");
}

// Two nodes, a GPU rank on each: node n's page holds n's rank and GPU-seconds, so that the nodes'
// pages add up to the job; a GPU sample without an energy reading keeps the last one.
TEST(MetricsPage, ANodeCountsItsOwnPartAndKeepsTheLastEnergyReading) {
  std::vector<JobStatus> jobs = {runningJob()};
  jobs[0].spec.ranks = {{0, "n", 0, 0u}, {1, "m", 0, 0u}};
  const auto list = [&] { return jobs; };
  const std::int64_t t0 = 1'700'000'000'000'000;
  GpuSample gpu;
  gpu.node = "n";
  gpu.gpuIndex = 0;
  gpu.jobId = "j\"1";
  gpu.energyMillijoules = 7'000'000;
  gpu.powerMilliwatts = 300'000;

  MetricsPage page("n");
  page.observe(gpu, list);
  gpu.energyMillijoules.reset();
  gpu.powerMilliwatts = 310'000;
  page.observe(gpu, list);
  for (std::uint64_t s = 1; s <= 4; ++s) page.observe(step(0, s, t0 + static_cast<std::int64_t>(s) * 1'000'000), list);
  const std::string text = page.render(t0 + 4'000'000, jobs);
  EXPECT_EQ(line(text, "lockstep_gpu_energy_joules_total"), R"(lockstep_gpu_energy_joules_total{node="n",gpu="0",job_id="j\"1"} 7000)");
  EXPECT_EQ(line(text, "lockstep_gpu_power_watts{"), R"(lockstep_gpu_power_watts{node="n",gpu="0",job_id="j\"1"} 310)");
  // The node's interfaces, as the kernel counts them: bytes, and the link's speed in bytes/s.
  page.observe(NetSample{"n", "eth0", t0, 1000, 2000, 10, 20, 0u, 1u, std::nullopt, 0u, 25'000'000'000ull}, list);
  const std::string withNet = page.render(t0 + 4'000'000, jobs);
  EXPECT_EQ(line(withNet, "lockstep_network_transmit_bytes_total"), R"(lockstep_network_transmit_bytes_total{node="n",interface="eth0"} 2000)");
  EXPECT_EQ(line(withNet, "lockstep_network_speed_bytes_per_second"),
            R"(lockstep_network_speed_bytes_per_second{node="n",interface="eth0"} 3125000000)");
  EXPECT_EQ(line(withNet, "lockstep_network_receive_drops_total"), "") << "unknown, not 0";
  // One GPU for 4 s here (the other rank's GPU is node m's to count).
  EXPECT_EQ(line(text, "lockstep_job_gpu_seconds_total"), R"(lockstep_job_gpu_seconds_total{node="n",job_id="j\"1"} 4)");

  // A Slurm allocation of 8 GPUs over the two nodes: 4 of them here.
  jobs[0].spec.jobId = jobs[0].spec.jobId + "s";
  jobs[0].spec.allocatedGpus = 8;
  MetricsPage slurmPage("n");
  for (std::uint64_t s = 1; s <= 4; ++s) {
    StepReport r = step(0, s, t0 + static_cast<std::int64_t>(s) * 1'000'000);
    r.jobId = jobs[0].spec.jobId;
    slurmPage.observe(r, list);
  }
  EXPECT_EQ(line(slurmPage.render(t0 + 4'000'000, jobs), "lockstep_job_gpu_seconds_total"),
            R"(lockstep_job_gpu_seconds_total{node="n",job_id="j\"1s"} 16)");
}

// Issue 46: model FLOPs utilization per rank and for this node's part, while the job runs. Rank 0
// counts 4e13 FLOPs a 1 s step, rank 1 2e13, each against a 100 TFLOP/s peak: 0.4, 0.2, and 0.3
// for the job (6e13 FLOP/s of 2e14). Without a peak there is no MFU, only the FLOP/s.
TEST(MetricsPage, ModelFlopsUtilizationOfEachRankAndTheJob) {
  std::vector<JobStatus> jobs = {runningJob()};
  const auto list = [&] { return jobs; };
  const std::int64_t t0 = 1'700'000'000'000'000;
  const auto observeSteps = [&](MetricsPage& page, std::optional<double> peak) {
    for (std::uint64_t s = 1; s <= 4; ++s) {
      for (std::uint32_t rank : {0u, 1u}) {
        StepReport r = step(rank, s, t0 + static_cast<std::int64_t>(s) * 1'000'000);
        r.flops = rank == 0 ? 4e13 : 2e13;
        r.peakFlops = peak;
        page.observe(r, list);
      }
    }
  };
  MetricsPage page("n");
  observeSteps(page, 1e14);
  const std::string text = page.render(t0 + 4'000'000, jobs);
  EXPECT_EQ(line(text, "lockstep_rank_model_flops_utilization{"),
            R"(lockstep_rank_model_flops_utilization{node="n",job_id="j\"1",rank="0"} 0.4)");
  EXPECT_NE(text.find("\n" R"(lockstep_rank_model_flops_utilization{node="n",job_id="j\"1",rank="1"} 0.2)" "\n"),
            std::string::npos) << text;
  EXPECT_EQ(line(text, "lockstep_job_model_flops_utilization{"),
            R"(lockstep_job_model_flops_utilization{node="n",job_id="j\"1"} 0.3)");
  EXPECT_EQ(line(text, "lockstep_job_model_flops_per_second{"),
            R"(lockstep_job_model_flops_per_second{node="n",job_id="j\"1"} 60000000000000)");
  EXPECT_EQ(line(text, "lockstep_job_peak_flops{"), R"(lockstep_job_peak_flops{node="n",job_id="j\"1"} 200000000000000)");
  EXPECT_NE(text.find("# TYPE lockstep_job_model_flops_utilization gauge\n# HELP lockstep_job_model_flops_utilization "),
            std::string::npos);

  MetricsPage noPeak("n");
  observeSteps(noPeak, std::nullopt);
  const std::string unknown = noPeak.render(t0 + 4'000'000, jobs);
  EXPECT_NE(line(unknown, "lockstep_job_model_flops_per_second{"), "");
  EXPECT_EQ(line(unknown, "lockstep_job_model_flops_utilization{"), "") << "unknown, not 0";
  EXPECT_EQ(line(unknown, "lockstep_job_peak_flops{"), "");
  EXPECT_EQ(line(unknown, "lockstep_rank_model_flops_utilization{"), "");

  jobs[0].state = JobState::kFinished;
  jobs[0].endedUnixUs = t0 + 4'000'000;
  const std::string ended = page.render(t0 + 9'000'000, jobs);
  EXPECT_EQ(line(ended, "lockstep_job_model_flops_utilization{"), "") << "a rate of the last 10 s: gone once it ended";
  EXPECT_EQ(line(ended, "lockstep_rank_model_flops_utilization{"), "");
}

// Issue 42: every collective a rank reports, by kind, as counters over the job (not the window);
// the built-in trainer's all-reduce (no collectives, an all-reduce time) counts as one.
TEST(MetricsPage, CollectivesAreCountedByRankAndKind) {
  std::vector<JobStatus> jobs = {runningJob()};
  const auto list = [&] { return jobs; };
  MetricsPage page("n");
  const std::int64_t t0 = 1'700'000'000'000'000;
  for (std::uint64_t s = 1; s <= 20; ++s) {  // 20 s: longer than the KPI engine's window
    StepReport r = step(0, s, t0 + static_cast<std::int64_t>(s) * 1'000'000);
    r.collectives = {{CollectiveKind::kReduceScatter, 2, 150'000, 50'000, 4u << 20},
                     {CollectiveKind::kAllGather, 4, 250'000, 100'000, 8u << 20}};
    page.observe(r, list);
    StepReport trainer = step(1, s, t0 + static_cast<std::int64_t>(s) * 1'000'000);
    trainer.allreduceTimeUs = 40'000;
    trainer.bytesReduced = 1000;
    page.observe(trainer, list);
  }
  const std::string text = page.render(t0 + 20'000'000, jobs);
  EXPECT_EQ(line(text, "lockstep_collective_seconds_total"),
            R"(lockstep_collective_seconds_total{node="n",job_id="j\"1",rank="0",kind="reduce_scatter"} 3)");
  EXPECT_NE(text.find(R"(lockstep_collective_exposed_seconds_total{node="n",job_id="j\"1",rank="0",kind="all_gather"} 2)" "\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find(R"(lockstep_collective_bytes_total{node="n",job_id="j\"1",rank="0",kind="all_gather"} 167772160)" "\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find(R"(lockstep_collectives_total{node="n",job_id="j\"1",rank="0",kind="all_gather"} 80)" "\n"),
            std::string::npos) << text;
  // The trainer's rank: 20 all-reduces of 1000 bytes, 0.8 s, exposed its 0.3 s a step.
  EXPECT_NE(text.find(R"(lockstep_collectives_total{node="n",job_id="j\"1",rank="1",kind="all_reduce"} 20)" "\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find(R"(lockstep_collective_exposed_seconds_total{node="n",job_id="j\"1",rank="1",kind="all_reduce"} 6)" "\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE lockstep_collective_bytes counter\n# UNIT lockstep_collective_bytes bytes\n"), std::string::npos);
  // Counters stay once the job ended.
  jobs[0].state = JobState::kFinished;
  jobs[0].endedUnixUs = t0 + 20'000'000;
  EXPECT_NE(line(page.render(t0 + 30'000'000, jobs), "lockstep_collectives_total"), "");
}

TEST(MetricsPage, TheGrafanaDashboardAsksOnlyForSeriesThePageHas) {
  const std::string dashboard = test::readText(std::string(LOCKSTEP_SOURCE_DIR) + "/resources/grafana-lockstep.json");
  ASSERT_FALSE(dashboard.empty());
  const auto names = MetricsPage::seriesNames();
  const std::regex series("lockstep_[a-z_]+");
  std::size_t asked = 0;
  for (auto it = std::sregex_iterator(dashboard.begin(), dashboard.end(), series); it != std::sregex_iterator(); ++it) {
    ++asked;
    EXPECT_NE(std::find(names.begin(), names.end(), it->str()), names.end()) << it->str() << " is not on the page";
  }
  EXPECT_GE(asked, 15u);
  EXPECT_EQ(dashboard.find("job=~"), std::string::npos) << "the job's label is job_id: job is Prometheus' own";
}

// A TCP connection to the server on loopback (-1: none).
int connectTo(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  ::close(fd);
  return -1;
}

// A raw HTTP exchange with the server: what it answers to `request` (empty: nothing).
std::string httpExchange(std::uint16_t port, const std::string& request, bool halfClose = true) {
  const int fd = connectTo(port);
  std::string answer;
  if (fd >= 0) {
    (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    if (halfClose) ::shutdown(fd, SHUT_WR);
    timeval wait{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    char buffer[4096];
    for (ssize_t n; (n = ::recv(fd, buffer, sizeof buffer, 0)) > 0;) answer.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return answer;
}

std::uint16_t portOf(const MetricsServer& server) {
  return static_cast<std::uint16_t>(std::stoi(server.address().substr(server.address().rfind(':') + 1)));
}

TEST(MetricsServer, ServesThePageAndNothingElseAndOutlastsBadClients) {
  auto server = MetricsServer::start("127.0.0.1:0");
  ASSERT_TRUE(server) << server.error().message;
  EXPECT_TRUE((*server)->loopback());
  const std::uint16_t port = portOf(**server);
  (*server)->publish("lockstep_job_world_size{node=\"n\",job_id=\"j\"} 2\n# EOF\n");

  const std::string ok = httpExchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("Content-Type: application/openmetrics-text; version=1.0.0"), std::string::npos) << ok;
  EXPECT_NE(ok.find("\r\n\r\nlockstep_job_world_size{node=\"n\",job_id=\"j\"} 2\n# EOF\n"), std::string::npos) << ok;
  EXPECT_EQ(httpExchange(port, "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(httpExchange(port, "POST /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  // Endless headers: cut off at the size limit, without an answer.
  EXPECT_EQ(httpExchange(port, "GET /metrics HTTP/1.1\r\n" + std::string(20000, 'x')), "");
  // A client that never finishes its request is dropped after the deadline; the next is served.
  const auto before = std::chrono::steady_clock::now();
  std::thread slow([&] { httpExchange(port, "GET /metr", false); });
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(httpExchange(port, "GET /metrics HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200 OK", 0), 0u);
  EXPECT_LT(std::chrono::steady_clock::now() - before, 4s);
  slow.join();
}

TEST(MetricsServer, ClientsThatStallHoldUpNoOtherScrape) {
  auto server = MetricsServer::start("127.0.0.1:0");
  ASSERT_TRUE(server) << server.error().message;
  const std::uint16_t port = portOf(**server);
  // Far more than the socket buffers hold: the server cannot hand it to the kernel in one go.
  const std::string page = std::string(32u << 20, '#') + "\n# EOF\n";
  (*server)->publish(page);

  // One client asks and never reads; ten connect and never ask.
  const int reader = connectTo(port);
  ASSERT_GE(reader, 0);
  const std::string ask = "GET /metrics HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::send(reader, ask.data(), ask.size(), MSG_NOSIGNAL), static_cast<ssize_t>(ask.size()));
  std::vector<int> silent;
  for (int i = 0; i < 10; ++i) silent.push_back(connectTo(port));
  std::this_thread::sleep_for(200ms);

  // Meanwhile a scrape gets the whole page, well before any of them is given up on (2 s).
  const auto before = std::chrono::steady_clock::now();
  const std::string answer = httpExchange(port, ask);
  const auto took = std::chrono::steady_clock::now() - before;
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer.substr(0, 200);
  EXPECT_EQ(answer.size() - answer.find("\r\n\r\n") - 4, page.size());
  EXPECT_LT(took, 1500ms) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  std::this_thread::sleep_for(2500ms);  // past the deadline: the stalled ones were dropped
  char byte;
  EXPECT_EQ(::recv(silent.front(), &byte, 1, MSG_DONTWAIT), 0) << "a silent client is closed after the deadline";
  ::close(reader);
  for (int fd : silent) ::close(fd);
}

TEST(MetricsServer, ListenAddressesAreCheckedAndLoopbackByDefault) {
  EXPECT_EQ(*parseMetricsListen("9464"), (std::pair<std::string, std::uint16_t>("127.0.0.1", 9464)));
  EXPECT_EQ(*parseMetricsListen(":9464"), (std::pair<std::string, std::uint16_t>("127.0.0.1", 9464)));
  EXPECT_EQ(*parseMetricsListen("0.0.0.0:9464"), (std::pair<std::string, std::uint16_t>("0.0.0.0", 9464)));
  EXPECT_EQ(*parseMetricsListen("[::1]:9464"), (std::pair<std::string, std::uint16_t>("::1", 9464)));
  auto bad = parseMetricsListen("127.0.0.1:http");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("give HOST:PORT"), std::string::npos) << bad.error().message;
  EXPECT_FALSE(parseMetricsListen("127.0.0.1:70000"));
  auto taken = MetricsServer::start("127.0.0.1:0");
  ASSERT_TRUE(taken);
  auto again = MetricsServer::start((*taken)->address());
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message.find("pick another port"), std::string::npos) << again.error().message;
}

TEST(SlurmJobInfo, StatesReasonsAndGpusFromScontrol) {
  auto running = slurm::parseJobInfo(
      "JobId=42 JobName=lockstep-j UserId=alice(1000) JobState=RUNNING Reason=None Dependency=(null) "
      "ExitCode=0:0 RunTime=00:00:07 TimeLimit=00:10:00 NumNodes=2 NumCPUs=16 "
      "TRES=cpu=16,mem=64G,node=2,billing=16,gres/gpu=8 Command=/home/alice/job.sbatch");
  ASSERT_TRUE(running) << running.error().message;
  EXPECT_EQ(running->id, "42");
  EXPECT_FALSE(running->ended());
  EXPECT_EQ(running->nodes, 2u);
  EXPECT_EQ(running->gpus, 8u);
  EXPECT_EQ(running->describe(), "Slurm job 42: RUNNING");

  // While Slurm ends a job its state reads COMPLETING; the reason tells how it will end.
  auto ending = slurm::parseJobInfo("JobId=42 JobState=COMPLETING Reason=TimeLimit ExitCode=0:0 NumNodes=1");
  EXPECT_EQ(ending->describe(), "Slurm job 42: TIMEOUT (TimeLimit)");
  EXPECT_EQ(slurm::parseJobInfo("JobId=42 JobState=COMPLETING Reason=None")->describe(), "Slurm job 42: CANCELLED");
  auto ended = slurm::parseJobInfo("JobId=43 JobState=NODE_FAIL Reason=NodeDown ExitCode=0:0");
  EXPECT_TRUE(ended->ended());
  EXPECT_EQ(ended->describe(), "Slurm job 43: NODE_FAIL (NodeDown)");
  EXPECT_TRUE(slurm::parseJobInfo("JobId=44 JobState=PENDING Reason=Resources")->pending());
  EXPECT_FALSE(slurm::parseJobInfo("slurm_load_jobs error: Invalid job id specified"));
}

}  // namespace
}  // namespace lockstep::agent
