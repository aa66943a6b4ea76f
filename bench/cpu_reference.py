"""Runs lockstep-trainer and PyTorch DDP alternately on the CPU reference workload and compares.

Workload (issue 2): MLP 784-1024-1024-10, batch 64 per rank, SGD lr 0.01, 2 ranks on this machine,
one BLAS thread per rank. Each round runs, one after another:
  lockstep  at its defaults (buckets chosen by measurement, issue 34) and with --bucket-mb 25
            (the fixed default before it)
  lockstep  compute only: two independent 1-rank trainers at once (the same load, no all-reduce)
  torch     ../shared/reference/torch_cpu_reference.py as given;
            tuned (bench/torch_ddp.py): OPENBLAS_CORETYPE set to the kernels lockstep picks (Debian's
            OpenBLAS falls back to generic kernels on this CPU), gradient_as_bucket_view, one thread
            per rank, and the best of bucket_cap_mb 1, 4 and 25 in that round;
            tuned and pinned: the same with bucket_cap_mb 4 and each rank on its own core, as
            lockstep-trainer pins its ranks
Two overhead figures are printed for lockstep: the exposed all-reduce wait per step (the KPI the
product reports, steps 51 on) and, like the torch script, 1 - compute-only step / synchronised step.
Last, each run's model FLOP/s (6 x parameters per sample, the usual training count) against the
machine's GEMM ceiling: every core's sgemm at once, with the BLAS kernels the trainer picks, as
the agent measures it for MFU (`lockstep-trainer --gemm-peak`; issue 46).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WORKLOAD = ["--backend", "cpu", "--layers", "784,1024,1024,10", "--dataset", "synthetic:n=65536,dim=784,classes=10,seed=1",
            "--batch-per-rank", "64", "--optimizer", "sgd", "--lr", "0.01", "--threads", "1", "--quiet"]
WARMUP = 50
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS = [784, 1024, 1024, 10]
PARAMETERS = sum(i * o + o for i, o in zip(LAYERS, LAYERS[1:]))  # 1,861,632


def read_metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def lockstep_synced(trainer, steps, bucket_mb, tmp):
    out = os.path.join(tmp, "synced.jsonl")
    subprocess.run([trainer, "--nproc", "2", "--steps", str(steps), "--bucket-mb", str(bucket_mb), "--metrics-out", out]
                   + WORKLOAD, check=True)
    lines = [l for l in read_metrics(out) if l["step"] > WARMUP]
    rank0 = sorted((l for l in lines if l["rank"] == 0), key=lambda l: l["step"])
    wall_s = (rank0[-1]["time_unix_us"] - rank0[0]["time_unix_us"]) / 1e6
    samples = sum(l["samples"] for l in lines if l["step"] > rank0[0]["step"])
    return {
        "samples_s": samples / wall_s,
        "step_ms": statistics.median(l["step_time_us"] for l in lines) / 1e3,
        "exposed": sum(l["exposed_comm_time_us"] for l in lines) / sum(l["step_time_us"] for l in lines),
        "allreduce_ms": statistics.median(l["allreduce_time_us"] for l in lines) / 1e3,
    }


def lockstep_compute_only(trainer, steps, tmp):
    procs, outs = [], []
    for rank in range(2):
        out = os.path.join(tmp, f"alone{rank}.jsonl")
        outs.append(out)
        procs.append(subprocess.Popen([trainer, "--steps", str(steps), "--metrics-out", out] + WORKLOAD))
    for p in procs:
        if p.wait() != 0:
            sys.exit("a compute-only run failed")
    return statistics.median(l["step_time_us"] for out in outs for l in read_metrics(out) if l["step"] > WARMUP) / 1e3


def torch_run(script, coretype, port):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    done = subprocess.run(["/usr/bin/python3", script, "--port", str(port)], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads([l for l in done.stdout.splitlines() if l.startswith("{")][-1])


def torch_ddp(steps, coretype, port, flags):
    """bench/torch_ddp.py on 2 ranks started as torchrun would; rank 0's JSON line."""
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OPENBLAS_CORETYPE=coretype)
        procs.append(subprocess.Popen(["/usr/bin/python3", os.path.join(ROOT, "bench", "torch_ddp.py"), "--steps", str(steps),
                                       "--grad-as-bucket-view"] + flags, env=env, stdout=subprocess.PIPE, text=True))
    out = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit("a torch_ddp.py rank failed")
    return json.loads([l for l in out[0].splitlines() if l.startswith("{")][-1])


