#!/usr/bin/python3
"""What lockstep.watch + lockstep.step cost a PyTorch DDP program (issue 13; target: at most 1%),
and what the progress record adds to that (issue 32; target: at most 0.2%).

The PyTorch reference CPU workload (../shared/reference/torch_cpu_reference.py: MLP
784-1024-1024-10, batch 64 per rank, SGD, DDP with Gloo, 2 ranks, one thread each), as it is and
instrumented, side by side in one run. Each rank holds two DDP copies of the model, one of them
watched, and the ranks alternate blocks of steps between them: whatever else this shared machine
does falls on both alike, which separate runs (whose step times here move by ±15%) cannot promise.
Reports go to a PULL socket this script drains, as an agent's would; it checks that every
instrumented step arrived.

    /usr/bin/python3 bench/own_program_overhead.py [--blocks 150] [--block-steps 4] [--pin] [--control]
                                                   [--no-progress]

The progress record (LOCKSTEP_PROGRESS, a 128-byte file per rank made here as the agent makes it,
and LOCKSTEP_STACKS) is a third variant: the watched copy again, with the record written. The
record's writer is switched off for the watched copy's blocks and on for the recorded ones, so the
two differ in the record alone, and the blocks of all three variants rotate. Its cost without the
machine's noise: record_us_per_step, the package's own CPU time per step with the record less
without it (the writes as the step makes them, after its compute evicted the caches), and
record_us_per_step_warm, the writes a watched step makes, counted, times what each costs in a
tight loop (a lower bound). --no-progress leaves the record out (as before issue 32).
--candidate FILE adds a fourth variant, the watched copy again writing through the Writer of FILE
(another _progress.py) into a record of its own: a writer tried side by side with the package's
(candidate_record_us_per_step against record_us_per_step; issue 46).

--control runs the same with neither copy instrumented: the spread of its ratios is the machine's
noise, the floor under which the end-to-end ratio says nothing (about ±3% on the 2-core build
machine). The time in the package's own code is measured as the ranks' CPU time in it
(CLOCK_THREAD_CPUTIME_ID), which preemption and a busy host do not inflate.

Prints the median step time of each variant, their ratio, how the block-by-block ratios spread,
and the time spent in the package's own code per step (its hooks and step(), timed from inside):
the cost with the machine's noise taken out. With --device cuda (the GPU machine): world size 1 with NCCL, where watch() times the
all-reduce with CUDA events.
"""

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_model(args, device):
    import torch.nn as nn

    layers = [int(x) for x in args.layers.split(",")]
    modules = []
    for a, b in zip(layers[:-2], layers[1:-1]):
        modules += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*modules, nn.Linear(layers[-2], layers[-1])).to(device)


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import lockstep

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.pin:  # one core per rank, every thread of it: fewer migrations, less noise
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda" if cuda else "cpu")
    from lockstep import _progress

    assert lockstep.active(), "LOCKSTEP_REPORT is not set"
    record = _progress.writer()
    recording = not args.control and not args.no_progress
    assert (record is not None) == recording, "LOCKSTEP_PROGRESS is not a record"
    spent = self_timed()
    torch.manual_seed(0)
    variants = {}
    for name in ("plain", "instrumented"):
        model = DDP(build_model(args, device))
        variants[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
    if not args.control:
        lockstep.watch(variants["instrumented"][0])
    writers = {"recorded": record}
    if recording:
        variants["recorded"] = variants["instrumented"]  # the same watched copy, with the record
    if recording and args.candidate:
        variants["candidate"] = variants["instrumented"]
        writers["candidate"] = candidate_writer(args.candidate)
    reported = [0]
    lossf = nn.CrossEntropyLoss()
    layers = [int(x) for x in args.layers.split(",")]
    g = torch.Generator().manual_seed(1234 + rank)
    X = torch.randn(args.batch * 8, layers[0], generator=g).to(device)
    Y = torch.randint(0, layers[-1], (args.batch * 8,), generator=g).to(device)

    def step(name, i):
        _progress._writer = writers.get(name)  # the one difference
        model, opt = variants[name]
        s = (i % 8) * args.batch
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(X[s:s + args.batch]), Y[s:s + args.batch])
        loss.backward()
        opt.step()
        if name != "plain" and not args.control:
            lockstep.step(samples=args.batch, loss=loss)  # timed by self_timed()
            reported[0] += 1

    for name in variants:
        for i in range(args.warmup):
            step(name, i)
    times = {name: [] for name in variants}
    cpu = {name: 0.0 for name in variants}  # this process's CPU time, every thread of it
    own = {name: 0.0 for name in variants}  # the package's own code (self_timed)
    blocks = {name: [] for name in variants}
    names = list(variants)
    for b in range(args.blocks):
        if len(names) == 2:
            order = names if b % 2 == 0 else names[::-1]
        else:  # all rotate: each goes first, second, third ... alike
            k = b % len(names)
            order = names[k:] + names[:k] if b % 2 == 0 else (names[k:] + names[:k])[::-1]
        for name in order:
            own_before = spent[0]
            if cuda:
                torch.cuda.synchronize()
            block = []
            c0 = time.process_time()
            for i in range(args.block_steps):
                t0 = time.perf_counter()
                step(name, i)
                block.append(time.perf_counter() - t0)
            cpu[name] += time.process_time() - c0
            own[name] += spent[0] - own_before
            if cuda:
                torch.cuda.synchronize()
            times[name] += block
            blocks[name].append(statistics.median(block))
    record_us = record_cost(lambda i: step("recorded", i)) if recording else None
    dist.barrier()
    if rank == 0:
        figures = {"step_ms": {n: statistics.median(t) * 1e3 for n, t in times.items()},
                   "own_code_us_per_step": {n: own[n] * 1e6 / len(times[n]) for n in variants},
                   "mean_step_ms": {n: statistics.mean(t) * 1e3 for n, t in times.items()},
                   "cpu_ms_per_step": {n: c * 1e3 / len(times[n]) for n, c in cpu.items()},
                   "block_ratios": [i / p for i, p in zip(blocks["instrumented"], blocks["plain"])],
                   "record_writer": "C" if _progress.NATIVE else "Python",
                   "reported": reported[0]}
        if recording:
            figures["record_block_ratios"] = [r / i for r, i in zip(blocks["recorded"], blocks["instrumented"])]
            figures["record_us_per_step"] = record_us
        print(json.dumps(figures), flush=True)
    lockstep.close()  # sends what a GPU run still holds
    del variants
    dist.barrier()
    dist.destroy_process_group()


