"""An instrumented PyTorch DDP program on one GPU (NCCL, world size 1), for the gpu tests of
issue 13: exposed communication measured with CUDA events. Run by tests/gpu_test.cpp through an
agent, with the GPU machine's PyTorch ($LOCKSTEP_TORCH_PYTHON)."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import lockstep

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 50
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl")
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                                    torch.nn.Linear(4096, 1000)).cuda(), device_ids=[local])
lockstep.watch(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(4096, 1024, device="cuda")
y = torch.randint(0, 1000, (4096,), device="cuda")
for step in range(steps):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    lockstep.step(samples=len(x), loss=loss)  # a CUDA tensor: read once the step's GPU work is done
torch.cuda.synchronize()
dist.barrier()
dist.destroy_process_group()
