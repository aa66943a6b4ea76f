#!/usr/bin/python3
"""What lockstep.watch + lockstep.step cost a PyTorch DDP program (issue 13; target: at most 1%).

The PyTorch reference CPU workload (../shared/reference/torch_cpu_reference.py: MLP
784-1024-1024-10, batch 64 per rank, SGD, DDP with Gloo, 2 ranks, one thread each), as it is and
instrumented, side by side in one run. Each rank holds two DDP copies of the model, one of them
watched, and the ranks alternate blocks of steps between them: whatever else this shared machine
does falls on both alike, which separate runs (whose step times here move by ±15%) cannot promise.
Reports go to a PULL socket this script drains, as an agent's would; it checks that every
instrumented step arrived.

    /usr/bin/python3 bench/own_program_overhead.py [--blocks 150] [--block-steps 4] [--pin] [--control]

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
import subprocess
import sys
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
    assert lockstep.active(), "LOCKSTEP_REPORT is not set"
    spent = self_timed()
    torch.manual_seed(0)
    variants = {}
    for name in ("plain", "instrumented"):
        model = DDP(build_model(args, device))
        variants[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01))
    if not args.control:
        lockstep.watch(variants["instrumented"][0])
    lossf = nn.CrossEntropyLoss()
    layers = [int(x) for x in args.layers.split(",")]
    g = torch.Generator().manual_seed(1234 + rank)
    X = torch.randn(args.batch * 8, layers[0], generator=g).to(device)
    Y = torch.randint(0, layers[-1], (args.batch * 8,), generator=g).to(device)

    def step(name, i):
        model, opt = variants[name]
        s = (i % 8) * args.batch
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(X[s:s + args.batch]), Y[s:s + args.batch])
        loss.backward()
        opt.step()
        if name == "instrumented" and not args.control:
            lockstep.step(samples=args.batch, loss=loss)  # timed by self_timed()

    for name in variants:
        for i in range(args.warmup):
            step(name, i)
    times = {name: [] for name in variants}
    cpu = {name: 0.0 for name in variants}  # this process's CPU time, every thread of it
    blocks = {name: [] for name in variants}
    for b in range(args.blocks):
        order = ("plain", "instrumented") if b % 2 == 0 else ("instrumented", "plain")
        for name in order:
            if cuda:
                torch.cuda.synchronize()
            block = []
            c0 = time.process_time()
            for i in range(args.block_steps):
                t0 = time.perf_counter()
                step(name, i)
                block.append(time.perf_counter() - t0)
            cpu[name] += time.process_time() - c0
            if cuda:
                torch.cuda.synchronize()
            times[name] += block
            blocks[name].append(statistics.median(block))
    dist.barrier()
    if rank == 0:
        instrumented_steps = args.warmup + args.blocks * args.block_steps
        print(json.dumps({"step_ms": {n: statistics.median(t) * 1e3 for n, t in times.items()},
                          "own_code_us_per_step": spent[0] * 1e6 / instrumented_steps,
                          "mean_step_ms": {n: statistics.mean(t) * 1e3 for n, t in times.items()},
                          "cpu_ms_per_step": {n: c * 1e3 / len(times[n]) for n, c in cpu.items()},
                          "block_ratios": [i / p for i, p in zip(blocks["instrumented"], blocks["plain"])]}), flush=True)
    lockstep.close()  # sends what a GPU run still holds
    del variants
    dist.barrier()
    dist.destroy_process_group()


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
    p.add_argument("--coretype", default="", help="OPENBLAS_CORETYPE for both variants (e.g. SkylakeX)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = p.parse_args()
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
    ranks = [subprocess.Popen(command, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE, text=True)
             for r in range(args.world)]
    out = [rank.communicate(timeout=3600)[0] for rank in ranks]
    if any(rank.returncode != 0 for rank in ranks):
        raise SystemExit("a rank failed: %s" % [rank.returncode for rank in ranks])
    figures = json.loads(out[0].strip().splitlines()[-1])
    expected = 0 if args.control else args.world * (args.warmup + args.blocks * args.block_steps)
    deadline = time.time() + 5
    while drain.count < expected and time.time() < deadline:
        time.sleep(0.01)
    ratios = sorted(figures["block_ratios"])
    plain, instrumented = figures["step_ms"]["plain"], figures["step_ms"]["instrumented"]
    print(json.dumps({
        "device": args.device, "world": args.world, "steps_each": args.blocks * args.block_steps,
        "coretype": args.coretype or None,
        "plain_step_ms": round(plain, 3), "instrumented_step_ms": round(instrumented, 3),
        "step_time_ratio": round(instrumented / plain, 4),
        "own_code_us_per_step": round(figures["own_code_us_per_step"], 1),
        "own_code_share_of_step": round(figures["own_code_us_per_step"] / 1e3 / plain, 5),
        "mean_step_ratio": round(figures["mean_step_ms"]["instrumented"] / figures["mean_step_ms"]["plain"], 4),
        "rank0_cpu_ms_per_step": {n: round(v, 3) for n, v in figures["cpu_ms_per_step"].items()},
        "block_ratio_median": round(statistics.median(ratios), 4),
        "block_ratio_quartiles": [round(ratios[len(ratios) // 4], 4), round(ratios[3 * len(ratios) // 4], 4)],
        "reports": drain.count, "reports_expected": expected}, indent=1))
    if drain.count != expected:
        raise SystemExit("expected %d reports, got %d" % (expected, drain.count))


if __name__ == "__main__":
    sys.exit(main())
