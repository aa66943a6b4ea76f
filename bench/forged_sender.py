"""A job's rank that forges another job's records (bench/forged_records.sh, issue 44): it claims job
VICTIM (LOCKSTEP_JOB_ID, read by the lockstep package on its first step) and reports COUNT steps as
fast as it can, each with loss LOSS and a step number past any the victim reaches, through the
report socket its own job was given (LOCKSTEP_REPORT). Prints what it handed on and what its side
dropped; the package's exit waits for the queued records to leave.

    python3 bench/forged_sender.py VICTIM COUNT LOSS
"""

import os
import sys

victim, count, loss = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
os.environ["LOCKSTEP_JOB_ID"] = victim  # before the package reads its environment
os.environ["RANK"] = "0"
os.environ["WORLD_SIZE"] = "1"

import lockstep  # noqa: E402
from lockstep import _report  # noqa: E402

if not _report.active():
    sys.exit("forged_sender: the lockstep package does not report here (no LOCKSTEP_REPORT?)")
for i in range(1, count + 1):
    lockstep.step(samples=1, loss=loss, step=1_000_000 + i)
r = _report.reporter()
r.flush()
print("forged records made %d dropped-on-sender %d claiming job %s" % (r.made, r.dropped, victim), flush=True)
