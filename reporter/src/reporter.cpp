// The C API of lockstep/reporter.h over ReportSender.

#include "lockstep/reporter.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <new>
#include <optional>
#include <string>

#include "lockstep/common/clock.h"
#include "lockstep/common/progress.h"
#include "lockstep/protocol/validate.h"
#include "lockstep/reporter/sender.h"
#include "step_collectives.h"

struct lockstep_reporter {
  std::unique_ptr<lockstep::ReportSender> sender;  // null: outside Lockstep
  lockstep::StepReport identity;                    // job, rank, world size, attempt
  lockstep::progress::Writer progress;              // LOCKSTEP_PROGRESS, when the agent gave one
  std::uint64_t lastStep = 0;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  std::int64_t phasesUs = 0;  // reported phases since the last step: not the next step's time
  lockstep::StepCollectives collectives;  // since the last step
  std::uint32_t refusalsSaid = 0;         // StepCollectives::Refusal bits already said on stderr
  std::optional<double> flops;            // lockstep_step_flops, for the next report
  lockstep::FlopsBasis flopsBasis = lockstep::FlopsBasis::kDeclared;
  std::optional<lockstep::Precision> precision;
  std::uint32_t flopsRefusalsSaid = 0;    // lockstep_step_flops's reasons already said (bits)
};

namespace {

std::optional<std::uint32_t> envNumber(const char* name, std::string* problem) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const unsigned long value = std::strtoul(text, &end, 10);
  if (*end != '\0' || value > std::numeric_limits<std::uint32_t>::max()) {
    *problem = std::string(name) + "='" + text + "' is not a number";
    return std::nullopt;
  }
  return static_cast<std::uint32_t>(value);
}

template <class T>
std::optional<T> known(std::int64_t value) {
  if (value < 0) return std::nullopt;
  return static_cast<T>(value);
}

// A collective call's answer: 0, or -1 having said why (once per reason and reporter).
int refuse(lockstep_reporter* reporter, const std::optional<lockstep::StepCollectives::Refused>& refused) {
  if (!refused) return 0;
  const auto bit = static_cast<std::uint32_t>(refused->reason);
  if ((reporter->refusalsSaid & bit) == 0) {
    reporter->refusalsSaid |= bit;
    std::fprintf(stderr, "lockstep: collective not counted: %s (said once)\n", refused->message.c_str());
  }
  return -1;
}

}  // namespace

extern "C" {

void lockstep_step_init(lockstep_step_info* step) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  *step = lockstep_step_info{};
  step->loss = nan;
  step->global_loss = nan;
  step->tokens = LOCKSTEP_UNKNOWN;
  step->data_time_us = LOCKSTEP_UNKNOWN;
  step->compute_time_us = LOCKSTEP_UNKNOWN;
  step->exposed_comm_time_us = LOCKSTEP_UNKNOWN;
  step->allreduce_time_us = LOCKSTEP_UNKNOWN;
  step->bytes_reduced = LOCKSTEP_UNKNOWN;
  step->step_time_us = LOCKSTEP_UNKNOWN;
  step->time_unix_us = LOCKSTEP_UNKNOWN;
}

lockstep_reporter* lockstep_open(void) {
  auto* reporter = new (std::nothrow) lockstep_reporter;
  if (reporter == nullptr) return nullptr;
  reporter->progress = lockstep::progress::Writer::fromEnvironment();
  const char* endpoint = std::getenv("LOCKSTEP_REPORT");
  const char* jobId = std::getenv("LOCKSTEP_JOB_ID");
  if (endpoint == nullptr || *endpoint == '\0' || jobId == nullptr || *jobId == '\0') return reporter;  // not under Lockstep
  std::string problem;
  const auto rank = envNumber("RANK", &problem);
  const auto world = envNumber("WORLD_SIZE", &problem);
  const auto attempt = envNumber("LOCKSTEP_ATTEMPT", &problem);
  if (problem.empty() && (!lockstep::validateJobId(jobId) || rank.value_or(0) >= world.value_or(1))) {
    problem = "LOCKSTEP_JOB_ID, RANK and WORLD_SIZE do not name a rank of a job";
  }
  if (problem.empty()) {
    auto sender = lockstep::ReportSender::connect(endpoint);
    if (sender) {
      reporter->sender = std::move(sender).value();
    } else {
      problem = sender.error().message;
    }
  }
  if (!problem.empty()) {
    std::fprintf(stderr, "lockstep: not reporting steps: %s\n", problem.c_str());
    return reporter;
  }
  reporter->identity.jobId = jobId;
  reporter->identity.rank = rank.value_or(0);
  reporter->identity.worldSize = world.value_or(1);
  reporter->identity.attempt = attempt.value_or(0);
  return reporter;
}

