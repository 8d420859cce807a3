"""Per-rank memory figures of tests/gpu/torch_ddp_step.py runs, for tests/gpu/run_x2.sh.

    ddp_ranks.py observe OBS OBS_REPORT
    ddp_ranks.py compare OWN OBS OBS_REPORT TRACED TRACED_REPORT

OWN, OBS and TRACED are the stdout of three torchrun runs of torch_ddp_step.py (each rank's JSON
line, as torchrun passes it through): OWN with PyTorch's own allocator and no shim; OBS the same
under `vramscope run` with VRAMSCOPE_MODE=passthrough (OBS_REPORT its --json report); TRACED with
PYTORCH_NO_CUDA_MEMORY_CACHING=1 under `vramscope run` (TRACED_REPORT). A rank's report is the one
whose pid the rank printed, else the process whose largest device peak is on the rank's device;
its section is that of the rank's device.

The figures, per rank r on its device:
  R  PyTorch's requested peak in OWN (memory_stats requested_bytes.all.peak)
  M  torch.cuda.max_memory_allocated() in OWN
  X  torch.cuda.max_memory_reserved() in OBS
  D  the driver's peak device memory of the process in OBS: the report's peak reserved bytes,
     which in passthrough mode is every device allocation the driver made (cudaMalloc,
     cuMemCreate, ...), PyTorch's segments and the libraries' own memory alike
  L  = D - X, the memory libraries take from the driver outside PyTorch's allocator (cuBLAS
     workspaces, NCCL's cuMemCreate buffers): PyTorch's cache does not give memory back here and
     the libraries hold theirs from their start-up on, so the driver's peak is PyTorch's reserved
     peak plus L
  P  the shim's peak requested bytes in TRACED (PyTorch's cache off: every PyTorch allocation
     reaches the driver at its requested size, and the libraries' memory as before)
  C  the libc10_cuda entry of TRACED's peak_requested_bytes_by_library (`vramscope run --stacks`):
     the peak of what PyTorch's allocator itself asked cudaMalloc for (tests/gpu/by_library.py)

`observe` prints per rank, tab-separated: rank, verdict, D, X, L, text.
`compare` prints per rank, tab-separated: rank, exact verdict, R + L, P, text, then the literal
verdict, M, text, then the library verdict, C, text; and per rank a line "rank N by library: ..."
with every library's peak. Exact: P against R + L, "ok" within 1%. Literal: P against M, "ok"
within 1%; a larger gap is reported ("differs"), not failed, when the exact comparison is within
1%: M leaves out L and counts PyTorch's rounded, unsplit blocks (M - R) instead of requested
sizes. Library: C against M, "ok" within 1%, else "FAIL" (the libraries' memory is in other
entries, so C is what M counts). Verdicts start with "ok", "differs" or "FAIL"; no field is empty.
"""
import json
import re
import sys

import by_library  # tests/gpu/by_library.py, beside this file


