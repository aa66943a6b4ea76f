#!/usr/bin/python3
"""What timing every collective costs (issue 42; target: at most 0.5% of step time), and how well
it agrees with the program's own clock, per kind.

1. Per collective: one Gloo rank calls dist.all_reduce on one float, through lockstep's wrapper and
   through the original function, in alternating blocks; the difference of the medians is the
   wrapper's cost per call (a blocking CPU collective: two clock reads, the progress record's two
   writes, the step's accounting under a lock).
2. Per step: the PyTorch reference CPU workload (../shared/reference/torch_cpu_reference.py: MLP
   784-1024-1024-10, batch 64 per rank, SGD, 2 ranks with Gloo, one thread each) written as a
   program that averages its own gradients (one dist.all_reduce of the flattened gradients a step).
   Each rank holds two copies of the model; the ranks alternate blocks of steps between them: one
   watched, its all-reduce through the wrapper and every step reported to a PULL socket this script
   drains (as an agent's would), the other calling the original all-reduce and reporting nothing.
   Whatever else the shared machine does falls on both alike. Also: the wrapper's cost per call
   (part 1) times the calls per step, over the step time: the cost with the machine's noise out.
3. Agreement: tests/programs/collectives.py in each mode, 2 ranks, Lockstep's exposed share against
   the program's own clock.

    /usr/bin/python3 bench/collectives_overhead.py [--blocks 100] [--block-steps 4] [--skip-agreement]

Run from the repository with the build tree's package: PYTHONPATH=build/python.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"

RANK_PROGRAM = textwrap.dedent("""
    import json, os, statistics, sys, time, torch, torch.distributed as dist, lockstep
    from lockstep import _collectives
    torch.set_num_threads(1)
    rank, blocks, block_steps = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["BENCH_PORT"], rank=rank, world_size=2)

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                                   torch.nn.ReLU(), torch.nn.Linear(1024, 10))

    watched, plain = mlp(), mlp()
    lockstep.watch(watched)
    original = _collectives.installed().original("all_reduce")
    opts = {id(m): torch.optim.SGD(m.parameters(), lr=0.01) for m in (watched, plain)}
    x, y = torch.randn(64, 784), torch.randint(0, 10, (64,))

    def one_step(model, all_reduce):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opts[id(model)].zero_grad()
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        all_reduce(flat)
        flat /= 2
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        opts[id(model)].step()
        return loss

    times = {"watched": [], "plain": []}
    for block in range(blocks):
        for name in (("watched", "plain") if block % 2 == 0 else ("plain", "watched")):
            model = watched if name == "watched" else plain
            began = time.perf_counter()
            for _ in range(block_steps):
                loss = one_step(model, dist.all_reduce if name == "watched" else original)
                if name == "watched":
                    lockstep.step(samples=64, loss=loss)
            times[name].append((time.perf_counter() - began) / block_steps)

    # Part 1: the wrapper's cost per call: one float, rank 0 alone in a group of its own while
    # rank 1 waits for it (idle, so that the two do not share the cores).
    alone = [dist.new_group([r], backend="gloo") for r in (0, 1)][rank]
    one = torch.ones(1)
    per_call = {"wrapped": [], "original": []}
    for block in range(200 if rank == 0 else 0):
        for name, call in (("wrapped", dist.all_reduce), ("original", original)):
            began = time.perf_counter()
            for _ in range(50):
                call(one, group=alone)
            per_call[name].append((time.perf_counter() - began) / 50)
        lockstep.step(samples=0)  # a step's accounting stays small
    _collectives.installed().original("barrier")()
    lockstep.close()
    print(json.dumps({"rank": rank, "times": times, "per_call": per_call}))
    dist.destroy_process_group()
