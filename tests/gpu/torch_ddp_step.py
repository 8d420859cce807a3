"""GPT-2-small-sized DistributedDataParallel training steps on two GPUs, for tests/gpu/run_x2.sh.

    torchrun --standalone --nproc_per_node=2 tests/gpu/torch_ddp_step.py [STEPS]

NCCL process group, each rank on cuda:LOCAL_RANK, the GPT of torch_gpt2.py (random weights,
synthetic tokens), bf16 autocast, AdamW, batch 4 x 512 per rank, STEPS (default 4) steps. Each
rank prints one JSON line: rank, pid, the device it used, and of that device (meaningful with
PyTorch's own allocator) torch.cuda.max_memory_allocated(), max_memory_reserved() and the peak of
the sizes asked for (memory_stats' requested_bytes.all.peak, before PyTorch's 512-byte rounding
and block reuse), then the loss of its last step and ms per step (steps after the first two).
NVLink multicast (NCCL NVLS, symmetric memory) stays off.
"""
import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt2 import GPT  # noqa: E402


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    try:
        dist.init_process_group(backend="nccl", device_id=dev)
    except TypeError:  # PyTorch before 2.3: no device_id
        dist.init_process_group(backend="nccl")
    torch.manual_seed(0)
    model = DDP(GPT().to(dev), device_ids=[local_rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=dev).manual_seed(1 + rank)
    times = []
    loss = None
    for _ in range(steps):
        idx = torch.randint(0, 50257, (4, 512), device=dev, generator=gen)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - t0) * 1000)
    timed = times[2:] if len(times) > 2 else times
    stats = torch.cuda.memory_stats(local_rank)
    print(json.dumps({
        "rank": rank,
        "pid": os.getpid(),
        "device": local_rank,
        "max_memory_allocated": torch.cuda.max_memory_allocated(local_rank),
        "max_memory_reserved": torch.cuda.max_memory_reserved(local_rank),
        "peak_requested_bytes": stats.get("requested_bytes.all.peak", 0),
        "loss": round(float(loss.detach()), 4),
        "ms_per_step": sum(timed) / len(timed),
        "caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1",
    }), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