def rank_lines(path):
    """{rank: JSON object} of the rank lines in PATH (empty when unreadable)."""
    out = {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = re.search(r'\{"rank".*\}', line)
                if not m:
                    continue
                try:
                    j = json.loads(m.group(0))
                    out[int(j["rank"])] = j
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return out


def num(obj, key):
    try:
        return int(obj.get(key, 0))
    except (TypeError, ValueError):
        return 0


def ordinal(dev):
    return num(dev.get("device", {}), "ordinal")


def rank_section(reports, line, rank, field):
    """(report, its device section, how matched) of the rank that printed LINE; None if none."""
    pid = line.get("pid")
    want = num(line, "device") if "device" in line else rank
    by_pid = {num(r.get("process", {}), "pid"): r for r in reports}
    rep, how = by_pid.get(pid) if pid is not None else None, f"pid {pid}"
    if rep is None:  # the process whose largest device peak is on the rank's device
        how, best = f"device {want}", 0
        for cand in reports:
            for d in cand.get("devices", []):
                if ordinal(d) == want and num(d, field) > best:
                    best, rep = num(d, field), cand
    devs = (rep or {}).get("devices", [])
    for d in devs:
        if ordinal(d) == want:
            return rep, d, how
    if devs:  # not on the rank's device: its largest section, named
        d = max(devs, key=lambda d: num(d, field))
        return rep, d, f"{how}, device {ordinal(d)}"
    return rep, None, how


def apart(a, b):
    return abs(a - b) / b


def mb(b):
    return f"{b / 1e6:.1f} MB"


def observe(obs_path, obs_report):
    """{rank: (verdict, D, X, L, text)} from the passthrough run of PyTorch's own allocator."""
    obs = rank_lines(obs_path)
    reports, why = by_library.load_reports(obs_report)
    out = {}
    for r in (0, 1):
        line = obs.get(r, {})
        x = num(line, "max_memory_reserved")
        if x <= 0:
            out[r] = ("FAIL", 0, x, 0, "no rank line with max_memory_reserved")
            continue
        if reports is None:
            out[r] = ("FAIL", 0, x, 0, why)
            continue
        rep, sec, how = rank_section(reports, line, r, "peak_reserved_bytes")
        if sec is None:
            out[r] = ("FAIL", 0, x, 0, f"no report section (by {how})")
            continue
        mode = rep.get("mode", "") or "?"
        d = num(sec, "peak_reserved_bytes")
        kinds = ",".join(f"{k}={v}" for k, v in sorted(sec.get("peak_bytes_by_kind", {}).items()))
        text = f"by {how}; kinds {kinds or '-'}"
        if mode != "passthrough":
            out[r] = ("FAIL", d, x, d - x, f"report mode {mode}, not passthrough; {text}")
        elif d < x:
            out[r] = ("FAIL", d, x, d - x, f"driver peak below PyTorch's reserved; {text}")
        else:
            out[r] = ("ok", d, x, d - x, f"libraries {mb(d - x)}; {text}")
    return out


def compare(own_path, obs_path, obs_report, traced_path, traced_report):
    """{rank: ((verdict, R + L, P, text), (verdict, M, text), (verdict, C, text), libraries)}."""
    # OWN_PATH may name several own-cache runs (comma-separated). PyTorch's own run of this step
    # lands in one of two peaks from run to run (measured: 4.24 or 4.74 GB, one fp32 copy of the
    # parameters apart) while the cache-off program always reaches the lower one; each rank is
    # compared with its lowest own-cache run, and every run's figure is printed.
    runs = [rank_lines(p) for p in own_path.split(",") if p]
    traced = rank_lines(traced_path)
    libs = observe(obs_path, obs_report)
    reports, why = by_library.load_reports(traced_report)
    out = {}
    for r in (0, 1):
        samples = [run[r] for run in runs if num(run.get(r, {}), "peak_requested_bytes") > 0]
        chosen = min(samples, key=lambda j: num(j, "peak_requested_bytes"), default={})
        req = num(chosen, "peak_requested_bytes")
        maxm = num(chosen, "max_memory_allocated")
        modes = "/".join(str(num(j, "max_memory_allocated")) for j in samples) or "none"
        lib_verdict, _, _, lib, lib_text = libs[r]
        peak, where, sec = 0, why, None
        if reports is not None:
            _, sec, how = rank_section(reports, traced.get(r, {}), r, "peak_requested_bytes")
            peak = num(sec, "peak_requested_bytes") if sec is not None else 0
            where = f"by {how}" if sec is not None else f"no report section (by {how})"
        missing = []
        if req <= 0:
            missing.append("requested peak (own run)")
        if lib_verdict != "ok":
            missing.append(f"library memory ({lib_text})")
        if peak <= 0:
            missing.append(f"report peak ({where})")
        want = req + lib
        if missing:
            exact = ("FAIL", want, peak, "missing " + "; ".join(missing))
        else:
            e = apart(peak, want)
            exact = ("ok" if e <= 0.01 else "FAIL", want, peak,
                     f"{100 * e:.3f}% apart (requested {mb(req)} + libraries {mb(lib)}); {where}")
        if maxm <= 0 or peak <= 0:
            literal = ("FAIL", maxm, "missing " + ("max_memory_allocated" if maxm <= 0
                                                   else f"report peak ({where})"))
        else:
            e = apart(peak, maxm)
            if e <= 0.01:
                literal = ("ok", maxm, f"{100 * e:.2f}% apart")
            elif exact[0] == "ok":
                literal = ("differs", maxm,
                           f"{100 * e:.2f}%: library memory PyTorch does not count "
                           f"({mb(lib)}; max_alloc-requested {mb(maxm - req)})")
            else:
                literal = ("FAIL", maxm, f"{100 * e:.2f}% apart")
        if sec is None:
            library = ("FAIL", 0, f"missing report section ({where})")
        else:
            v, c, text = by_library.check(sec, maxm)
            library = (v, c, f"{text}; {where}; own-cache runs max_alloc {modes}")
        out[r] = (exact, literal, library,
                  by_library.describe(sec) if sec is not None else "no report section")
    return out


def main(argv):
    if len(argv) == 4 and argv[1] == "observe":
        for r, (v, d, x, lib, text) in sorted(observe(*argv[2:]).items()):
            print("\t".join(str(f) for f in (r, v, d, x, lib, text)))
        return 0
    if len(argv) == 7 and argv[1] == "compare":
        figures = sorted(compare(*argv[2:]).items())
        for r, (exact, literal, library, _) in figures:
            print("\t".join(str(f) for f in (r, *exact, *literal, *library)))
        for r, (*_, libs) in figures:
            print(f"rank {r} by library: {libs}")
        return 0
    print("usage:\n" + __doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
