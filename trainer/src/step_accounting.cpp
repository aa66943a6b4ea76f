#include "step_accounting.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "lockstep/common/clock.h"

namespace lockstep::trainer {
namespace {

constexpr double kLossSmoothing = 0.1;  // EMA weight of the newest loss for --target-loss

std::string withThousands(double v) {
  const std::string digits = std::to_string(static_cast<long long>(std::llround(v)));
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

StepAccounting::StepAccounting(const jobflags::TrainerOptions& options, const DistEnv& env, RankState& state)
    : options_(options), env_(env), state_(state) {
  logging_ = env.rank == 0 && !options.quiet;
  logEvery_ = options.logEvery > 0 ? options.logEvery : std::max<std::uint64_t>(1, (state.totalSteps - state.firstStep) / 20);
  summary_.firstStep = state.firstStep;
  summary_.stepsDone = state.firstStep;
  summary_.totalSteps = state.totalSteps;
}

void StepAccounting::start(std::size_t buckets) {
  runStart_ = logStart_ = Clock::now();
  printStart(buckets);
}

void StepAccounting::printStart(std::size_t buckets) const {
  if (!logging_) return;
  const JobSpec& spec = options_.spec;
  std::fprintf(stderr,
               "[lockstep] %u rank%s x batch %u x accum %u = global batch %llu | %llu parameters | %zu bucket%s | "
               "steps %llu..%llu\n",
               env_.worldSize, env_.worldSize == 1 ? "" : "s", spec.batchPerRank, spec.accumSteps,
               static_cast<unsigned long long>(spec.globalBatch()),
               static_cast<unsigned long long>(state_.layout->parameterCount()), buckets, buckets == 1 ? "" : "s",
               static_cast<unsigned long long>(state_.firstStep + 1), static_cast<unsigned long long>(state_.totalSteps));
}

StepReport StepAccounting::report(std::uint64_t step, std::uint32_t localSamples, double localLossSum,
                                  double globalLoss, double lr) const {
  StepReport report;
  stampSender(report, options_.spec.jobId, env_);
  report.step = step;
  report.epoch = state_.sampler->epochOf(step - 1);
  report.samples = localSamples;
  report.loss = localSamples > 0 ? static_cast<float>(localLossSum / localSamples) : NAN;
  report.globalLoss = static_cast<float>(globalLoss);
  report.timeUnixUs = unixMicrosNow();
  report.lr = lr;
  report.flops = localSamples * state_.layout->flopsPerSample();
  report.flopsBasis = FlopsBasis::kDeclared;
  report.precision = options_.spec.precision;
  return report;
}

Result<bool> StepAccounting::record(const StepReport& report, std::uint64_t globalSamples, double globalLoss,
                                    bool finalStep) {
  const JobSpec& spec = options_.spec;
  samplesSeen_ += globalSamples;
  smoothedLoss_ = smoothedLoss_ ? (1 - kLossSmoothing) * *smoothedLoss_ + kLossSmoothing * globalLoss : globalLoss;
  LOCKSTEP_TRY(state_.metrics->write(report));
  state_.progress.completed(report.step);
  sumStepUs_ += report.stepTimeUs;
  // The trainer measures every part of its steps: the optional fields are always set here.
  sumExposedUs_ += report.exposedCommTimeUs.value_or(0);
  logSamples_ += globalSamples;
  ++logSteps_;
  logStepUs_ += report.stepTimeUs;
  logDataUs_ += report.dataTimeUs.value_or(0);
  logComputeUs_ += report.computeTimeUs.value_or(0);
  logExposedUs_ += report.exposedCommTimeUs.value_or(0);
  summary_.stepsDone = report.step;
  summary_.finalLoss = globalLoss;
  const bool reachedTarget = spec.targetLoss && *smoothedLoss_ <= *spec.targetLoss;
  if (logging_ && ((report.step - state_.firstStep) % logEvery_ == 0 || finalStep || reachedTarget)) {
    printProgress(report, globalLoss);
  }
  if (reachedTarget) {
    summary_.reachedTargetLoss = true;
    if (logging_) {
      std::fprintf(stderr, "[lockstep] smoothed loss %.4f reached the target %.4f\n", *smoothedLoss_, *spec.targetLoss);
    }
  }
  return reachedTarget;
}

// The log line: means over the steps since the last one.
void StepAccounting::printProgress(const StepReport& report, double globalLoss) {
  const double seconds = std::chrono::duration<double>(Clock::now() - logStart_).count();
  const double n = static_cast<double>(logSteps_) * 1e3;
  std::fprintf(stderr,
               "[lockstep] step %llu/%llu | epoch %u | loss %.4f | %s samples/s | step %.1f ms: data %.1f, "
               "compute %.1f, comm wait %.1f\n",
               static_cast<unsigned long long>(report.step), static_cast<unsigned long long>(state_.totalSteps),
               report.epoch, globalLoss, withThousands(static_cast<double>(logSamples_) / seconds).c_str(),
               logStepUs_ / n, logDataUs_ / n, logComputeUs_ / n, logExposedUs_ / n);
  logStart_ = Clock::now();
  logSamples_ = logSteps_ = 0;
  logStepUs_ = logDataUs_ = logComputeUs_ = logExposedUs_ = 0;
}

void StepAccounting::finish() {
  summary_.seconds = std::chrono::duration<double>(Clock::now() - runStart_).count();
  summary_.samplesPerSecond = summary_.seconds > 0 ? static_cast<double>(samplesSeen_) / summary_.seconds : 0;
  summary_.exposedCommFraction =
      sumStepUs_ > 0 ? static_cast<double>(sumExposedUs_) / static_cast<double>(sumStepUs_) : 0;
}

}  // namespace lockstep::trainer