int lockstep_active(const lockstep_reporter* reporter) { return reporter != nullptr && reporter->sender ? 1 : 0; }

int lockstep_report(lockstep_reporter* reporter, const lockstep_step_info* step) {
  if (reporter == nullptr || !reporter->sender) return 2;
  const auto now = std::chrono::steady_clock::now();
  lockstep::StepReport r = reporter->identity;
  r.step = step->step > 0 ? step->step : reporter->lastStep + 1;
  r.epoch = step->epoch;
  r.samples = step->samples;
  r.loss = static_cast<float>(step->loss);
  if (std::isfinite(step->global_loss)) r.globalLoss = static_cast<float>(step->global_loss);
  r.lr = std::isfinite(step->lr) && step->lr > 0 ? step->lr : 0.0;
  r.tokens = known<std::uint64_t>(step->tokens);
  r.dataTimeUs = known<std::int64_t>(step->data_time_us);
  r.computeTimeUs = known<std::int64_t>(step->compute_time_us);
  r.exposedCommTimeUs = known<std::int64_t>(step->exposed_comm_time_us);
  r.allreduceTimeUs = known<std::int64_t>(step->allreduce_time_us);
  r.bytesReduced = known<std::uint64_t>(step->bytes_reduced);
  r.stepTimeUs = step->step_time_us >= 0
                     ? step->step_time_us
                     : std::max<std::int64_t>(
                           0, std::chrono::duration_cast<std::chrono::microseconds>(now - reporter->last).count() - reporter->phasesUs);
  r.timeUnixUs = step->time_unix_us > 0 ? step->time_unix_us : lockstep::unixMicrosNow();
  reporter->collectives.takeInto(r);  // this step's, whether it leaves or not
  if (reporter->flops) {
    r.flops = reporter->flops;
    r.flopsBasis = reporter->flopsBasis;
  }
  r.precision = reporter->precision;
  reporter->flops.reset();
  reporter->precision.reset();
  if (auto valid = lockstep::validateStepReport(r); !valid) {
    std::fprintf(stderr, "lockstep: step %llu not reported: %s\n", static_cast<unsigned long long>(r.step),
                 valid.error().message.c_str());
    return -1;
  }
  reporter->lastStep = r.step;
  reporter->last = now;
  reporter->phasesUs = 0;
  reporter->progress.stepDone(static_cast<std::int64_t>(r.step));
  return reporter->sender->send(r) ? 0 : 1;
}

int lockstep_report_phase(lockstep_reporter* reporter, const char* name, int64_t end_unix_us, int64_t duration_us) {
  if (reporter == nullptr || !reporter->sender) return 2;
  lockstep::PhaseReport p;
  p.jobId = reporter->identity.jobId;
  p.rank = reporter->identity.rank;
  p.worldSize = reporter->identity.worldSize;
  p.attempt = reporter->identity.attempt;
  p.name = name != nullptr ? name : "";
  p.timeUnixUs = end_unix_us > 0 ? end_unix_us : lockstep::unixMicrosNow();
  p.durationUs = duration_us;
  p.step = reporter->lastStep;
  if (auto valid = lockstep::validatePhaseReport(p); !valid) {
    std::fprintf(stderr, "lockstep: phase not reported: %s\n", valid.error().message.c_str());
    return -1;
  }
  reporter->phasesUs += p.durationUs;
  return reporter->sender->send(p) ? 0 : 1;
}

