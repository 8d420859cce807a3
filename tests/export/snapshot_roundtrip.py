#!/usr/bin/env python3
"""Replays each bundled CSV trace and the same events as a PyTorch memory snapshot.

The snapshot is written by Python's own pickle module (protocol 4 with framing and memo, the
default that torch.cuda.memory._dump_snapshot gets), shaped as PyTorch writes it: segments, and
device_traces entries with action/addr/size/stream/time_us/frames. `vramscope replay --json` must
give the same figures for both files (all but the timings and the trace name).

usage: snapshot_roundtrip.py VRAMSCOPE TRACES_DIR
"""
import csv
import gzip
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile

VARYING = {"trace", "ns_per_event", "timed_runs"}


def snapshot_of(csv_path):
    entries = []
    with gzip.open(csv_path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            site = row["site"]
            frames = []
            if site:
                parts = site.rsplit(":", 2)
                if len(parts) == 3 and parts[1].isdigit():
                    frames = [{"filename": parts[0], "line": int(parts[1]), "name": parts[2]}]
            entries.append({"action": row["action"], "addr": int(row["addr"]),
                            "size": int(row["size"]), "stream": int(row["stream"]),
                            "time_us": int(row["time_us"]), "frames": frames})
    # Two devices: an empty one first, so the loader has to find the trace with allocs.
    return {"segments": [], "device_traces": [[], entries],
            "allocator_settings": {"expandable_segments": False, "max_split_size": -1,
                                   "garbage_collection_threshold": 0.0}}


def replay(vramscope, path, *extra):
    out = subprocess.run([vramscope, "replay", "--json", path, *extra], check=True,
                         capture_output=True, text=True)
    return {k: v for k, v in json.loads(out.stdout).items() if k not in VARYING}


def main():
    vramscope, traces = sys.argv[1], sys.argv[2]
    names = sorted(n for n in os.listdir(traces) if n.endswith(".csv.gz"))
    if not names:
        sys.exit("no traces in " + traces)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            csv_path = os.path.join(traces, name)
            snap = os.path.join(tmp, name + ".pickle")
            with open(snap, "wb") as f:
                pickle.dump(snapshot_of(csv_path), f, protocol=4)
            want, got = replay(vramscope, csv_path), replay(vramscope, snap)
            if want != got:
                sys.exit(f"{name}: CSV replay {want}\n  != snapshot replay {got}")
            explicit = replay(vramscope, snap, "--device", "1")
            if explicit != got:
                sys.exit(f"{name}: --device 1 differs from the default device")
            print(f"{name}: snapshot replay matches the CSV replay "
                  f"(peak reserved {got['peak_reserved_bytes']}, {got['alloc_events']} allocs)")


if __name__ == "__main__":
    main()
