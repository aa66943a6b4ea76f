"""A small CNN image classifier trained with PyTorch DDP, reporting to Lockstep.

It learns to tell 6 kinds of shapes apart (disk, square, triangle, cross, ring, stripes) in
32x32 grayscale pictures that the script draws itself, at random positions, sizes and
brightness over a noisy background: nothing is downloaded. Every picture follows from
(--seed, rank, index), so a run is the same whatever the number of DataLoader workers
(--workers, default 2) that draw them. It reaches about 99% held-out accuracy in the default
300 steps. Each rank trains on its own pictures and reports its samples and loss to Lockstep.

Gloo on CPUs, NCCL with one GPU per rank when CUDA is available. Run it as a 2-rank job:

    lockstepctl start --ranks 2 --wait --workdir /path/to/lockstep -- /usr/bin/python3 examples/ddp_cnn.py
"""

import argparse
import gc
import os
import time
import types

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

try:
    import lockstep  # on PYTHONPATH in every Lockstep job; outside one, watch() and step() do nothing
except ImportError:  # run where Lockstep is not installed at all: train all the same
    lockstep = types.SimpleNamespace(watch=lambda model: model, step=lambda **report: None)

CLASSES = ("disk", "square", "triangle", "cross", "ring", "stripes")
SIZE = 32


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    p.add_argument("--batch", type=int, default=64, help="pictures per rank and step (default 64)")
    p.add_argument("--lr", type=float, default=2e-3, help="initial Adam learning rate (default 2e-3)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank (default 2)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def draw(label, rng):
    """One picture of CLASSES[label], as float32 values around [0, 1]."""
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    r = rng.uniform(5, 11)
    cy, cx = rng.uniform(r, SIZE - r, size=2)
    dy, dx = y - cy, x - cx
    if label == 0:
        shape = dy**2 + dx**2 <= r**2
    elif label == 1:
        shape = (abs(dy) <= 0.8 * r) & (abs(dx) <= 0.8 * r)
    elif label == 2:  # apex up, base at the bottom
        shape = (dy <= r) & (abs(dx) <= (dy + r) / 2)
    elif label == 3:
        w = r / 3.5
        shape = ((abs(dx) <= w) & (abs(dy) <= r)) | ((abs(dy) <= w) & (abs(dx) <= r))
    elif label == 4:
        shape = ((0.55 * r) ** 2 <= dy**2 + dx**2) & (dy**2 + dx**2 <= r**2)
    else:  # bars across a square, horizontal or vertical
        period = rng.integers(3, 5)
        bars = (y if rng.random() < 0.5 else x).astype(int) // period % 2 == 0
        shape = bars & (abs(dy) <= r) & (abs(dx) <= r)
    image = shape * rng.uniform(0.5, 1.0) + rng.normal(0, rng.uniform(0.05, 0.25), (SIZE, SIZE))
    return image.astype(np.float32)


class Shapes(torch.utils.data.Dataset):
    """`length` pictures; the i-th is drawn from its own seed, so any worker can draw any of them."""

    def __init__(self, length, seed, stream):
        self.length, self.seed, self.stream = length, seed, stream

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        rng = np.random.default_rng([self.seed, self.stream, i])
        label = int(rng.integers(len(CLASSES)))
        return torch.from_numpy(draw(label, rng))[None], label


def classifier():
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2)]

    return nn.Sequential(*block(1, 16), *block(16, 32), *block(32, 64),  # 32 -> 16 -> 8 -> 4
                         nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, len(CLASSES)))


@torch.no_grad()
def held_out_accuracy(model, seed, rank, world, device):
    """Accuracy on 512 pictures per rank that no rank trained on, over all ranks."""
    model.eval()
    loader = torch.utils.data.DataLoader(Shapes(512, seed, 1000 + rank), batch_size=256)
    counts = torch.zeros(2, device=device)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        counts += torch.stack([(model(x).argmax(1) == y).sum(), torch.tensor(len(y), device=device)])
    dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item()


def main():
    args = parse_args()
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    # Exactly --steps batches per rank, each rank a stream of pictures of its own.
    loader = torch.utils.data.DataLoader(Shapes(args.steps * args.batch, args.seed, rank), batch_size=args.batch,
                                         num_workers=args.workers, pin_memory=device.type == "cuda")
    if rank == 0:
        print("%d classes (%s); %d ranks on %s, %d pictures per rank and step, %d DataLoader workers each"
              % (len(CLASSES), ", ".join(CLASSES), world, device, args.batch, args.workers), flush=True)

    torch.manual_seed(args.seed)
    model = classifier().to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    lockstep.watch(ddp)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)
    # Decaying to zero settles the last steps: a few points of held-out accuracy over a constant rate.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)

    began, correct, seen = time.perf_counter(), 0, 0
    for step, (x, y) in enumerate(loader, start=1):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = ddp(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        lr = schedule.get_last_lr()[0]
        opt.step()
        schedule.step()
        lockstep.step(samples=len(x), loss=loss, lr=lr)
        if rank == 0:
            # Read back only at print time: on a GPU each .item() waits for the step to finish.
            correct, seen = correct + (logits.argmax(1) == y).sum(), seen + len(y)
            if step % 20 == 0 or step == args.steps:
                print("step %d/%d loss %.3f train accuracy %.3f %.0f pictures/s per rank"
                      % (step, args.steps, loss.item(), correct.item() / seen,
                         step * args.batch / (time.perf_counter() - began)), flush=True)
                correct, seen = 0, 0

    with lockstep.phase("eval"):  # a box of its own on the timeline, judged on its own for stalls
        accuracy = held_out_accuracy(model, args.seed, rank, world, device)
    if rank == 0:
        print("held-out accuracy %.3f on %d pictures" % (accuracy, 512 * world), flush=True)

    # Debian's torch 1.13 with Gloo aborts or hangs at exit unless the DDP model is gone before
    # the process group, on every rank.
    dist.barrier()
    del ddp, opt, schedule
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
