/* Issue 42: a native program's own collectives through liblockstep-reporter, in a script that
 * reporter_test.cpp reads back on its PULL socket. Prints each call's answer as "name rc". */
#define _POSIX_C_SOURCE 199309L /* nanosleep */
#include <lockstep/reporter.h>
#include <stdio.h>
#include <time.h>

static void say(const char* name, int rc) { printf("%s %d\n", name, rc); }

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static int report(lockstep_reporter* r, int64_t exposed_us, int64_t step_time_us) {
  lockstep_step_info step;
  lockstep_step_init(&step);
  step.samples = 8;
  step.exposed_comm_time_us = exposed_us;
  step.step_time_us = step_time_us;
  return lockstep_report(r, &step);
}

/* Step 1: blocking ones timed by the library, one timed by the program, totals, and bad input. */
static void first_step(lockstep_reporter* r) {
  /* The step's compute: the 1.5 ms of exposed time the program reports below took no time here, so
   * without it the step could be shorter than its exposed time and have it capped. */
  sleep_ms(5);
  say("start", lockstep_collective_start(r, LOCKSTEP_ALL_REDUCE, 4096));
  sleep_ms(30);
  lockstep_collective_end(r);
  say("start", lockstep_collective_start(r, LOCKSTEP_BROADCAST, 8));
  sleep_ms(10);
  lockstep_collective_end(r);
  say("timed", lockstep_collective_timed(r, LOCKSTEP_ALL_GATHER, 1 << 20, 1700000000000000, 5000, 1200));
  say("totals", lockstep_collective_totals(r, LOCKSTEP_ALL_GATHER, 3, 15000, 300, 3u << 20));
  /* Refused, and nothing of them counted. */
  say("kind0", lockstep_collective_timed(r, 0, 8, LOCKSTEP_UNKNOWN, 10, 10));
  say("kind13", lockstep_collective_totals(r, 13, 1, 10, 10, 8));
  say("kind-again", lockstep_collective_start(r, 99, 8));
  lockstep_collective_end(r);
  say("negative", lockstep_collective_timed(r, LOCKSTEP_ALL_GATHER, 8, LOCKSTEP_UNKNOWN, -5, 0));
  say("negative-exposed", lockstep_collective_totals(r, LOCKSTEP_ALL_GATHER, 1, 10, -1, 8));
  say("nanoseconds", lockstep_collective_timed(r, LOCKSTEP_ALL_GATHER, 8, 1700000000000000000, 5, 5));
  say("week", lockstep_collective_totals(r, LOCKSTEP_ALL_GATHER, 1, 700000000000000, 0, 8));
  say("start", lockstep_collective_start(r, LOCKSTEP_BARRIER, 0));
  say("twice", lockstep_collective_start(r, LOCKSTEP_BARRIER, 0));
  lockstep_collective_end(r);
  say("report", report(r, LOCKSTEP_UNKNOWN, LOCKSTEP_UNKNOWN));
}

int main(void) {
  lockstep_reporter* r = lockstep_open();
  first_step(r);
  /* Step 2: none, so the totals started over and its exposed time stays unknown. */
  say("report", report(r, LOCKSTEP_UNKNOWN, LOCKSTEP_UNKNOWN));
  /* Step 3: 70 send/recvs, 64 of them one by one; the program's own exposed time is kept. */
  for (int i = 0; i < 70; ++i) lockstep_collective_timed(r, LOCKSTEP_SEND_RECV, 100, LOCKSTEP_UNKNOWN, 10, 2);
  say("report", report(r, 7, LOCKSTEP_UNKNOWN));
  /* Step 4: more exposed than the step's time is capped at it; a collective open at the report
   * belongs to the next step. */
  lockstep_collective_timed(r, LOCKSTEP_ALL_TO_ALL, 64, LOCKSTEP_UNKNOWN, 5000, 5000);
  lockstep_collective_start(r, LOCKSTEP_REDUCE_SCATTER, 512);
  say("report", report(r, LOCKSTEP_UNKNOWN, 1000));
  lockstep_collective_end(r);
  say("report", report(r, LOCKSTEP_UNKNOWN, LOCKSTEP_UNKNOWN));
  lockstep_close(r);
  return 0;
}
