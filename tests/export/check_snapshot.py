#!/usr/bin/env python3
"""Checks a PyTorch memory snapshot pickle as memory_viz reads it, with Python's own pickle.

usage: check_snapshot.py FILE [--allocs N] [--live N] [--devices N] [--frame NAME]...
                              [--nvtx NAME]...

Exit 0 when the file holds {'segments': [...], 'device_traces': [[...], ...]} and, per device:
every entry has an action memory_viz knows, non-negative int addr/size/stream/time_us and
frames of {'filename': str, 'line': int, 'name': str}; time never goes back; a segment_free
frees a whole segment_alloc'd one; a segment_map maps memory not mapped yet and a segment_unmap
unmaps mapped memory (parts of mappings or several adjacent ones, as memory_viz joins and splits
them); neither frees memory under a live block; every alloc lies inside live segments (allocated
or mapped, not yet freed; adjacent ones together) of that device; every alloc is
followed by exactly one free_requested and then one free_completed of the same address and
size, or else is still live at the end and is an 'active_allocated' block of the same size in
the segments; the segments' blocks tile each segment exactly, and allocated_size is the sum of
its active blocks. The options add expected counts (all devices together) and frame names that
must appear. Otherwise prints what is wrong and exits 1.
"""
import argparse
import pickle
import sys

ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
           "snapshot", "segment_map", "segment_unmap"}


