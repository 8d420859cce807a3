"""torch.multiprocessing CUDA-tensor round trip (tests/gpu/run_all.sh step 11).

spawn context, a Queue: the parent sends CUDA tensors (a whole tensor, a view at an offset inside
a larger caching-allocator segment, one of 40 MiB spanning several granules), the child adds in
place and answers; the parent checks every element. Prints one result line, compared across no
shim, the shim's pool and passthrough; exit 0 when every check held.
"""
import sys
import time

import torch
import torch.multiprocessing as mp


def child(inbox, outbox):
    torch.cuda.set_device(0)
    while True:
        item = inbox.get()
        if item is None:
            break
        name, tensor, amount = item
        tensor.add_(amount)
        torch.cuda.synchronize()
        del tensor
        outbox.put(name)


def main():
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=child, args=(inbox, outbox))
    proc.start()
    dev = torch.device("cuda", 0)
    whole = torch.arange(1 << 16, dtype=torch.float32, device=dev)
    base = torch.zeros(3 << 20, dtype=torch.float32, device=dev)
    view = base[12345:12345 + 100000]
    big = torch.ones(10 << 20, dtype=torch.float32, device=dev)  # 40 MiB
    cases = [("whole", whole, 1.0), ("view", view, 2.0), ("big", big, 3.0)]
    expected = {"whole": whole.clone() + 1.0, "view": view.clone() + 2.0, "big": big.clone() + 3.0}
    t0 = time.perf_counter()
    for case in cases:
        inbox.put(case)
        outbox.get(timeout=60)
    elapsed = time.perf_counter() - t0
    inbox.put(None)
    proc.join(60)
    torch.cuda.synchronize()
    ok = {name: bool(torch.equal(t, expected[name])) for name, t, _ in cases}
    # Outside the view nothing changed.
    ok["view_bounds"] = bool(base[:12345].eq(0).all()) and bool(base[12345 + 100000:].eq(0).all())
    ok["child_exit"] = proc.exitcode == 0
    print("torch_ipc " + " ".join("%s=%s" % (k, "ok" if v else "BAD") for k, v in sorted(ok.items())))
    print("timing round_trips_ms=%.1f" % (elapsed * 1000), file=sys.stderr)
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
