#!/usr/bin/python3
"""The CPU reference workload in PyTorch DDP (gloo), with the knobs a user would turn to make it fast:
bucket_cap_mb, gradient_as_bucket_view, BLAS threads, each rank pinned to its own cores. A
torchrun-style program (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so that the benches start it
beside lockstep-trainer and lockstep's agent starts it as a job of the user's own (--instrument:
lockstep.watch and lockstep.step report every step).

Workload (../shared/reference/torch_cpu_reference.py): MLP 784-1024-1024-10 (ReLU), batch 64 per
rank, SGD lr 0.01, synthetic data. Rank 0 prints one JSON line: samples_s (all ranks, timed steps),
step_ms (median). Set OPENBLAS_CORETYPE in the environment to choose OpenBLAS's kernels.

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600 /usr/bin/python3 bench/torch_ddp.py ...
"""
import argparse
import gc
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--warmup", type=int, default=50)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--bucket-cap-mb", type=float, default=25)
ap.add_argument("--grad-as-bucket-view", action="store_true")
ap.add_argument("--pin", action="store_true", help="each local rank on its own share of the allowed CPUs")
ap.add_argument("--instrument", action="store_true")
args = ap.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ.get("LOCAL_RANK", rank))
local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
if args.pin:
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // local_world
    if share >= 1:
        os.sched_setaffinity(0, cpus[local_rank * share:(local_rank + 1) * share])
torch.set_num_threads(args.threads)
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
ddp = DDP(model, bucket_cap_mb=args.bucket_cap_mb, gradient_as_bucket_view=args.grad_as_bucket_view)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
lossf = nn.CrossEntropyLoss()
if args.instrument:
    import lockstep

    lockstep.watch(ddp)
g = torch.Generator().manual_seed(1234 + rank)
X = torch.randn(args.batch * 8, 784, generator=g)
Y = torch.randint(0, 10, (args.batch * 8,), generator=g)

times = []
for i in range(args.warmup + args.steps):
    if i == args.warmup:
        dist.barrier()
        start = time.perf_counter()
    t0 = time.perf_counter()
    s = (i % 8) * args.batch
    opt.zero_grad(set_to_none=not args.grad_as_bucket_view)
    loss = lossf(ddp(X[s:s + args.batch]), Y[s:s + args.batch])
    loss.backward()
    opt.step()
    if args.instrument:
        lockstep.step(samples=args.batch, loss=loss)
    if i >= args.warmup:
        times.append(time.perf_counter() - t0)
dist.barrier()
wall = time.perf_counter() - start
if rank == 0:
    print(json.dumps({"samples_s": world * args.batch * args.steps / wall, "step_ms": statistics.median(times) * 1e3,
                      "bucket_cap_mb": args.bucket_cap_mb, "grad_as_bucket_view": args.grad_as_bucket_view,
                      "pin": args.pin, "threads": args.threads}), flush=True)
# torch 1.13: drop DDP before destroying the process group, or the exit can hang
del ddp, opt
gc.collect()
dist.barrier()
dist.destroy_process_group()
