/* A native training program reporting its steps to Lockstep through liblockstep-reporter.
 *
 * It fits y = w.x + b by minibatch SGD on synthetic data (dimension 64, 8192 rows) and reports
 * each step's samples, loss and compute time. It does not all-reduce: each rank fits its own
 * shard, which is enough to show the report path. Outside Lockstep it just trains.
 *
 * It names its phases (lockstep_phase), so that a stall says where it stopped, and reports its
 * final evaluation (lockstep_report_phase), which Lockstep's timeline draws. With a second
 * argument S, rank 1 blocks at step S reading a pipe nobody writes: a stuck native rank for
 * Lockstep's stall detection to find (docs/stalls.md).
 *
 *     cc -O2 linear_sgd.c -llockstep-reporter -lm -o linear_sgd
 *     lockstepctl start --ranks 2 --wait -- ./linear_sgd 300
 */
#include <lockstep/reporter.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { kDim = 64, kRows = 8192, kBatch = 128 };

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static double uniform(unsigned* state) {
  *state = *state * 1664525u + 1013904223u;
  return (double)(*state >> 8) / (double)(1u << 24) - 0.5;
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? atoi(argv[1]) : 200;
  const int hangAt = argc > 2 ? atoi(argv[2]) : 0;
  static double x[kRows][kDim], y[kRows], truth[kDim], w[kDim];
  unsigned seed = 7;
  for (int d = 0; d < kDim; ++d) truth[d] = uniform(&seed) * 4;
  const char* rank = getenv("RANK");
  seed = 1000u + (rank ? (unsigned)atoi(rank) : 0u);
  for (int i = 0; i < kRows; ++i) {
    y[i] = 0.5;
    for (int d = 0; d < kDim; ++d) {
      x[i][d] = uniform(&seed);
      y[i] += truth[d] * x[i][d];
    }
  }
  double b = 0;
  lockstep_reporter* reporter = lockstep_open();
  for (int step = 1; step <= steps; ++step) {
    const double began = now_us();
    if (hangAt > 0 && step == hangAt && rank && atoi(rank) == 1) {
      int never[2];
      char byte;
      lockstep_phase(reporter, "reading the next shard", 0);
      if (pipe(never) == 0 && read(never[0], &byte, 1) < 0) perror("read");
    }
    lockstep_phase(reporter, "compute", 0);
    double grad[kDim] = {0}, gradB = 0, loss = 0;
    for (int k = 0; k < kBatch; ++k) {
      const int i = (step * kBatch + k) % kRows;
      double pred = b;
      for (int d = 0; d < kDim; ++d) pred += w[d] * x[i][d];
      const double err = pred - y[i];
      loss += err * err / kBatch;
      for (int d = 0; d < kDim; ++d) grad[d] += 2 * err * x[i][d] / kBatch;
      gradB += 2 * err / kBatch;
    }
    for (int d = 0; d < kDim; ++d) w[d] -= 0.5 * grad[d];
    b -= 0.5 * gradB;

    lockstep_step_info info;
    lockstep_step_init(&info);
    info.samples = kBatch;
    info.loss = loss;
    info.lr = 0.5;
    info.data_time_us = 0;  /* the rows are in memory */
    info.compute_time_us = (int64_t)(now_us() - began);
    info.exposed_comm_time_us = 0; /* nothing is all-reduced */
    lockstep_report(reporter, &info);
    if (step % 50 == 0) printf("step %d loss %.6f\n", step, loss);
  }
  /* The evaluation over every row: a phase of its own, announced while it runs and reported after. */
  lockstep_phase(reporter, "eval", 1);
  const double evalBegan = now_us();
  double mse = 0;
  for (int i = 0; i < kRows; ++i) {
    double pred = b;
    for (int d = 0; d < kDim; ++d) pred += w[d] * x[i][d];
    mse += (pred - y[i]) * (pred - y[i]) / kRows;
  }
  lockstep_report_phase(reporter, "eval", LOCKSTEP_UNKNOWN, (int64_t)(now_us() - evalBegan));
  printf("eval mse %.6f\n", mse);
  if (lockstep_dropped(reporter) > 0) {
    fprintf(stderr, "%llu reports were dropped\n", (unsigned long long)lockstep_dropped(reporter));
  }
  lockstep_close(reporter);
  return 0;
}