def candidate_writer(path):
    """A Writer of the _progress.py at `path`, on a record of its own beside the rank's."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("candidate_progress", path)
    if spec is None:
        raise SystemExit("--candidate %s: not a Python file" % path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    copy = os.environ["LOCKSTEP_PROGRESS"] + ".candidate"
    with open(copy, "wb") as f:
        f.write(bytes(128))
    writer = module.Writer(module._map(copy))
    writer._claim(0)
    return writer


def self_timed():
    """Wraps the package's hooks and step() so that the time spent in them on the ranks' critical
    path adds up: the instrumentation's own cost, free of the machine's noise. Returns the total
    (seconds, in a one-element list). The wrappers add their own few hundred ns: an overestimate."""
    import lockstep
    from lockstep import _api

    spent = [0.0]

    def timed(function):
        def wrapper(*a, **k):
            began = time.thread_time()
            try:
                return function(*a, **k)
            finally:
                spent[0] += time.thread_time() - began
        return wrapper

    # Every hook the watcher has (close_step runs inside step(), which is timed as a whole).
    for name, function in list(vars(_api._Watcher).items()):
        if callable(function) and name not in ("__init__", "close_step"):
            setattr(_api._Watcher, name, timed(function))
    lockstep.step = timed(lockstep.step)
    return spent


def record_cost(step, steps=20, calls=20000):
    """What the progress record's writes cost a watched step, without the machine's noise: the
    writes `steps` steps make, counted, times what each costs alone (the median of 5 runs of
    `calls`), in microseconds per step."""
    from lockstep import _progress

    counts = {}
    originals = {}
    for name in ("step_done", "phase", "collective_begin", "collective_end"):
        originals[name] = getattr(_progress.Writer, name)

        def counting(self, *a, _name=name, **k):
            counts[_name] = counts.get(_name, 0) + 1
            return originals[_name](self, *a, **k)
        setattr(_progress.Writer, name, counting)
    try:
        for i in range(steps):
            step(i)
    finally:
        for name, function in originals.items():
            setattr(_progress.Writer, name, function)
    # On a copy of the record beside it (the rank's own stays as the steps left it).
    copy = os.environ["LOCKSTEP_PROGRESS"] + ".timed"
    with open(copy, "wb") as f:
        f.write(bytes(128))
    timed = _progress.Writer(_progress._map(copy))
    timed._claim(0)
    calls_of = {"step_done": lambda: timed.step_done(7, "data"), "phase": lambda: timed.phase("forward"),
                "collective_begin": lambda: timed.collective_begin(phase="all-reduce"),
                "collective_end": lambda: timed.collective_end(phase="optimizer")}
    total = 0.0
    for name, n in counts.items():
        call = calls_of[name]
        runs = []
        for _ in range(5):
            began = time.perf_counter()
            for _ in range(calls):
                call()
            runs.append((time.perf_counter() - began) / calls)
        total += statistics.median(runs) * n / steps
    return {"us": total * 1e6, "writes_per_step": {n: c / steps for n, c in counts.items()}}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Drain(threading.Thread):
    """The agent's side: takes every report, counts them."""

    def __init__(self, endpoint):
        super().__init__(daemon=True)
        import zmq

        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.PULL)
        self.socket.bind(endpoint)
        self.count = 0
        self.start()

    def run(self):
        while True:
            self.socket.recv()
            self.count += 1


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--blocks", type=int, default=150, help="blocks of each variant, alternating")
    p.add_argument("--block-steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--pin", action="store_true", help="pin each rank to a core of its own")
    p.add_argument("--control", action="store_true",
                   help="instrument neither copy: the ratios this machine's noise alone gives")
    p.add_argument("--no-progress", action="store_true", help="leave the progress record out")
    p.add_argument("--candidate", default="", metavar="FILE",
                   help="also time the progress Writer of FILE (a _progress.py) side by side")
    p.add_argument("--coretype", default="", help="OPENBLAS_CORETYPE for both variants (e.g. SkylakeX)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = p.parse_args()
    if args.candidate and not os.path.isfile(args.candidate):
        raise SystemExit("--candidate %s: no such file" % args.candidate)
    if args.candidate and (args.control or args.no_progress):
        raise SystemExit("--candidate needs the record: leave out --control and --no-progress")
    if args.worker:
        return worker(args)

    endpoint = "ipc:///tmp/lockstep-bench-%d.sock" % os.getpid()
    drain = Drain(endpoint)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(args.world),
               OMP_NUM_THREADS=str(args.threads), PYTHONPATH=os.path.join(args.build, "python"),
               LOCKSTEP_REPORT=endpoint, LOCKSTEP_JOB_ID="bench")
    if args.coretype:
        env["OPENBLAS_CORETYPE"] = args.coretype
    command = [sys.executable, os.path.abspath(__file__), "--worker"] + sys.argv[1:]
    scratch = tempfile.TemporaryDirectory(prefix="lockstep-bench-")
    envs, records = [], []
    for r in range(args.world):
        rank_env = dict(env, RANK=str(r), LOCAL_RANK=str(r))
        if not args.control and not args.no_progress:  # as the agent makes them
            rank_env["LOCKSTEP_PROGRESS"] = os.path.join(scratch.name, "progress.%d" % r)
            rank_env["LOCKSTEP_STACKS"] = os.path.join(scratch.name, "stacks.%d" % r)
            with open(rank_env["LOCKSTEP_PROGRESS"], "wb") as f:
                f.write(bytes(128))
            open(rank_env["LOCKSTEP_STACKS"], "w").close()
            records.append(rank_env["LOCKSTEP_PROGRESS"])
        envs.append(rank_env)
    ranks = [subprocess.Popen(command, env=e, stdout=subprocess.PIPE, text=True) for e in envs]
    out = [rank.communicate(timeout=3600)[0] for rank in ranks]
    if any(rank.returncode != 0 for rank in ranks):
        raise SystemExit("a rank failed: %s" % [rank.returncode for rank in ranks])
    figures = json.loads(out[0].strip().splitlines()[-1])
    expected = args.world * figures["reported"]  # every rank makes as many steps
    deadline = time.time() + 5
    while drain.count < expected and time.time() < deadline:
        time.sleep(0.01)
    ratios = sorted(figures["block_ratios"])
    plain, instrumented = figures["step_ms"]["plain"], figures["step_ms"]["instrumented"]
    own = figures["own_code_us_per_step"]
    result = {
        "device": args.device, "world": args.world, "steps_each": args.blocks * args.block_steps,
        "record_writer": figures.get("record_writer"),
        "coretype": args.coretype or None,
        "plain_step_ms": round(plain, 3), "instrumented_step_ms": round(instrumented, 3),
        "step_time_ratio": round(instrumented / plain, 4),
        "own_code_us_per_step": round(own["instrumented"], 1),
        "own_code_share_of_step": round(own["instrumented"] / 1e3 / plain, 5),
        "mean_step_ratio": round(figures["mean_step_ms"]["instrumented"] / figures["mean_step_ms"]["plain"], 4),
        "rank0_cpu_ms_per_step": {n: round(v, 3) for n, v in figures["cpu_ms_per_step"].items()},
        "block_ratio_median": round(statistics.median(ratios), 4),
        "block_ratio_quartiles": [round(ratios[len(ratios) // 4], 4), round(ratios[3 * len(ratios) // 4], 4)],
        "reports": drain.count, "reports_expected": expected}
    if "recorded" in figures["step_ms"]:
        # The progress record: the watched copy with it over the same copy without it.
        recorded = figures["step_ms"]["recorded"]
        ratios = sorted(figures["record_block_ratios"])
        cost = figures["record_us_per_step"]
        result.update({
            "recorded_step_ms": round(recorded, 3),
            "record_step_time_ratio": round(recorded / instrumented, 4),
            "record_mean_step_ratio": round(figures["mean_step_ms"]["recorded"] / figures["mean_step_ms"]["instrumented"], 4),
            "record_block_ratio_median": round(statistics.median(ratios), 4),
            "record_block_ratio_quartiles": [round(ratios[len(ratios) // 4], 4), round(ratios[3 * len(ratios) // 4], 4)],
            "record_writes_per_step": cost["writes_per_step"],
            "record_us_per_step_warm": round(cost["us"], 2),
            "own_code_us_per_step_recorded": round(own["recorded"], 1),
            "record_us_per_step": round(own["recorded"] - own["instrumented"], 1),
            "record_share_of_step": round((own["recorded"] - own["instrumented"]) / 1e3 / instrumented, 5)})
        if "candidate" in own:
            result["candidate_record_us_per_step"] = round(own["candidate"] - own["instrumented"], 1)
        for path in records:  # each rank wrote its record, up to its last step
            with open(path, "rb") as f:
                magic, version, sequence, step = struct.unpack_from("<IIQq", f.read(128))
            if (magic, version, sequence % 2, step) != (0x5250534C, 1, 0, figures["reported"]):
                raise SystemExit("%s: not the record of step %d: %s" % (path, figures["reported"],
                                                                        (hex(magic), version, sequence, step)))
    print(json.dumps(result, indent=1))
    if drain.count != expected:
        raise SystemExit("expected %d reports, got %d" % (expected, drain.count))

if __name__ == "__main__":
    sys.exit(main())
