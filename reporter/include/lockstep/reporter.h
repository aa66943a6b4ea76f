/* lockstep/reporter.h: step reports from your own program to the Lockstep agent that runs it.
 *
 * A rank started by lockstep-agent finds the agent through its environment (LOCKSTEP_REPORT,
 * LOCKSTEP_JOB_ID, RANK, WORLD_SIZE, LOCKSTEP_ATTEMPT). Outside Lockstep every call is a no-op,
 * so the same program runs under torchrun, mpirun or alone. Reports never block: when the agent
 * is slow or gone, a full queue drops reports and counts them (lockstep_dropped).
 *
 *     lockstep_reporter* reporter = lockstep_open();
 *     for (...) {
 *       ... one optimizer step ...
 *       lockstep_step_info step;
 *       lockstep_step_init(&step);
 *       step.samples = batch;
 *       step.loss = loss;
 *       step.compute_time_us = ...;   // what you measured; the rest stays unknown
 *       lockstep_report(reporter, &step);
 *     }
 *     lockstep_close(reporter);
 *
 * Threading: a reporter is used by one thread at a time (the training loop's). Link with
 * -llockstep-reporter (the lockstep-agent package; docs/own-program.md).
 */
#ifndef LOCKSTEP_REPORTER_H
#define LOCKSTEP_REPORTER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A time, count or size that was not measured: unknown, never shown as 0. */
#define LOCKSTEP_UNKNOWN (-1)

typedef struct lockstep_step_info {
  uint64_t step;               /* 1-based optimizer step; 0: the previous report's + 1 */
  uint32_t epoch;
  uint32_t samples;            /* this rank's samples in this step */
  double loss;                 /* this rank's mean loss; NaN: unknown */
  double global_loss;          /* the mean over all ranks, if the program all-reduced it; NaN: not */
  double lr;                   /* 0: unknown */
  int64_t tokens;              /* this rank's tokens in this step, for sequence models */
  int64_t data_time_us;        /* waiting for the batch */
  int64_t compute_time_us;     /* forward, backward and optimizer, not hidden communication */
  int64_t exposed_comm_time_us;/* waiting for all-reduce after the compute was done */
  int64_t allreduce_time_us;   /* all-reduce in total, hidden behind compute or not */
  int64_t bytes_reduced;       /* gradient bytes all-reduced in this step */
  int64_t step_time_us;        /* LOCKSTEP_UNKNOWN: the time since the previous report (or open),
                                  less the phases reported since (lockstep_report_phase) */
  int64_t time_unix_us;        /* when the step ended, microseconds since 1970; LOCKSTEP_UNKNOWN: now */
} lockstep_step_info;

typedef struct lockstep_reporter lockstep_reporter;

/* Every field unknown, step 0 (counted), samples 0. */
void lockstep_step_init(lockstep_step_info* step);

/* Connects to the agent named by the environment. Returns a reporter that does nothing when the
 * program runs outside Lockstep (or the environment is malformed: it says so once on stderr).
 * NULL only when out of memory. */
lockstep_reporter* lockstep_open(void);

/* 1 when reports go to an agent, 0 when this is a no-op reporter. */
int lockstep_active(const lockstep_reporter* reporter);

/* Sends one step's report without waiting. Returns 0 when queued, 1 when dropped (queue full),
 * 2 when inactive, -1 when the report is malformed (a negative time, say; stderr says why). */
int lockstep_report(lockstep_reporter* reporter, const lockstep_step_info* step);

/* A phase the program named has ended: `name` ("checkpoint", "eval"; 1 to 64 bytes of UTF-8) ran
 * for `duration_us` up to `end_unix_us` (LOCKSTEP_UNKNOWN: now). Lockstep's timeline draws it as
 * a box of its own, at the time it ran; it is not the next step's time (a step_time_us left
 * LOCKSTEP_UNKNOWN leaves it out). Meant for long phases: the agent takes 20 a second per
 * rank (in bursts of up to 60). Returns as lockstep_report. */
int lockstep_report_phase(lockstep_reporter* reporter, const char* name, int64_t end_unix_us, int64_t duration_us);

/* The model FLOPs this rank computed in the step about to be reported (forward and backward,
 * every micro-batch; not the optimizer's) and the precision its matrix math ran in, for Lockstep's
 * MFU (the agent knows the hardware's peak for that precision). Call it before lockstep_report:
 * the next report carries them, then they start over as unknown.
 *   flops: >= 0, or LOCKSTEP_UNKNOWN to give the precision alone;
 *   basis: how they were known: LOCKSTEP_FLOPS_DECLARED (or 0), counted by the program itself;
 *     LOCKSTEP_FLOPS_TOKENS, 6 x parameters x tokens; LOCKSTEP_FLOPS_LAYERS, counted on the
 *     model's layers;
 *   precision: one of LOCKSTEP_PRECISION_*, or 0 when not known.
 * Returns 0 when noted, 2 when inactive, -1 when refused (a negative or non-finite count, one over
 * 6e22, an unknown basis or precision; stderr says why, once per reason): nothing of the call is
 * kept, and the report still goes. (A function rather than fields of lockstep_step_info, whose
 * size programs built against an earlier header have fixed.) */
