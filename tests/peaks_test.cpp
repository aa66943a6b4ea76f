// Issue 46: the peak each rank's MFU is taken against, as the agent sets it on the step reports its
// ranks push (stream/peaks.h), and the CPU's, measured once by the real trainer and kept
// (sensors/cpu_peak.h).

#include <gtest/gtest.h>

#include <poll.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "base/log.h"
#include "loop/config.h"
#include "sensors/cpu_peak.h"
#include "stream/peaks.h"
#include "support/test_support.h"

namespace lockstep::agent {
namespace {

using test::TempDir;

StepReport counted(std::uint32_t rank, std::optional<Precision> precision) {
  StepReport r;
  r.jobId = "j";
  r.rank = rank;
  r.worldSize = 4;
  r.step = 1;
  r.flops = 1e9;
  r.precision = precision;
  r.peakFlops = 1e16;  // what a rank claims is not what the agent says
  return r;
}

// What a rank computes on, as the job manager would say.
Peaks::Hardware on(RankHardware hardware) {
  return [hardware] { return std::optional<RankHardware>(hardware); };
}

TEST(Peaks, ACpuRanksPeakIsItsCoresShareSaidOncePerJob) {
  Peaks peaks("n", {});
  peaks.setCpu({50e9, "one core's sgemm measured on n"});
  StepReport first = counted(0, Precision::kFp32);
  const auto said = peaks.stamp(first, on(RankHardware{std::nullopt, 2}));
  EXPECT_EQ(first.peakFlops, 100e9);
  ASSERT_TRUE(said);
  EXPECT_EQ(said->kind, JobEventKind::kPeak);
  EXPECT_EQ(said->jobId, "j");
  EXPECT_EQ(said->message, "2 cores × 50.0 GFLOP/s = 100.0 GFLOP/s per rank, fp32: one core's sgemm measured on n");
  StepReport again = counted(1, std::nullopt);  // a CPU rank that does not say computes in fp32
  EXPECT_FALSE(peaks.stamp(again, on(RankHardware{std::nullopt, 2}))) << "the same words, said once";
  EXPECT_EQ(again.peakFlops, 100e9);
  StepReport three = counted(2, Precision::kFp32);
  ASSERT_TRUE(peaks.stamp(three, on(RankHardware{std::nullopt, 3}))) << "another peak is said too";
  EXPECT_EQ(three.peakFlops, 150e9);

  StepReport uncounted = counted(0, Precision::kFp32);
  uncounted.flops.reset();
  EXPECT_FALSE(peaks.stamp(uncounted, on(RankHardware{std::nullopt, 2})));
  EXPECT_FALSE(uncounted.peakFlops) << "no FLOPs, no utilization to take: no peak either";
}

TEST(Peaks, AGpuRanksPeakIsItsDatasheetsAtThePrecisionItSays) {
  Peaks peaks("n", {GpuInfo{0, "NVIDIA H100 80GB HBM3", "GPU-0"}, GpuInfo{1, "NVIDIA GeForce RTX 3050", "GPU-1"}});
  StepReport bf16 = counted(0, Precision::kBf16);
  const auto said = peaks.stamp(bf16, on(RankHardware{0u, 8}));
  EXPECT_EQ(bf16.peakFlops, 989.5e12);
  ASSERT_TRUE(said);
  EXPECT_EQ(said->message, "989.5 TFLOP/s per GPU on n: NVIDIA H100 80GB HBM3 at bf16 (H100 SXM datasheet, dense)");

  StepReport unsaid = counted(1, std::nullopt);
  const auto why = peaks.stamp(unsaid, on(RankHardware{0u, 8}));
  EXPECT_FALSE(unsaid.peakFlops);
  ASSERT_TRUE(why);
  EXPECT_NE(why->message.find("do not say the precision"), std::string::npos) << why->message;

  StepReport unknown = counted(2, Precision::kBf16);
  const auto notInTable = peaks.stamp(unknown, on(RankHardware{1u, 8}));
  EXPECT_FALSE(unknown.peakFlops);
  ASSERT_TRUE(notInTable);
  EXPECT_EQ(notInTable->message,
            "no peak for NVIDIA GeForce RTX 3050 at bf16 on n: not in Lockstep's table of datasheet peaks; MFU unknown");
}

// Asked once per rank and attempt; a rank not known here gets no peak; said again after `resay`.
TEST(Peaks, TheHardwareIsAskedOncePerRankAndAttemptAndThePeakSaidAgainLater) {
  Peaks peaks("n", {}, std::chrono::milliseconds(200));
  peaks.setCpu({50e9, "measured"});
  int asked = 0;
  const auto counted2 = [&] {
    ++asked;
    return std::optional<RankHardware>(RankHardware{std::nullopt, 2});
  };
  StepReport first = counted(0, Precision::kFp32);
  EXPECT_TRUE(peaks.stamp(first, counted2));
  StepReport second = counted(0, Precision::kFp32);
  EXPECT_FALSE(peaks.stamp(second, counted2));
  EXPECT_EQ(second.peakFlops, 100e9);
  EXPECT_EQ(asked, 1) << "known: not asked again";
  StepReport restarted = counted(0, Precision::kFp32);
  restarted.attempt = 1;  // a restart may land elsewhere
  EXPECT_TRUE(peaks.stamp(restarted, on(RankHardware{std::nullopt, 4}))) << "its new peak is said";
  EXPECT_EQ(restarted.peakFlops, 200e9);
  StepReport stranger = counted(3, Precision::kFp32);
  EXPECT_FALSE(peaks.stamp(stranger, [] { return std::optional<RankHardware>(); }));
  EXPECT_FALSE(stranger.peakFlops);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  StepReport later = counted(0, Precision::kFp32);
  const auto again = peaks.stamp(later, counted2);
  ASSERT_TRUE(again) << "said again for clients that attached since";
  EXPECT_EQ(again->message, "2 cores × 50.0 GFLOP/s = 100.0 GFLOP/s per rank, fp32: measured");
}

TEST(Peaks, NoCpuPeakSaysWhy) {
  Peaks peaks("n", {});
  peaks.setCpu({std::nullopt, "cpu-peak = off on n"});
  StepReport off = counted(0, Precision::kFp32);
  const auto said = peaks.stamp(off, on(RankHardware{std::nullopt, 1}));
  EXPECT_FALSE(off.peakFlops);
  ASSERT_TRUE(said);
  EXPECT_EQ(said->message, "no CPU peak on n: cpu-peak = off on n; MFU unknown");
  peaks.setCpu({50e9, "measured"});
  StepReport bf16 = counted(0, Precision::kBf16);
  const auto notFp32 = peaks.stamp(bf16, on(RankHardware{std::nullopt, 1}));
  EXPECT_FALSE(bf16.peakFlops);
  ASSERT_TRUE(notFp32);
  EXPECT_EQ(notFp32->message, "no CPU peak for bf16 on n: only fp32 sgemm is measured; MFU unknown");
}

TEST(CpuPeak, TheFlagSetsMeasuresOrTurnsItOff) {
  TempDir dir;
  const auto parse = [&](const std::string& value) { return parseAgentArgs({"--state-dir", dir.path().string(), "--cpu-peak", value}); };
  EXPECT_EQ(parse("180.5")->cpuPeakGflops, 180.5);
  EXPECT_TRUE(parse("off")->cpuPeakOff);
  EXPECT_FALSE(parse("measure")->cpuPeakGflops);
  EXPECT_FALSE(parse("measure")->cpuPeakOff);
  for (const std::string bad : {"fast", "-3", "0", "1e9"}) {
    const auto refused = parse(bad);
    ASSERT_FALSE(refused.ok()) << bad;
    EXPECT_NE(refused.error().message.find("must be measure, off, or one core's GFLOP/s"), std::string::npos)
        << refused.error().message;
  }
}

// Whether the meter's measurement finished within `timeout` (its eventfd became readable).
bool finished(const CpuPeakMeter& meter, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  pollfd fd{meter.wakeFd(), POLLIN, 0};
  return ::poll(&fd, 1, static_cast<int>(timeout.count())) == 1;
}

// The real trainer measures; the figure is kept for the next start, and a failed measurement says why.
TEST(CpuPeak, MeasuredOnceByTheTrainerAndKept) {
  TempDir dir;
  Log log(dir.file("agent.log"));
  const CpuPeakSettings settings{"n", dir.path().string(), test::trainerPath(), std::nullopt, false};
  CpuPeakMeter meter(settings, log);
  EXPECT_FALSE(meter.now().perCore);
  EXPECT_EQ(meter.now().basis, "not yet measured on n");
  EXPECT_TRUE(meter.busy());
  // A job's rank starts while it measures: the figure is dropped, and measured again when idle.
  meter.tick(false);
  meter.tick(true);
  ASSERT_TRUE(finished(meter)) << "the measurement did not end within a minute";
  EXPECT_FALSE(meter.take()) << "disturbed: not taken";
  EXPECT_TRUE(meter.busy());
  EXPECT_FALSE(std::filesystem::exists(dir.file("cpu-peak.json"))) << "nor kept";
  meter.tick(true);
  EXPECT_FALSE(finished(meter, std::chrono::milliseconds(1500))) << "not measured while a job computes";
  meter.tick(false);
  ASSERT_TRUE(finished(meter));
  const std::optional<CpuPeak> measured = meter.take();
  ASSERT_TRUE(measured);
  EXPECT_FALSE(meter.busy());
  EXPECT_TRUE(std::filesystem::exists(dir.file("cpu-peak.json")));
  ASSERT_TRUE(measured->perCore) << measured->basis;
  EXPECT_GT(*measured->perCore, 1e9) << "a core of this decade does more than 1 GFLOP/s";
  EXPECT_NE(measured->basis.find("one core's sgemm measured on n on 20"), std::string::npos) << measured->basis;
  EXPECT_NE(measured->basis.find("kernels"), std::string::npos) << measured->basis;
  EXPECT_EQ(meter.now().perCore, measured->perCore);

  CpuPeakMeter restarted(settings, log);
  EXPECT_EQ(restarted.now().perCore, measured->perCore) << "kept: not measured again";
  EXPECT_EQ(restarted.now().basis, measured->basis);

  TempDir other;
  CpuPeakMeter failing({"n", other.path().string(), "/bin/false", std::nullopt, false}, log);
  failing.tick(false);
  ASSERT_TRUE(finished(failing));
  const std::optional<CpuPeak> failed = failing.take();
  ASSERT_TRUE(failed);
  EXPECT_FALSE(failed->perCore);
  EXPECT_NE(failed->basis.find("the sgemm measurement failed on n"), std::string::npos) << failed->basis;
}

}  // namespace
}  // namespace lockstep::agent
