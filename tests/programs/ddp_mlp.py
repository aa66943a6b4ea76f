"""A PyTorch DDP program as users write them, for the tests of issue 13 (your own program under
Lockstep). It learns a fixed linear rule on random data, so its loss falls.

  --instrument        call lockstep.watch and lockstep.step (without it: no lockstep at all)
  --steps N           optimizer steps (default 40)
  --workers N         DataLoader worker processes (default 0)
  --sleep-ms N        extra time per batch in the data pipeline
  --slow-rank R --slow-ms N   rank R computes N ms longer each step (the others wait for it)
  --fail-rank R --fail-at S   rank R raises at step S (of every attempt, or --fail-attempt A's)
  --done FILE         write how the run ended there (the step calls' slowest time, in ms)
  --hang-rank R --hang-at S   rank R blocks forever in stuck_in_my_loader() at step S (0% CPU)
  --phase-every K --phase-s X every K steps each rank spends X s in an announced "checkpoint"
                      phase (with --instrument: lockstep.phase)
  --slow-data-rank R --slow-data-ms N   rank R waits N ms longer for each batch (a slow data pipeline)
  --nan-at S          from step S on, the loss each rank reports is NaN
  --stop-file FILE    with --instrument: the ranks agree each step on lockstep.should_stop(); once
                      asked, each writes FILE.RANK ("stopped at step S") and leaves the loop
  --eval-every K      every K steps, between the optimizer's step and lockstep.step, an "eval" phase:
                      a forward without autograd and X/2 s more
"""

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

p = argparse.ArgumentParser()
p.add_argument("--instrument", action="store_true")
p.add_argument("--steps", type=int, default=40)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--sleep-ms", type=float, default=0)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-ms", type=float, default=0)
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--fail-at", type=int, default=0)
p.add_argument("--fail-attempt", type=int, default=-1)
p.add_argument("--done", default="")
p.add_argument("--hang-rank", type=int, default=-1)
p.add_argument("--hang-at", type=int, default=0)
p.add_argument("--phase-every", type=int, default=0)
p.add_argument("--phase-s", type=float, default=0)
p.add_argument("--eval-every", type=int, default=0)
p.add_argument("--slow-data-rank", type=int, default=-1)
p.add_argument("--slow-data-ms", type=float, default=0)
p.add_argument("--nan-at", type=int, default=0)
p.add_argument("--stop-file", default="")
args = p.parse_args()

names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
         "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TORCHELASTIC_RESTART_COUNT"]
print("env " + " ".join("%s=%s" % (n, os.environ.get(n, "<unset>")) for n in names), flush=True)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
rule = torch.randn(32, 4, generator=torch.Generator().manual_seed(7))


class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, i):
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1000 / 64)
        g = torch.Generator().manual_seed(i * world + rank)
        x = torch.randn(32, generator=g)
        return x, (x @ rule).argmax()


loader = torch.utils.data.DataLoader(Rows(), batch_size=64, num_workers=args.workers)
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
if args.instrument:
    import lockstep

    lockstep.watch(model)
    if args.stop_file:
        lockstep.should_stop()  # from here on, being asked to stop is noted, not fatal

def stuck_in_my_loader():
    """A data pipeline that never delivers: the process lives on, at 0% CPU."""
    import threading

    threading.Event().wait()


def save_checkpoint():
    time.sleep(args.phase_s)


slowest = 0.0
for step, (x, y) in enumerate(loader, start=1):
    if step > args.steps:
        break
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == args.fail_rank and step == args.fail_at and args.fail_attempt in (-1, attempt):
        raise RuntimeError("rank %d gave up at step %d on purpose" % (rank, step))
    if rank == args.hang_rank and step == args.hang_at:
        stuck_in_my_loader()
    if rank == args.slow_data_rank:
        time.sleep(args.slow_data_ms / 1000)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    if rank == args.slow_rank:
        time.sleep(args.slow_ms / 1000)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if args.instrument and args.eval_every and step % args.eval_every == 0:
        with lockstep.phase("eval"):
            with torch.no_grad():
                model(x)
            time.sleep(args.phase_s / 2)
    if args.instrument:
        began = time.perf_counter()
        reported = float("nan") if args.nan_at and step >= args.nan_at else loss
        lockstep.step(samples=len(x), loss=reported, tokens=len(x) * 32)
        slowest = max(slowest, time.perf_counter() - began)
    if args.stop_file:
        asked = torch.tensor([1 if lockstep.should_stop() else 0])
        dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        if asked.item():
            with open(args.stop_file + ".%d" % rank, "w") as f:
                f.write("stopped at step %d\n" % step)
            break
    if step % 10 == 0:
        print("step %d loss %.4f" % (step, loss.item()), flush=True)
    if args.phase_every and step % args.phase_every == 0:
        if args.instrument:
            with lockstep.phase("checkpoint"):
                save_checkpoint()
        else:
            save_checkpoint()

# Debian's torch 1.13 can abort ("terminate called without an active exception") or hang in
# teardown when ranks leave at different times, or when DDP outlives the process group.
dist.barrier()
del model, opt
gc.collect()
dist.barrier()
dist.destroy_process_group()
if args.done:
    with open(args.done + ".%d" % rank, "w") as f:
        f.write("%.3f\n" % (slowest * 1000))