def gemm_ceiling(trainer):
    """Every core's sgemm at once (as the ranks compute), as the agent measures the CPU's peak:
    GFLOP/s summed, per core, the kernels' name."""
    run = subprocess.run([trainer, "--gemm-peak"], capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        sys.exit("lockstep-trainer --gemm-peak failed: " + run.stderr)
    peak = json.loads(run.stdout)
    per_core = peak["flops_per_core"] / 1e9
    return per_core * peak["cores"], per_core, peak["cores"], peak["corename"]


def print_flops_utilization(samples_s, ceiling):
    total, per_core, cores, corename = ceiling
    print(f"GEMM ceiling: {total:.0f} GFLOP/s ({cores} cores x {per_core:.0f}, one thread's sgemm on each at once, "
          f"{corename} kernels)")
    for name, rate in samples_s:
        gflops = rate * 6 * PARAMETERS / 1e9
        print(f"model FLOP/s {name}: {gflops:.0f} GFLOP/s (6 x {PARAMETERS:,} parameters x {rate:.0f} samples/s) "
              f"= {100 * gflops / total:.1f}% of the ceiling")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--torch-script", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    args = ap.parse_args()

    coretype = "SkylakeX" if "avx512f" in open("/proc/cpuinfo").read() else "Haswell"
    results = {k: [] for k in ["auto", "ls25", "compute", "torch", "torch_tuned", "torch_pinned"]}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
            results["auto"].append(lockstep_synced(args.trainer, args.steps, "auto", tmp))
            results["torch"].append(torch_run(args.torch_script, None, 29517 + r))
            results["ls25"].append(lockstep_synced(args.trainer, args.steps, 25, tmp))
            tuned = [torch_ddp(args.steps, coretype, 29617 + 10 * r + i, ["--bucket-cap-mb", str(cap)])
                     for i, cap in enumerate([1, 4, 25])]
            results["torch_tuned"].append(max(tuned, key=lambda t: t["samples_s"]))
            results["torch_pinned"].append(torch_ddp(args.steps, coretype, 29717 + r, ["--bucket-cap-mb", "4", "--pin"]))
            results["compute"].append(lockstep_compute_only(args.trainer, args.steps, tmp))

    med = lambda rows, key: statistics.median(row[key] for row in rows)
    compute_ms = statistics.median(results["compute"])
    torch_s, torch_tuned_s = med(results["torch"], "samples_s"), med(results["torch_tuned"], "samples_s")
    torch_pinned_s = med(results["torch_pinned"], "samples_s")
    print(f"CPU reference workload, 2 ranks, medians of {args.rounds} alternating rounds")
    print(f"{'run':<42}{'samples/s':>11}{'step ms':>9}{'exposed wait':>14}{'1-compute/step':>16}")
    for name, key in [("lockstep (default: buckets measured)", "auto"), ("lockstep --bucket-mb 25", "ls25")]:
        rows = results[key]
        step = med(rows, "step_ms")
        print(f"{name:<42}{med(rows, 'samples_s'):>11.0f}{step:>9.2f}{med(rows, 'exposed') * 100:>13.1f}%"
              f"{(1 - compute_ms / step) * 100:>15.1f}%")
    for name, key in [("torch DDP (as given)", "torch"), ("torch DDP tuned", "torch_tuned"),
                      ("torch DDP tuned and pinned", "torch_pinned")]:
        rows = results[key]
        overhead = f"{med(rows, 'comm_overhead') * 100:>15.1f}%" if "comm_overhead" in rows[0] else f"{'-':>16}"
        print(f"{name:<42}{med(rows, 'samples_s'):>11.0f}{med(rows, 'step_ms'):>9.2f}{'-':>14}{overhead}")
    print("torch tuned: best bucket_cap_mb per round: " + ", ".join(str(t["bucket_cap_mb"]) for t in results["torch_tuned"]))
    print(f"lockstep compute-only step: {compute_ms:.2f} ms; torch compute-only step (as given): "
          f"{med(results['torch'], 'compute_only_ms'):.2f} ms")
    for name, key in [("default", "auto"), ("--bucket-mb 25", "ls25")]:
        ours = med(results[key], "samples_s")
        print(f"ratio lockstep ({name}) / torch: {ours / torch_s:.2f}x as given, {ours / torch_tuned_s:.2f}x tuned, "
              f"{ours / torch_pinned_s:.2f}x tuned and pinned")
    print_flops_utilization([("lockstep (default)", med(results["auto"], "samples_s")), ("torch DDP (as given)", torch_s),
                             ("torch DDP tuned and pinned", torch_pinned_s)], gemm_ceiling(args.trainer))


if __name__ == "__main__":
    main()