class Bad(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Bad(msg)


def check_frames(frames, where):
    need(isinstance(frames, list), f"{where}: frames is not a list")
    for f in frames:
        need(isinstance(f, dict) and set(f) >= {"filename", "line", "name"}, f"{where}: frame {f!r}")
        need(isinstance(f["filename"], str) and isinstance(f["name"], str), f"{where}: frame text")
        need(isinstance(f["line"], int) and f["line"] >= 0, f"{where}: frame line")


def check_entry(e, where):
    need(isinstance(e, dict), f"{where}: not a dict")
    need(e.get("action") in ACTIONS, f"{where}: action {e.get('action')!r}")
    for key in ("addr", "size", "stream", "time_us"):
        need(isinstance(e.get(key), int) and e[key] >= 0, f"{where}: {key} {e.get(key)!r}")
    check_frames(e.get("frames"), where)


def covered(segments, addr, size):
    """[addr, addr + size) lies in live segments (adjacent ones together, as a VMM pool maps)."""
    at, end = addr, addr + size
    for start, n in sorted(segments.items()):
        if start <= at < start + n:
            at = start + n
            if at >= end:
                return True
    return False


def unmap(segments, addr, size):
    """Takes [addr, addr + size) out of the mapped ranges; False unless all of it was mapped."""
    if not covered(segments, addr, size):
        return False
    end = addr + size
    for start, n in sorted(segments.items()):
        stop = start + n
        if stop <= addr or start >= end:
            continue
        del segments[start]
        if start < addr:
            segments[start] = addr - start
        if stop > end:
            segments[end] = stop - end
    return True


def check_device(device, trace, live_blocks, seen):
    segments = {}  # addr -> size, live now (segment_alloc'd)
    mapped = {}  # addr -> size, mapped now (segment_map'd, what is left of it)
    live = {}  # addr -> [size, state]: 'alloc' then 'requested'
    last = 0
    for i, e in enumerate(trace):
        where = f"device_traces[{device}][{i}]"
        check_entry(e, where)
        need(e["time_us"] >= last, f"{where}: time goes back")
        last = e["time_us"]
        a, addr, size = e["action"], e["addr"], e["size"]
        if a == "segment_alloc":
            need(addr not in segments, f"{where}: segment {addr:#x} allocated twice")
            segments[addr] = size
        elif a == "segment_free":
            need(segments.pop(addr, None) == size, f"{where}: segment_free of unknown {addr:#x}")
            need(not any(addr <= b < addr + size for b in live), f"{where}: freed with live blocks")
        elif a == "segment_map":
            need(not any(s < addr + size and addr < s + n for s, n in mapped.items()),
                 f"{where}: segment_map over mapped memory at {addr:#x}")
            mapped[addr] = size
        elif a == "segment_unmap":
            need(unmap(mapped, addr, size), f"{where}: segment_unmap of unmapped {addr:#x}+{size}")
            need(not any(b < addr + size and addr < b + v[0] for b, v in live.items()),
                 f"{where}: unmapped under a live block")
        elif a == "alloc":
            need(addr not in live, f"{where}: alloc of live {addr:#x}")
            need(covered({**segments, **mapped}, addr, size),
                 f"{where}: alloc {addr:#x}+{size} outside the live segments")
            live[addr] = [size, "alloc"]
            seen["allocs"] += 1
            for f in e["frames"]:
                seen["frames"].add(f["name"])
        elif a in ("free_requested", "free_completed"):
            want = "alloc" if a == "free_requested" else "requested"
            need(addr in live and live[addr][1] == want, f"{where}: {a} of {addr:#x} out of order")
            need(live[addr][0] == size, f"{where}: {a} size {size} != {live[addr][0]}")
            if a == "free_requested":
                live[addr][1] = "requested"
            else:
                del live[addr]
    need(all(v[1] == "alloc" for v in live.values()),
         f"device {device}: a free_requested without its free_completed")
    for addr, (size, _) in live.items():
        need(live_blocks.get((device, addr)) == size,
             f"device {device}: {addr:#x} live at the end is not an active block of size {size}")
    seen["live"] += len(live)


def check_segments(segments):
    blocks = {}
    for i, s in enumerate(segments):
        where = f"segments[{i}]"
        for key in ("device", "address", "total_size", "allocated_size", "active_size", "stream"):
            need(isinstance(s.get(key), int) and s[key] >= 0, f"{where}: {key}")
        need(s.get("segment_type") in ("small", "large"), f"{where}: segment_type")
        at, active = s["address"], 0
        for j, b in enumerate(s["blocks"]):
            need(b["address"] == at, f"{where}.blocks[{j}]: not contiguous")
            need(b["state"] in ("active_allocated", "active_awaiting_free", "inactive"), "state")
            check_frames(b["frames"], f"{where}.blocks[{j}]")
            at += b["size"]
            if b["state"] == "active_allocated":
                active += b["size"]
                blocks[(s["device"], b["address"])] = b["size"]
        need(at == s["address"] + s["total_size"], f"{where}: blocks do not fill the segment")
        need(s["allocated_size"] == active, f"{where}: allocated_size {s['allocated_size']}")
    return blocks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--allocs", type=int)
    p.add_argument("--live", type=int)
    p.add_argument("--devices", type=int)
    p.add_argument("--frame", action="append", default=[])
    args = p.parse_args()
    with open(args.file, "rb") as f:
        snap = pickle.load(f)
    try:
        need(isinstance(snap, dict), "not a dict")
        need(isinstance(snap.get("segments"), list), "no segments list")
        need(isinstance(snap.get("device_traces"), list), "no device_traces list")
        blocks = check_segments(snap["segments"])
        seen = {"allocs": 0, "live": 0, "frames": set()}
        for device, trace in enumerate(snap["device_traces"]):
            check_device(device, trace, blocks, seen)
        need(seen["live"] == len(blocks), f"{len(blocks)} active blocks, {seen['live']} live")
        for key in ("allocs", "live"):
            want = getattr(args, key)
            need(want is None or seen[key] == want, f"{seen[key]} {key}, expected {want}")
        need(args.devices is None or len(snap["device_traces"]) == args.devices, "device count")
        for name in args.frame:
            need(name in seen["frames"], f"no frame named {name!r} in {sorted(seen['frames'])}")
    except Bad as e:
        print(f"{args.file}: {e}")
        return 1
    print(f"{args.file}: ok: {seen['allocs']} allocs, {seen['live']} live at the end, "
          f"{len(snap['segments'])} segments, {len(snap['device_traces'])} devices")
    return 0


if __name__ == "__main__":
    sys.exit(main())
