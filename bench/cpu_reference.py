"""Runs lockstep-trainer and PyTorch DDP alternately on the CPU reference workload and compares.

Workload (issue 2): MLP 784-1024-1024-10, batch 64 per rank, SGD lr 0.01, 2 ranks on this machine,
one BLAS thread per rank. Each round runs, one after another:
  lockstep  with --bucket-mb 25 (the default) and with --bucket-mb 4
  lockstep  compute only: two independent 1-rank trainers at once (the same load, no all-reduce)
  torch     ../shared/reference/torch_cpu_reference.py as given, and with OPENBLAS_CORETYPE set to
            the kernels lockstep picks (Debian's OpenBLAS falls back to generic kernels on this CPU)
Two overhead figures are printed for lockstep: the exposed all-reduce wait per step (the KPI the
product reports) and, like the torch script, 1 - compute-only step / synchronised step.
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
WARMUP = 20


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--torch-script", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()

    coretype = "SkylakeX" if "avx512f" in open("/proc/cpuinfo").read() else "Haswell"
    results = {k: [] for k in ["ls25", "ls4", "compute", "torch", "torch_tuned"]}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr)
            results["ls25"].append(lockstep_synced(args.trainer, args.steps, 25, tmp))
            results["torch"].append(torch_run(args.torch_script, None, 29517 + r))
            results["ls4"].append(lockstep_synced(args.trainer, args.steps, 4, tmp))
            results["torch_tuned"].append(torch_run(args.torch_script, coretype, 29617 + r))
            results["compute"].append(lockstep_compute_only(args.trainer, args.steps, tmp))

    med = lambda rows, key: statistics.median(row[key] for row in rows)
    compute_ms = statistics.median(results["compute"])
    torch_s, torch_tuned_s = med(results["torch"], "samples_s"), med(results["torch_tuned"], "samples_s")
    print(f"CPU reference workload, 2 ranks, medians of {args.rounds} alternating rounds")
    print(f"{'run':<42}{'samples/s':>11}{'step ms':>9}{'exposed wait':>14}{'1-compute/step':>16}")
    for name, key in [("lockstep --bucket-mb 25 (default)", "ls25"), ("lockstep --bucket-mb 4", "ls4")]:
        rows = results[key]
        step = med(rows, "step_ms")
        print(f"{name:<42}{med(rows, 'samples_s'):>11.0f}{step:>9.2f}{med(rows, 'exposed') * 100:>13.1f}%"
              f"{(1 - compute_ms / step) * 100:>15.1f}%")
    for name, key in [("torch DDP (as given)", "torch"), (f"torch DDP (OPENBLAS_CORETYPE={coretype})", "torch_tuned")]:
        rows = results[key]
        print(f"{name:<42}{med(rows, 'samples_s'):>11.0f}{med(rows, 'step_ms'):>9.2f}{'-':>14}"
              f"{med(rows, 'comm_overhead') * 100:>15.1f}%")
    print(f"lockstep compute-only step: {compute_ms:.2f} ms; torch compute-only step: "
          f"{med(results['torch'], 'compute_only_ms'):.2f} ms (as given), {med(results['torch_tuned'], 'compute_only_ms'):.2f} ms (tuned)")
    for name, key in [("default buckets", "ls25"), ("4 MB buckets", "ls4")]:
        ours = med(results[key], "samples_s")
        print(f"ratio lockstep ({name}) / torch: {ours / torch_s:.2f}x as given, {ours / torch_tuned_s:.2f}x tuned")


if __name__ == "__main__":
    main()
