"""PyTorch's numbers for the reference MLP workload only (the GPT part of torch_gpu_reference.py
takes minutes of device time and is not what lockstep-trainer runs). Prints one JSON object.

    /opt/torch/.venv/bin/python bench/gpu/mlp_reference.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch_gpu_reference as ref  # noqa: E402  (a copy of ../shared/reference/torch_gpu_reference.py)

if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = True
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0)}
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    dist.init_process_group("nccl", rank=0, world_size=1)
    out["mlp_plain"] = ref.mlp_bench(False)
    out["mlp_ddp1"] = ref.mlp_bench(True)
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)
