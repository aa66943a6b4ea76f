#!/usr/bin/python3
"""What lockstep.watch + lockstep.step cost a PyTorch DDP program (issue 13; target: at most 1%).

The PyTorch reference CPU workload (../shared/reference/torch_cpu_reference.py: MLP
784-1024-1024-10, batch 64 per rank, SGD, DDP with Gloo, 2 ranks, one thread each), once as it is
and once instrumented, alternating in one run, each round on fresh processes. Reports go to a PULL
socket this script drains, as an agent's would; it checks that every step arrived.

    /usr/bin/python3 bench/own_program_overhead.py [--rounds 7] [--steps 300] [--coretype SkylakeX]
    (PYTHONPATH: the build tree's python/, which the script sets itself)

Prints each round's median step time and samples/s per variant, then the ratio of the medians.
With --device cuda (the GPU machine): world size 1 with NCCL, where watch() times the all-reduce
with CUDA events.
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


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda" if cuda else "cpu")
    torch.manual_seed(0)
    layers = [int(x) for x in args.layers.split(",")]
    modules = []
    for a, b in zip(layers[:-2], layers[1:-1]):
        modules += [nn.Linear(a, b), nn.ReLU()]
    model = DDP(nn.Sequential(*modules, nn.Linear(layers[-2], layers[-1])).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    lossf = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1234 + rank)
    X = torch.randn(args.batch * 8, layers[0], generator=g).to(device)
    Y = torch.randint(0, layers[-1], (args.batch * 8,), generator=g).to(device)
    instrumented = args.variant == "instrumented"
    if instrumented:
        import lockstep

        assert lockstep.active(), "LOCKSTEP_REPORT is not set"
        lockstep.watch(model)

    def step(i):
        s = (i % 8) * args.batch
        opt.zero_grad(set_to_none=True)
        loss = lossf(model(X[s:s + args.batch]), Y[s:s + args.batch])
        loss.backward()
        opt.step()
        if instrumented:
            lockstep.step(samples=args.batch, loss=loss)

    for i in range(args.warmup):
        step(i)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    times = []
    began = time.perf_counter()
    for i in range(args.steps):
        t0 = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - t0)
    if cuda:
        torch.cuda.synchronize()
    dist.barrier()
    wall = time.perf_counter() - began
    if rank == 0:
        print(json.dumps({"step_ms": statistics.median(times) * 1e3, "samples_s": world * args.batch * args.steps / wall}),
              flush=True)
    if instrumented:
        lockstep.close()  # sends what a GPU run still holds
    del model, opt
    dist.barrier()
    dist.destroy_process_group()


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


def one_run(args, variant, endpoint):
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(args.world),
               OMP_NUM_THREADS=str(args.threads), PYTHONPATH=os.path.join(args.build, "python"),
               LOCKSTEP_REPORT=endpoint, LOCKSTEP_JOB_ID="bench")
    if args.coretype:
        env["OPENBLAS_CORETYPE"] = args.coretype
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--variant", variant]
    command += [a for a in sys.argv[1:] if a != "--worker"]
    ranks = [subprocess.Popen(command, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              text=True) for r in range(args.world)]
    out = [p.communicate(timeout=600)[0] for p in ranks]
    if any(p.returncode != 0 for p in ranks):
        raise SystemExit("a rank failed: %s" % [p.returncode for p in ranks])
    return json.loads(out[0].strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="plain", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--layers", default="784,1024,1024,10")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--coretype", default="", help="OPENBLAS_CORETYPE for both variants (e.g. SkylakeX)")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = p.parse_args()
    if args.worker:
        return worker(args)

    endpoint = "ipc:///tmp/lockstep-bench-%d.sock" % os.getpid()
    drain = Drain(endpoint)
    results = {"plain": [], "instrumented": []}
    for r in range(args.rounds):
        order = ["plain", "instrumented"] if r % 2 == 0 else ["instrumented", "plain"]
        for variant in order:
            before = drain.count
            figures = one_run(args, variant, endpoint)
            if variant == "instrumented":
                deadline = time.time() + 5
                expected = args.world * (args.warmup + args.steps)
                while drain.count - before < expected and time.time() < deadline:
                    time.sleep(0.01)
                figures["reports"] = drain.count - before
                if figures["reports"] != expected:
                    raise SystemExit("expected %d reports, got %d" % (expected, figures["reports"]))
            results[variant].append(figures)
            print("round %d %-12s step %.3f ms  %8.0f samples/s" % (r + 1, variant, figures["step_ms"], figures["samples_s"]),
                  flush=True)
    summary = {}
    for variant, runs in results.items():
        summary[variant] = {"step_ms": statistics.median(x["step_ms"] for x in runs),
                            "samples_s": statistics.median(x["samples_s"] for x in runs)}
    step_ratio = summary["instrumented"]["step_ms"] / summary["plain"]["step_ms"]
    rate_ratio = summary["instrumented"]["samples_s"] / summary["plain"]["samples_s"]
    # Round by round (each pair ran back to back): how much the machine itself moves.
    pairs = [i["step_ms"] / p_["step_ms"] for i, p_ in zip(results["instrumented"], results["plain"])]
    print(json.dumps({"device": args.device, "world": args.world, "steps": args.steps, "rounds": args.rounds,
                      "coretype": args.coretype or None, "plain": summary["plain"],
                      "instrumented": summary["instrumented"], "step_time_ratio": step_ratio,
                      "throughput_ratio": rate_ratio, "pair_ratios": pairs}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