#define LOCKSTEP_FLOPS_DECLARED 1
#define LOCKSTEP_FLOPS_TOKENS 2
#define LOCKSTEP_FLOPS_LAYERS 3
#define LOCKSTEP_PRECISION_FP32 1
#define LOCKSTEP_PRECISION_TF32 2
#define LOCKSTEP_PRECISION_BF16 3
#define LOCKSTEP_PRECISION_FP16 4
#define LOCKSTEP_PRECISION_FP8 5

int lockstep_step_flops(lockstep_reporter* reporter, double flops, int basis, int precision);

/* Reports dropped so far. */
uint64_t lockstep_dropped(const lockstep_reporter* reporter);

/* Waits up to 2 s for queued reports to leave, then frees the reporter. NULL is allowed. */
void lockstep_close(lockstep_reporter* reporter);

/* Where the program is, for Lockstep's stall detection and `lockstepctl stacks` (the rank's
 * progress record in shared memory: no system call, no message). A report ends the step and
 * clears the phase.
 *
 * lockstep_phase: the program is now in `name` ("data", "forward", "eval"; at most 31 bytes).
 *   announced: 1 for a long phase the program names (a checkpoint, an evaluation), which is judged
 *   against its own earlier durations rather than the step's; 0 for a part of a step.
 * lockstep_collective_begin/end: around each collective (bucket k of n, 1-based; 0 if unknown),
 *   so that a stall names the ranks that did not reach the collective the others wait in. */
void lockstep_phase(lockstep_reporter* reporter, const char* name, int announced);
void lockstep_collective_begin(lockstep_reporter* reporter, uint32_t bucket, uint32_t buckets);
void lockstep_collective_end(lockstep_reporter* reporter);

/* The program's own collectives (NCCL, MPI): their kinds, times and sizes, for Lockstep's
 * communication figures and timeline. The kinds are lockstep.proto's CollectiveKind; `bytes` is
 * the size nccl-tests' bandwidths are of: all-reduce, broadcast, reduce: the buffer; all-gather,
 * gather: the whole output; reduce-scatter, scatter: the whole input; all-to-all: what this rank
 * sends; send/recv: what it sends; barrier: 0.
 *
 * Each call adds to the next lockstep_report, which carries the step's totals by kind and its
 * first 64 collectives one by one, then starts over. When that report leaves exposed_comm_time_us
 * LOCKSTEP_UNKNOWN, it becomes the sum of the collectives' exposed times (capped at the step's
 * time); a value the program gives is kept. Each returns 0 when counted, 2 when inactive, -1 when
 * refused (an unknown kind, a negative time, a time over a week; stderr says why, once per
 * reason). Memory is fixed: more collectives make no more of it. Like every call here, from one
 * thread at a time: a program that times its collectives on a communication thread of its own
 * hands the figures to the training loop's thread (lockstep_collective_timed there), or locks.
 *
 * lockstep_collective_start ... lockstep_collective_end: around a blocking collective: the library
 *   times it (a steady clock) and counts all of it as exposed. It also does what
 *   lockstep_collective_begin does for stall detection, so use one or the other. A start before
 *   the previous one ended is refused.
 * lockstep_collective_timed: one the program timed itself (an asynchronous one, its GPU events
 *   read later): issued at `start_unix_us` (LOCKSTEP_UNKNOWN: it ended now), `duration_us` from
 *   issue to completion, of which the rank waited `exposed_us`, computing nothing.
 * lockstep_collective_totals: `count` more collectives of `kind`, with their summed times and
 *   bytes, one by one in no timeline (many small ones, say). */
#define LOCKSTEP_ALL_REDUCE 1
#define LOCKSTEP_REDUCE_SCATTER 2
#define LOCKSTEP_ALL_GATHER 3
#define LOCKSTEP_BROADCAST 4
#define LOCKSTEP_ALL_TO_ALL 5
#define LOCKSTEP_BARRIER 6
#define LOCKSTEP_REDUCE 7
#define LOCKSTEP_GATHER 8
#define LOCKSTEP_SCATTER 9
#define LOCKSTEP_SEND_RECV 10
#define LOCKSTEP_PUSH 11 /* a worker's gradients to its parameter server */
#define LOCKSTEP_PULL 12 /* the server's weights back */

int lockstep_collective_start(lockstep_reporter* reporter, int kind, uint64_t bytes);
int lockstep_collective_timed(lockstep_reporter* reporter, int kind, uint64_t bytes, int64_t start_unix_us,
                              int64_t duration_us, int64_t exposed_us);
int lockstep_collective_totals(lockstep_reporter* reporter, int kind, uint32_t count, int64_t time_us,
                               int64_t exposed_us, uint64_t bytes);

#ifdef __cplusplus
} /* extern "C" */

namespace lockstep {

// RAII over the C API for C++ programs.
class StepReporter {
 public:
  StepReporter() : reporter_(lockstep_open()) {}
  ~StepReporter() { lockstep_close(reporter_); }
  StepReporter(const StepReporter&) = delete;
  StepReporter& operator=(const StepReporter&) = delete;

  bool active() const { return reporter_ != nullptr && lockstep_active(reporter_) != 0; }
  int report(const lockstep_step_info& step) { return lockstep_report(reporter_, &step); }
  uint64_t dropped() const { return lockstep_dropped(reporter_); }
  // For the rest of the C API (phases, collectives).
  lockstep_reporter* get() const { return reporter_; }

 private:
  lockstep_reporter* reporter_;
};

}  // namespace lockstep
#endif

#endif /* LOCKSTEP_REPORTER_H */
