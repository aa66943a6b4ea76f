"""A byte-level Transformer language model trained with PyTorch DDP, reporting to Lockstep.

It learns to predict the next byte of the licence texts every Debian system ships in
/usr/share/common-licenses (GPL, LGPL, GFDL, Apache-2.0, ...; or the files given with --text):
a few causal nn.TransformerEncoder layers over a 256-byte vocabulary. The loss starts at
ln(256) ~ 5.5 and falls to about 2 in the default 300 steps; at the end rank 0 prints the
held-out loss and a sample of generated text. Each rank trains on random windows of its own
(seeded by its rank), and reports its samples, tokens and loss to Lockstep every step.

Gloo on CPUs, NCCL with one GPU per rank when CUDA is available. Run it as a 2-rank job:

    lockstepctl start --ranks 2 --wait --workdir /path/to/lockstep -- /usr/bin/python3 examples/ddp_transformer_lm.py
"""

import argparse
import gc
import glob
import math
import os
import time
import types

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

try:
    import lockstep  # on PYTHONPATH in every Lockstep job; outside one, watch() and step() do nothing
except ImportError:  # run where Lockstep is not installed at all: train all the same
    lockstep = types.SimpleNamespace(watch=lambda model: model, step=lambda **report: None)

LICENCES = "/usr/share/common-licenses/*"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    p.add_argument("--batch", type=int, default=32, help="windows per rank and step (default 32)")
    p.add_argument("--seq", type=int, default=64, help="bytes per window (default 64)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate (default 2e-3)")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", nargs="+", default=None, help="train on these files instead of the licences")
    return p.parse_args()


def read_corpus(paths):
    """The files' bytes, concatenated. Several licence names are symlinks to the same text
    (GPL -> GPL-3): each file is read once, in a fixed order, so every rank sees the same corpus."""
    seen, chunks = set(), []
    for path in sorted(paths):
        real = os.path.realpath(path)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        with open(real, "rb") as f:
            chunks.append(f.read())
    if not chunks:
        raise SystemExit("no text to train on: none of %s exists" % " ".join(paths))
    return torch.tensor(list(b"\n\n".join(chunks)), dtype=torch.long), len(chunks)


class ByteLM(nn.Module):
    def __init__(self, d_model, layers, max_len):
        super().__init__()
        self.embed = nn.Embedding(256, d_model)
        self.position = nn.Parameter(torch.zeros(max_len, d_model))
        # Pre-norm layers train stably at a learning rate high enough to learn in a few hundred steps.
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, 256)
        mask = torch.triu(torch.full((max_len, max_len), float("-inf")), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x):
        t = x.shape[1]
        h = self.embed(x) + self.position[:t]
        h = self.encoder(h, mask=self.causal[:t, :t])
        return self.head(self.norm(h))


def windows(data, batch, seq, generator, device):
    """`batch` random windows of `seq` bytes, and the same windows shifted by one: the targets."""
    starts = torch.randint(0, len(data) - seq - 1, (batch, 1), generator=generator)
    chunk = data[starts + torch.arange(seq + 1)]
    chunk = chunk.to(device, non_blocking=True)
    return chunk[:, :-1], chunk[:, 1:]


@torch.no_grad()
def held_out_loss(model, data, batch, seq, device, world):
    """Mean loss over 8 batches of held-out windows per rank, averaged over the ranks."""
    g = torch.Generator().manual_seed(12345 + dist.get_rank())
    total = torch.zeros(1, device=device)
    for _ in range(8):
        x, y = windows(data, batch, seq, g, device)
        total += nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    dist.all_reduce(total)
    return total.item() / (8 * world)


@torch.no_grad()
def sample(model, prompt, length, seq, device):
    model.eval()
    out = torch.tensor([list(prompt)], device=device)
    g = torch.Generator(device=device).manual_seed(0)
    for _ in range(length):
        logits = model(out[:, -seq:])[0, -1]
        # A slightly sharpened distribution: fewer typos than plain sampling, less looping than argmax.
        out = torch.cat([out, torch.multinomial(torch.softmax(logits / 0.7, -1), 1, generator=g)[None]], 1)
    return bytes(out[0].tolist()).decode("utf-8", "replace")


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

    corpus, files = read_corpus(args.text or glob.glob(LICENCES))
    split = int(len(corpus) * 0.95)  # the last 5% are never trained on
    train, valid = corpus[:split], corpus[split:]
    if len(valid) <= args.seq + 1:
        raise SystemExit("the text is too short for --seq %d" % args.seq)
    if rank == 0:
        print("%d files, %d bytes; %d ranks on %s, %d bytes per rank and step"
              % (files, len(corpus), world, device, args.batch * args.seq), flush=True)

    torch.manual_seed(args.seed)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
    model = ByteLM(args.d_model, args.layers, args.seq).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    lockstep.watch(ddp)
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr, weight_decay=0.01)
    warmup = max(1, min(30, args.steps // 10))
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))

    g = torch.Generator().manual_seed(1000 * args.seed + rank)  # each rank its own windows
    began = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = windows(train, args.batch, args.seq, g, device)
        loss = nn.functional.cross_entropy(ddp(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        lr = schedule.get_last_lr()[0]
        opt.step()
        schedule.step()
        lockstep.step(samples=len(x), tokens=x.numel(), loss=loss, lr=lr)
        if rank == 0 and (step % 20 == 0 or step == args.steps):
            elapsed = time.perf_counter() - began
            print("step %d/%d loss %.3f lr %.2g %.0f tokens/s per rank"
                  % (step, args.steps, loss.item(), lr, step * x.numel() / elapsed), flush=True)

    with lockstep.phase("eval"):  # a box of its own on the timeline, judged on its own for stalls
        valid_loss = held_out_loss(model, valid, args.batch, args.seq, device, world)
    if rank == 0:
        print("held-out loss %.3f (%.2f bits per byte)" % (valid_loss, valid_loss / math.log(2)), flush=True)
        print("sample: %r" % sample(model, b"This program is ", 120, args.seq, device), flush=True)

    # Debian's torch 1.13 with Gloo aborts or hangs at exit unless the DDP model is gone before
    # the process group, on every rank.
    dist.barrier()
    del ddp, opt, schedule
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
