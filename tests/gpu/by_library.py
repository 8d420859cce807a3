"""Peak requested bytes by calling library in a `vramscope run --stacks --json` report.

    by_library.py REPORT MAX_MEMORY_ALLOCATED [DEVICE]

REPORT is the report of a PyTorch run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 under
`vramscope run --stacks`; MAX_MEMORY_ALLOCATED is torch.cuda.max_memory_allocated() of the same
workload with PyTorch's own allocator. Prints every library of DEVICE's section (default 0; of
the process with the largest peak requested there), largest first, then one tab-separated line:
"result", verdict, the libc10_cuda entry (the key that starts with "libc10_cuda": PyTorch's
allocator calling cudaMalloc), text. Verdict "ok" when that entry is within 1% of
MAX_MEMORY_ALLOCATED, else "FAIL" (also when the report, the section or the entry is missing).
tests/gpu/run_all.sh and tests/gpu/ddp_ranks.py use it.
"""
import json
import sys

TORCH_ALLOCATOR = "libc10_cuda"


def num(value):
    """A proto JSON uint64 (a string) or a number as int; 0 when neither."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def libraries(section):
    """[(library, peak bytes)] of a DeviceReport section, largest first."""
    by_lib = (section or {}).get("peak_requested_bytes_by_library", {})
    if not isinstance(by_lib, dict):
        return []
    return sorted(((k, num(v)) for k, v in by_lib.items()), key=lambda kv: (-kv[1], kv[0]))


def library_peak(section, prefix=TORCH_ALLOCATOR):
    """(key, bytes) of the largest entry whose key starts with PREFIX; (None, 0) if none."""
    found = [(k, v) for k, v in libraries(section) if k.startswith(prefix)]
    return found[0] if found else (None, 0)


def describe(section):
    """One line: every library's peak, largest first, and the bytes without a site."""
    parts = [f"{k}={v}" for k, v in libraries(section)]
    unattributed = num((section or {}).get("unattributed_peak_requested_bytes", 0))
    parts.append(f"(no site)={unattributed}")
    return ", ".join(parts)


def check(section, max_allocated):
    """(verdict, libc10 bytes, text): the libc10_cuda entry against MAX_ALLOCATED, 1%."""
    key, peak = library_peak(section)
    if max_allocated <= 0:
        return "FAIL", peak, "missing max_memory_allocated"
    if key is None or peak <= 0:
        have = ", ".join(k for k, _ in libraries(section)) or "no map: --stacks?"
        return "FAIL", 0, f"no {TORCH_ALLOCATOR}* entry ({have})"
    e = abs(peak - max_allocated) / max_allocated
    return ("ok" if e <= 0.01 else "FAIL"), peak, f"{key} {100 * e:.2f}% apart"


def load_reports(path):
    """(list of Report objects of a `vramscope run --json` file, None) or (None, why)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return None, f"no report {path.rsplit('/', 1)[-1]} ({e.__class__.__name__})"
    if not isinstance(doc, dict):
        return None, "report is not a JSON object"
    return doc.get("reports", [doc]), None


def device_section(path, device):
    """(DeviceReport section of DEVICE with the largest peak requested, None) or (None, why)."""
    reports, why = load_reports(path)
    if reports is None:
        return None, why
    best = None
    for report in reports:
        for d in report.get("devices", []):
            if num(d.get("device", {}).get("ordinal", 0)) != device:
                continue
            if best is None or num(d.get("peak_requested_bytes")) > num(
                    best.get("peak_requested_bytes")):
                best = d
    return (best, None) if best is not None else (None, f"no section for device {device}")


def main(argv):
    if len(argv) not in (3, 4):
        print("usage:\n" + __doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    device = int(argv[3]) if len(argv) == 4 else 0
    section, why = device_section(argv[1], device)
    if section is None:
        print("\t".join(("result", "FAIL", "0", why)))
        return 0
    for k, v in libraries(section):
        print(f"  {v:>14} B  {k}")
    print(f"  {num(section.get('unattributed_peak_requested_bytes', 0)):>14} B  (no site)")
    verdict, peak, text = check(section, num(argv[2]))
    print("\t".join(("result", verdict, str(peak), text)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
