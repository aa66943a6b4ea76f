"""Issue 2: weights move to and from PyTorch, and a Lockstep run is the same computation as PyTorch.

PyTorch builds an MLP as an nn.ModuleList called `layers`, saves its initial weights as safetensors
and a data set as .npy files; lockstep-trainer trains from them with 2 ranks; PyTorch then repeats
the same steps on one process with the global batch. Per-step losses and final weights must agree
(relative error 1e-5 per tensor: float32 sums in a different order).

Usage: pytorch_interop_test.py LOCKSTEP_TRAINER
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn as nn
except ImportError as e:
    sys.exit(f"this test needs Debian's python3-torch and python3-numpy ({e}); ./lockstep.sh test installs them")

TOLERANCE = 1e-5


def save_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().float().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        begin, end = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(raw[8 + n + begin:8 + n + end], dtype=np.float32).copy()).reshape(info["shape"])
    return out


class Mlp(nn.Module):
    def __init__(self, sizes, activation):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.act = activation

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = self.act(x)
        return x


def check_case(trainer, tmp, name, activation, make_optimizer, flags):
    torch.manual_seed(7)
    # 3 ranks x 32: an epoch of 430 samples is 4 steps of 96 and one of 46 (rank 0: 32, rank 1: 14,
    # rank 2: none); 10 steps cross the epoch boundary.
    sizes, n, world, batch, steps = [16, 48, 32, 5], 430, 3, 32, 10
    model = Mlp(sizes, nn.ReLU() if activation == "relu" else nn.GELU())
    x = torch.randn(n, sizes[0])
    y = torch.randint(0, sizes[-1], (n,))
    d = os.path.join(tmp, name)
    os.makedirs(d)
    np.save(os.path.join(d, "x.npy"), x.numpy())
    np.save(os.path.join(d, "y.npy"), y.numpy())
    save_safetensors(os.path.join(d, "init.safetensors"), model.state_dict())

    run = subprocess.run([trainer, "--nproc", str(world), "--layers", ",".join(map(str, sizes)), "--activation", activation,
                          "--dataset", f"npy:{d}/x.npy,{d}/y.npy", "--no-shuffle", "--batch-per-rank", str(batch),
                          "--steps", str(steps), "--bucket-mb", "0.001", "--init-weights", f"{d}/init.safetensors", "--save-weights",
                          f"{d}/final.safetensors", "--metrics-out", f"{d}/m.jsonl", "--quiet"] + flags,
                         capture_output=True, text=True, timeout=120)
    if run.returncode != 0:
        sys.exit(f"{name}: lockstep-trainer failed ({run.returncode}):\n{run.stderr}")
    ours = {}
    for line in open(f"{d}/m.jsonl"):
        m = json.loads(line)
        ours[m["step"]] = m["global_loss"]

    optimizer = make_optimizer(model.parameters())
    global_batch = world * batch
    steps_per_epoch = -(-n // global_batch)
    failures = []
    for step in range(steps):
        start = (step % steps_per_epoch) * global_batch
        xb, yb = x[start:start + global_batch], y[start:start + global_batch]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        if abs(ours[step + 1] - loss.item()) > TOLERANCE * max(1.0, abs(loss.item())):
            failures.append(f"step {step + 1}: loss {ours[step + 1]} vs PyTorch {loss.item()}")
    final = load_safetensors(f"{d}/final.safetensors")
    reference = model.state_dict()
    if set(final) != set(reference):
        failures.append(f"tensor names differ: {sorted(final)} vs {sorted(reference)}")
    for key, ref in reference.items():
        if key in final:
            err = ((final[key] - ref).norm() / ref.norm()).item()
            if not err <= TOLERANCE:
                failures.append(f"{key}: relative error {err:.2e} > {TOLERANCE}")
    moved = ((final["layers.0.weight"] - load_safetensors(f"{d}/init.safetensors")["layers.0.weight"]).norm()).item()
    if moved < 1e-3:
        failures.append("the weights did not move: the comparison would prove nothing")
    print(f"{name}: {'OK' if not failures else 'FAILED'}; final loss {ours[steps]:.6f}")
    return failures


def main():
    trainer = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        failures += check_case(trainer, tmp, "relu-sgd", "relu",
                               lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3),
                               ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9", "--weight-decay", "1e-3"])
        failures += check_case(trainer, tmp, "gelu-nesterov", "gelu",
                               lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, nesterov=True),
                               ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.8", "--nesterov"])
        failures += check_case(trainer, tmp, "relu-adamw", "relu",
                               lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.05),
                               ["--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.05"])
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