""")


def run_ranks(args, tmp):
    import zmq

    endpoint = os.path.join(tmp, "report.sock")
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    pull.bind("ipc://" + endpoint)
    port = str(29700 + os.getpid() % 200)
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, LOCKSTEP_REPORT="ipc://" + endpoint, LOCKSTEP_JOB_ID="bench", RANK=str(rank),
                   WORLD_SIZE="2", BENCH_PORT=port, OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([PYTHON, "-c", RANK_PROGRAM, str(rank), str(args.blocks), str(args.block_steps)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    received = 0
    while any(p.poll() is None for p in procs):
        while pull.poll(50):
            pull.recv()
            received += 1
    while pull.poll(200):
        pull.recv()
        received += 1
    outs = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            sys.exit("a rank failed:\n" + err[-2000:])
        outs.append(json.loads(out.strip().splitlines()[-1]))
    pull.close(0)
    context.term()
    return outs, received


def agreement(tmp):
    """Each mode of tests/programs/collectives.py, through the package to a PULL socket."""
    out = {}
    harness = os.path.join(ROOT, "tests", "programs", "collectives.py")
    for mode in ("allreduce", "allgather", "async", "zero3", "zero"):
        import zmq

        endpoint = os.path.join(tmp, mode + ".sock")
        context = zmq.Context()
        pull = context.socket(zmq.PULL)
        pull.bind("ipc://" + endpoint)
        port = str(29500 + (os.getpid() + len(out) * 7) % 150)
        procs = []
        for rank in (0, 1):
            env = dict(os.environ, LOCKSTEP_REPORT="ipc://" + endpoint, LOCKSTEP_JOB_ID="agree", RANK=str(rank),
                       WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([PYTHON, harness, "--mode", mode, "--steps", "30", "--own",
                                           os.path.join(tmp, mode + "-%d.json")], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        from lockstep.v1 import lockstep_pb2

        reports = []
        while any(p.poll() is None for p in procs) or pull.poll(300):
            while pull.poll(50):
                m = lockstep_pb2.StreamMessage()
                m.ParseFromString(pull.recv())
                if m.HasField("step_report"):
                    reports.append(m.step_report)
        for p in procs:
            p.wait()
        pull.close(0)
        context.term()
        out[mode] = {}
        for rank in (0, 1):
            own = json.load(open(os.path.join(tmp, "%s-%d.json" % (mode, rank))))
            mine = [r for r in reports if r.rank == rank]
            ours = sum(r.exposed_comm_time_us for r in mine) / max(1, sum(r.step_time_us for r in mine))
            out[mode]["rank%d" % rank] = {"lockstep_exposed_share": round(ours, 4),
                                          "own_share": round(own["collective_s"] / own["step_s"], 4)}
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=100)
    p.add_argument("--block-steps", type=int, default=4)
    p.add_argument("--skip-agreement", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        outs, received = run_ranks(args, tmp)
        result = {"reports_received": received, "reports_expected": 2 * args.blocks * args.block_steps + 200}
        watched = [t for o in outs for t in o["times"]["watched"]]
        plain = [t for o in outs for t in o["times"]["plain"]]
        ratios = [w / q for o in outs for w, q in zip(o["times"]["watched"], o["times"]["plain"])]
        per_call = outs[0]["per_call"]
        wrapper_us = (statistics.median(per_call["wrapped"]) - statistics.median(per_call["original"])) * 1e6
        step_ms = statistics.median(plain) * 1e3
        result.update({
            "step_ms_plain": round(step_ms, 3),
            "step_ms_watched": round(statistics.median(watched) * 1e3, 3),
            "ratio_watched_over_plain": round(statistics.median(watched) / statistics.median(plain), 4),
            "block_ratio_p10_p90": [round(statistics.quantiles(ratios, n=10)[0], 4),
                                    round(statistics.quantiles(ratios, n=10)[-1], 4)],
            "all_reduce_one_float_us": round(statistics.median(per_call["original"]) * 1e6, 2),
            "wrapper_us_per_collective": round(wrapper_us, 2),
            "wrapper_share_of_step": round(wrapper_us / (step_ms * 1e3), 5),
        })
        if not args.skip_agreement:
            result["agreement"] = agreement(tmp)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