int lockstep_step_flops(lockstep_reporter* reporter, double flops, int basis, int precision) {
  if (reporter == nullptr || !reporter->sender) return 2;
  const bool unknown = flops == static_cast<double>(LOCKSTEP_UNKNOWN);
  const char* why = nullptr;
  std::uint32_t bit = 0;
  if (!unknown && !(std::isfinite(flops) && flops >= 0)) {
    why = "flops must be a finite count >= 0 (or LOCKSTEP_UNKNOWN)";
    bit = 1;
  } else if (!unknown && flops > lockstep::kMaxStepFlops) {  // what validateStepReport takes
    why = "flops over 6e22 in one step (a unit mistaken?)";
    bit = 2;
  } else if (basis < 0 || basis > LOCKSTEP_FLOPS_LAYERS) {
    why = "basis is not one of LOCKSTEP_FLOPS_* (or 0)";
    bit = 4;
  } else if (precision < 0 || precision > LOCKSTEP_PRECISION_FP8) {
    why = "precision is not one of LOCKSTEP_PRECISION_* (or 0)";
    bit = 8;
  }
  if (why != nullptr) {
    if ((reporter->flopsRefusalsSaid & bit) == 0) {
      reporter->flopsRefusalsSaid |= bit;
      std::fprintf(stderr, "lockstep: flops not noted: %s (said once)\n", why);
    }
    return -1;
  }
  if (unknown) {
    reporter->flops.reset();
  } else {
    reporter->flops = flops;
    reporter->flopsBasis = basis > 0 ? static_cast<lockstep::FlopsBasis>(basis) : lockstep::FlopsBasis::kDeclared;
  }
  if (precision > 0) {
    reporter->precision = static_cast<lockstep::Precision>(precision);
  } else {
    reporter->precision.reset();
  }
  return 0;
}

uint64_t lockstep_dropped(const lockstep_reporter* reporter) {
  return reporter != nullptr && reporter->sender ? reporter->sender->dropped() : 0;
}

void lockstep_close(lockstep_reporter* reporter) { delete reporter; }

void lockstep_phase(lockstep_reporter* reporter, const char* name, int announced) {
  if (reporter != nullptr) reporter->progress.phase(name != nullptr ? name : "", announced != 0);
}

void lockstep_collective_begin(lockstep_reporter* reporter, uint32_t bucket, uint32_t buckets) {
  if (reporter != nullptr) reporter->progress.collectiveBegin(bucket, buckets);
}

void lockstep_collective_end(lockstep_reporter* reporter) {
  if (reporter == nullptr) return;
  reporter->progress.collectiveEnd();
  if (reporter->sender) reporter->collectives.end(std::chrono::steady_clock::now());
}

int lockstep_collective_start(lockstep_reporter* reporter, int kind, uint64_t bytes) {
  if (reporter == nullptr) return 2;
  // A stall names it, by its kind, counted or not (an unknown kind is said as "collective").
  reporter->progress.collectiveBegin(0, 0, kind > 0 ? static_cast<std::uint32_t>(kind) : 0);
  if (!reporter->sender) return 2;
  const auto now = std::chrono::steady_clock::now();
  return refuse(reporter, reporter->collectives.start(kind, bytes, now, lockstep::unixMicrosNow()));
}

int lockstep_collective_timed(lockstep_reporter* reporter, int kind, uint64_t bytes, int64_t start_unix_us,
                              int64_t duration_us, int64_t exposed_us) {
  if (reporter == nullptr || !reporter->sender) return 2;
  const std::int64_t now = start_unix_us < 0 ? lockstep::unixMicrosNow() : 0;
  return refuse(reporter, reporter->collectives.timed(kind, bytes, start_unix_us, duration_us, exposed_us, now));
}

int lockstep_collective_totals(lockstep_reporter* reporter, int kind, uint32_t count, int64_t time_us,
                               int64_t exposed_us, uint64_t bytes) {
  if (reporter == nullptr || !reporter->sender) return 2;
  return refuse(reporter, reporter->collectives.totals(kind, count, time_us, exposed_us, bytes));
}

}  // extern "C"
