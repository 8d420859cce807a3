"""GPT-2-small-sized training steps in PyTorch, for comparing allocators.

Random weights, synthetic tokens, bf16 autocast, AdamW, batch 8 x 512 (the gpt2_train trace's
workload). Prints one JSON line: ms per step (steps after the first two), the loss of the last
step, and torch.cuda.max_memory_allocated() (meaningful with PyTorch's own allocator; with
PYTORCH_NO_CUDA_MEMORY_CACHING=1 the shim's summary reports the peak instead).

--side-stream: the optimizer step runs on a second stream (waiting for the backward pass, the
next step waiting for it), so tensors are freed while work on two streams may still use them:
the multi-stream case of the shim's stream-aware fences (interposer/shim/stream_fence.h).
"""
import json
import statistics
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.attn(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=50257, d=768, layers=12, heads=12, ctx=1024):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    steps = int(args[0]) if args else 8
    # --nvtx: torch.cuda.nvtx ranges around forward, backward and the optimizer (for vramscope's
    # per-range figures); off by default so timings stay comparable.
    nvtx = "--nvtx" in sys.argv[1:]
    side = torch.cuda.Stream() if "--side-stream" in sys.argv[1:] else None
    # --snapshot FILE: PyTorch's allocator history from before the model exists, dumped to FILE
    # at the end (torch.cuda.memory._dump_snapshot), for `vramscope replay FILE`.
    snapshot = sys.argv[sys.argv.index("--snapshot") + 1] if "--snapshot" in sys.argv else None
    if snapshot:
        args.remove(snapshot)
        torch.cuda.memory._record_memory_history(max_entries=1000000)
    push = torch.cuda.nvtx.range_push if nvtx else (lambda name: None)
    pop = torch.cuda.nvtx.range_pop if nvtx else (lambda: None)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device=dev).manual_seed(1)
    times = []
    cpu = []
    loss = None
    for step in range(steps):
        idx = torch.randint(0, 50257, (8, 512), device=dev, generator=gen)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        c0 = time.process_time()
        push("forward")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), idx[:, 1:].reshape(-1))
        pop()
        push("backward")
        loss.backward()
        pop()
        push("optimizer")
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                opt.step()
                opt.zero_grad(set_to_none=True)
            torch.cuda.current_stream().wait_stream(side)
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
        pop()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    if snapshot:
        torch.cuda.memory._dump_snapshot(snapshot)
    timed = times[2:] if len(times) > 2 else times
    timed_cpu = cpu[2:] if len(cpu) > 2 else cpu
    print(json.dumps({
        "ms_per_step": sum(timed) / len(timed),
        # The median step (robust to a slow step), and the CPU time of the whole process (every
        # thread: the shim's helper too) per step.
        "ms_median": statistics.median(timed),
        "cpu_ms_per_step": sum(timed_cpu) / len(timed_cpu),
        "loss": round(float(loss.detach()), 4),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        # PyTorch's own peak of the sizes asked for (before its 512-byte rounding).
        "peak_requested_bytes": torch.cuda.memory_stats().get("requested_bytes.all.peak", 0),
        "caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1",
        "side_stream": side is not None,
    }))


if __name__ == "__main__":
    main()
