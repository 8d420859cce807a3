#!/usr/bin/env bash
# Regenerates the seed corpus of every fuzz target (tests/fuzz/corpus/TARGET/) from the project's
# own writers (make_seeds.cc, built in BUILD_DIR, default build) and the bundled traces. The output
# is the same on every run; commit what changed.
#   tests/fuzz/make_seeds.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
corpus=tests/fuzz/corpus
ninja -C "$build" tests/fuzz/make_seeds >/dev/null
rm -rf "$corpus"
mkdir -p "$corpus/trace"
"$build/tests/fuzz/make_seeds" "$corpus"
# Traces: the header and first lines of each bundled trace, as CSV and gzip'd, and a window from
# the middle of one (frees of allocations it does not hold). `head` closes the pipe early.
set +o pipefail
for trace in traces/*.csv.gz; do
  name=$(basename "$trace" .csv.gz)
  zcat "$trace" | head -n 40 >"$corpus/trace/$name.csv"
done
zcat traces/mlp_dynamic_train.csv.gz | head -n 400 | gzip -9n >"$corpus/trace/mlp_dynamic_train_head.csv.gz"
{ zcat traces/resnet50_train.csv.gz | head -n 1; zcat traces/resnet50_train.csv.gz | sed -n 1000,1040p; } \
  >"$corpus/trace/resnet50_middle.csv"
# Snapshots: PyTorch memory snapshot pickles (protocol 4 as torch.cuda.memory._dump_snapshot
# writes, and protocol 2 as `vramscope export` does) of the head and of a middle window of a trace.
mkdir -p "$corpus/snapshot"
python3 - "$corpus/snapshot" <<'PY'
import csv, gzip, itertools, pickle, sys
def entries(path, start, count):
    with gzip.open(path, "rt", newline="") as f:
        rows = itertools.islice(csv.DictReader(f), start, start + count)
        return [{"action": r["action"], "addr": int(r["addr"]), "size": int(r["size"]),
                 "stream": int(r["stream"]), "time_us": int(r["time_us"]),
                 "frames": [{"filename": "train.py", "line": 7, "name": r["site"]}]} for r in rows]
for name, start, protocol in (("gpt2_head", 0, 4), ("resnet50_middle", 1000, 2)):
    snap = {"segments": [], "device_traces": [[], entries("traces/%s_train.csv.gz" % name.split("_")[0], start, 40)]}
    with open("%s/%s.pickle" % (sys.argv[1], name), "wb") as out:
        pickle.dump(snap, out, protocol=protocol)
PY
du -sh "$corpus"
