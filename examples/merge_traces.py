#!/usr/bin/env python3
"""Put a PyTorch profiler trace into a Lockstep trace, on one clock (docs/timeline.md).

    lockstepctl trace JOB --out job.json.gz
    python3 examples/merge_traces.py job.json.gz rank3.json --node node-b --out both.json.gz

The profiler's events are on its rank's node's clock. Lockstep's trace says how far each node's
clock is from the client's (otherData.clock_offsets) and counts its `ts` from baseTimeNanoseconds
on the client's clock. PyTorch 2.4 and later count theirs from their own baseTimeNanoseconds;
older traces (a bare list of events, or no baseTimeNanoseconds) need --start-ns: time.time_ns()
as the program entered profile(). The profiler's processes keep their names, prefixed by the
node, and move out of the way of Lockstep's process ids.
"""

import argparse
import gzip
import json
import sys

PID_BASE = 10_000_000  # beyond Lockstep's ranks (rank + 1) and GPU processes (1,000,000 + node)


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def save(trace, path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        json.dump(trace, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("lockstep_trace")
    parser.add_argument("torch_trace")
    parser.add_argument("--node", required=True, help="the node the profiled rank ran on")
    parser.add_argument("--start-ns", type=int, help="time.time_ns() when the profiler started (older traces)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    ours, theirs = load(args.lockstep_trace), load(args.torch_trace)
    events = theirs if isinstance(theirs, list) else theirs.get("traceEvents", [])
    base_ns = args.start_ns if args.start_ns is not None else (None if isinstance(theirs, list) else theirs.get("baseTimeNanoseconds"))
    if base_ns is None:
        sys.exit("merge_traces: %s has no baseTimeNanoseconds (PyTorch before 2.4): give --start-ns" % args.torch_trace)
    clock = ours.get("otherData", {}).get("clock_offsets", {}).get(args.node)
    if clock is None:
        print("merge_traces: node %s's clock was not measured; its times are taken as stamped" % args.node, file=sys.stderr)
    offset_us = clock["offset_us"] if clock else 0
    # Their ts + their base, on the node's clock, minus the node's offset, minus our base.
    shift_us = (base_ns - ours["baseTimeNanoseconds"]) / 1000 - offset_us

    pids = {}
    for event in events:
        if "ts" in event:
            event["ts"] = event["ts"] + shift_us
        pid = event.get("pid", 0)
        if pid not in pids:
            pids[pid] = PID_BASE + len(pids)
            ours["traceEvents"].append({"ph": "M", "pid": pids[pid], "name": "process_name",
                                        "args": {"name": "%s: %s" % (args.node, pid)}})
        event["pid"] = pids[pid]
        if event.get("ph") == "M" and event.get("name") == "process_name":
            event["args"] = {"name": "%s: %s" % (args.node, event.get("args", {}).get("name", pid))}
        ours["traceEvents"].append(event)
    save(ours, args.out)
    print("wrote %s: %d events of %s on %s's clock %+.3f ms" % (args.out, len(events), args.torch_trace, args.node,
                                                               offset_us / 1000))


if __name__ == "__main__":
    main()
