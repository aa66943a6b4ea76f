"""A rank that only reports: STEPS steps of about PERIOD seconds each, through the lockstep
package, with a loss and a measured compute time. The alert benchmarks run it: on the first step
it prints `first-step-us T` (this machine's clock) to its log.

    python3 bench/reporting_rank.py STEPS PERIOD
"""

import sys
import time

import lockstep

steps, period = int(sys.argv[1]), float(sys.argv[2])
for i in range(1, steps + 1):
    time.sleep(period)
    sent = time.time_ns() // 1000  # the report's own time is taken as step() begins
    lockstep.step(samples=32, loss=1.0 / i)
    if i == 1:
        print("first-step-us %d" % sent, flush=True)
