"""Training programs that communicate without DDP's all-reduce, as people write them, for the tests
of issue 42 (every collective measured). Each times its own collectives by its own clock and
writes what it measured, so that Lockstep's figures can be held against it.

  --mode allreduce  averages the gradients itself: one dist.all_reduce of the flattened gradients
  --mode allgather  gathers every rank's gradients (dist.all_gather) and takes their mean locally
  --mode async      the all-reduce of --mode allreduce with async_op=True, waited after some compute
  --mode zero       ZeroRedundancyOptimizer over DDP: its broadcasts of the parameters after step()
  --mode zero3      ZeRO-3 by hand: each rank keeps a shard of the parameters, all-gathers them
                    before forward and reduces each shard's gradient to its owner after backward
  --steps N         optimizer steps (default 30)
  --hidden N        the model's width (default 1024: a few MB of gradients a step)
  --own FILE        write this rank's own measurements there (JSON; %d: the rank)
  --hang-rank R --hang-at S   rank R blocks forever before the collectives of step S
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
import lockstep

p = argparse.ArgumentParser()
p.add_argument("--mode", required=True, choices=["allreduce", "allgather", "async", "zero", "zero3"])
p.add_argument("--steps", type=int, default=30)
p.add_argument("--hidden", type=int, default=1024)
p.add_argument("--own", default="")
p.add_argument("--hang-rank", type=int, default=-1)
p.add_argument("--hang-at", type=int, default=0)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, args.hidden),
                            torch.nn.ReLU(), torch.nn.Linear(args.hidden, 8))
own = {"steps": 0, "step_s": 0.0, "collective_s": 0.0, "collectives": 0, "bytes": 0, "kinds": {}}


def timed(kind, nbytes, call):
    """Runs one blocking collective, timed by the program's own clock."""
    began = time.perf_counter()
    result = call()
    took = time.perf_counter() - began
    own["collective_s"] += took
    own["collectives"] += 1
    own["bytes"] += nbytes
    own["kinds"][kind] = own["kinds"].get(kind, 0) + 1
    return result


def hang_if_asked(step):
    if rank == args.hang_rank and step == args.hang_at:
        while True:
            time.sleep(1)


def flat_grads(params):
    return torch.cat([q.grad.reshape(-1) for q in params])


def set_grads(params, flat):
    offset = 0
    for q in params:
        q.grad.copy_(flat[offset:offset + q.numel()].view_as(q))
        offset += q.numel()


def average_all_reduce(params, step):
    flat = flat_grads(params)
    hang_if_asked(step)
    timed("all_reduce", flat.numel() * 4, lambda: dist.all_reduce(flat))
    set_grads(params, flat / world)


def average_all_gather(params, step):
    flat = flat_grads(params)
    gathered = [torch.empty_like(flat) for _ in range(world)]
    hang_if_asked(step)
    timed("all_gather", flat.numel() * 4 * world, lambda: dist.all_gather(gathered, flat))
    set_grads(params, torch.stack(gathered).mean(0))


def average_async(params, step, x):
    flat = flat_grads(params)
    hang_if_asked(step)
    work = dist.all_reduce(flat, async_op=True)
    # Compute while the all-reduce runs: the part of it that is hidden. One forward, not more: with
    # three, a quiet machine hid all of it, and the wait left to measure was under 1% of the step.
    with torch.no_grad():
        model(x)
    timed("all_reduce", flat.numel() * 4, work.wait)
    set_grads(params, flat / world)


def run_plain(mode):
    params = list(model.parameters())
    lockstep.watch(model)
    opt = torch.optim.SGD(params, lr=0.01)
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        x, y = torch.randn(256, 64), torch.randn(256, 8)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        {"allreduce": average_all_reduce, "allgather": average_all_gather}.get(mode, lambda p, s: average_async(p, s, x))(params, step)
        opt.step()
        finish(began, 256, loss)


def run_zero():
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model)
    lockstep.watch(ddp)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=0.01)
    own["bytes_per_step"] = sum(q.numel() * 4 for q in model.parameters())
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        x, y = torch.randn(256, 64), torch.randn(256, 8)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        hang_if_asked(step)
        timed("optimizer_step", 0, opt.step)  # its broadcasts are in here, with the local update
        finish(began, 256, loss)


def run_zero3():
    """Each rank owns every world-th parameter tensor: it keeps the master copy, gathers the others'
    before forward and receives the sum of its tensors' gradients after backward."""
    params = list(model.parameters())
    lockstep.watch(model)
    owner = {i: i % world for i in range(len(params))}
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        x, y = torch.randn(256, 64), torch.randn(256, 8)
        hang_if_asked(step)
        for i, q in enumerate(params):  # all-gather every tensor from its owner before forward
            parts = [torch.empty_like(q.data) for _ in range(world)]
            timed("all_gather", q.numel() * 4 * world, lambda: dist.all_gather(parts, q.data))
            q.data.copy_(parts[owner[i]])
        loss = torch.nn.functional.mse_loss(model(x), y)
        for q in params:
            q.grad = None
        loss.backward()
        for i, q in enumerate(params):  # each tensor's gradient summed on its owner, who updates it
            timed("reduce", q.numel() * 4, lambda: dist.reduce(q.grad, dst=owner[i]))
            if owner[i] == rank:
                with torch.no_grad():
                    q -= 0.01 * q.grad / world
        finish(began, 256, loss)


def finish(began, samples, loss):
    own["steps"] += 1
    own["step_s"] += time.perf_counter() - began
    lockstep.step(samples=samples, loss=loss)


{"zero": run_zero, "zero3": run_zero3}.get(args.mode, lambda: run_plain(args.mode))()
if args.own:
    with open(args.own % rank if "%d" in args.own else args.own, "w") as f:
        json.dump(own, f)
dist.destroy_process_group()
print("done", json.dumps(own), flush=True)
