#!/usr/bin/env python3
"""Generates the shim's stream watch hooks from the toolkit's <cuda.h>.

Ordered reuse (ordered.h) is only sound while every piece of GPU work the process queues goes to
the legacy default stream of one context. The shim proves that by watching every driver entry
point that queues work on a stream: this script lists them from <cuda.h> itself, preprocessed
twice (legacy names, then with CUDA_API_PER_THREAD_DEFAULT_STREAM for the _ptsz and _ptds
names), so a new toolkit's additions show up as a diff, not as a silent gap. It also lists every
entry point name <cuda.h> declares, and the graphics-interop and profiler headers (cudaGL.h,
cudaEGL.h, cudaVDPAU.h, cudaProfiler.h: the runtime looks those up at start; they work on
graphics resources, never on memory the pool hands out): a program that looks up a name beyond
them (a newer driver's) ends ordered reuse, since the shim cannot know whether it queues work.

Writes stream_hooks_gen.h (declarations cuda.h hides, the X-list of watched entry points and
IsKnownDriverEntryPoint's declaration), hooks_streams_gen.cc (one wrapper per entry point: watch,
then call the driver) and known_entry_points_gen.cc (the known names, at the bottom of the shim's
layers beside the driver table that asks them).

  gen_stream_hooks.py [--cuda-include DIR] [--cpp CPP] [--out DIR]   regenerate
  gen_stream_hooks.py --check [...]                                   exit 1 if the files differ
  gen_stream_hooks.py --check --runtime LIB... [...]                  also exit 1 if a cu* name
                                                      in LIB (the CUDA runtime) is not known
"""
import argparse
import os
import re
import subprocess
import sys

# Entry points with a stream argument that queue no work (queries, synchronisation, stream
# bookkeeping, capture ends): a stream only matters once work goes to it.
NOT_WORK = {
    "cuStreamGetPriority", "cuStreamGetDevice", "cuStreamGetFlags", "cuStreamGetId",
    "cuStreamGetCtx", "cuStreamGetCtx_v2", "cuStreamIsCapturing", "cuStreamGetCaptureInfo_v3",
    "cuStreamQuery", "cuStreamSynchronize", "cuStreamDestroy_v2", "cuStreamGetAttribute",
    "cuStreamSetAttribute", "cuStreamCopyAttributes", "cuStreamGetGreenCtx",
    "cuStreamUpdateCaptureDependencies_v2", "cuStreamEndCapture",
}
# Hooked by hand elsewhere (hooks_passthrough.cc, hooks_context.cc, hooks_graph.cc), which call
# WatchStream themselves.
HOOKED_ELSEWHERE = {
    "cuMemAllocAsync", "cuMemFreeAsync", "cuMemAllocFromPoolAsync", "cuStreamBeginCapture_v2",
    "cuStreamBeginCaptureToGraph", "cuGraphUpload", "cuGraphLaunch",
    "cuGraphInstantiateWithParams",
}
# Work with no stream argument that goes to the legacy stream (or, as _ptds, to the per-thread
# one): the synchronous copies and memsets, and the pre-4.0 launches.
LEGACY_NO_STREAM_EXTRA = {"cuLaunch", "cuLaunchGrid"}

# Driver entry points declared outside <cuda.h>.
INTEROP_HEADERS = ["cudaGL.h", "cudaEGL.h", "cudaVDPAU.h", "cudaProfiler.h"]

DECL = re.compile(r"\bCUresult\s+(cu\w+)\s*\(([^;{}]*?)\)\s*;", re.S)
STREAM_PARAM = re.compile(r"^(const\s+)?CUstream\s+(\w+)$")


def preprocess(cpp, include, per_thread, internal=False):
    cmd = [cpp, "-P", "-x", "c", "-I" + include]
    if per_thread:
        cmd.append("-DCUDA_API_PER_THREAD_DEFAULT_STREAM")
    if internal:
        cmd.append("-D__CUDA_API_VERSION_INTERNAL")  # the older ABIs' declarations
    cmd.append(os.path.join(include, "cuda.h"))
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def declarations(text):
    out = {}
    for match in DECL.finditer(text):
        params = [" ".join(p.split()) for p in " ".join(match.group(2).split()).split(",")]
        if params == ["void"]:
            params = []
        out[match.group(1)] = params
    return out


def arg_name(param):
    m = re.search(r"(\w+)\s*(\[\s*\w*\s*\])?$", param)
    if not m:
        raise SystemExit("cannot name parameter: " + param)
    return m.group(1)


def base_of(name):
    return re.sub(r"_(ptsz|ptds)$", "", name)


def collect(legacy, per_thread):
    hooks = []  # (name, params, stream expression or None, per_thread flavour)
    for name, params in sorted(legacy.items()):
        streams = [STREAM_PARAM.match(p) for p in params]
        streams = [m.group(2) for m in streams if m]
        if name == "cuLaunchKernelEx":
            hooks.append((name, params, "config != nullptr ? config->hStream : nullptr", False))
        elif streams:
            if name in NOT_WORK or name in HOOKED_ELSEWHERE:
                continue
            hooks.append((name, params, streams[0], False))
    # Legacy synchronous copies and sets: the legacy counterparts of the _ptds names.
    for name, params in sorted(per_thread.items()):
        if name.endswith("_ptds") and base_of(name) in legacy:
            hooks.append((base_of(name), legacy[base_of(name)], None, False))
    for name in sorted(LEGACY_NO_STREAM_EXTRA):
        if name in legacy:
            hooks.append((name, legacy[name], None, False))
    for name, params in sorted(per_thread.items()):
        if not (name.endswith("_ptsz") or name.endswith("_ptds")):
            continue
        base = base_of(name)
        if base in NOT_WORK or base in HOOKED_ELSEWHERE:
            continue
        streams = [STREAM_PARAM.match(p) for p in params]
        streams = [m.group(2) for m in streams if m]
        if base == "cuLaunchKernelEx":
            expr = "config != nullptr ? config->hStream : nullptr"
        else:
            expr = streams[0] if streams else None
        hooks.append((name, params, expr, True))
    names = [h[0] for h in hooks]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise SystemExit("entry points listed twice: " + ", ".join(sorted(dup)))
    return hooks


HEADER_TOP = """\
// clang-format off
// GENERATED by gen_stream_hooks.py from <cuda.h> ({version}): do not edit.
//
// The driver entry points that queue work on a stream, which the shim watches for
// ordered reuse (ordered.h): declarations <cuda.h> hides (the _ptsz / _ptds names) and the
// X-list of every watched exact name.
#pragma once

#include <cuda.h>

extern "C" {{
"""


def known_names(declared, header):
    """Every declared name (the old ABIs' too), its base, and every cu* macro of the header
    (cuGraphInstantiate names cuGraphInstantiateWithFlags, for one)."""
    names = set()
    for name in declared:
        names.add(name)
        names.add(re.sub(r"_v\d+$", "", base_of(name)))
    names.update(re.findall(r"^\s*#\s*define\s+(cu[A-Z]\w*)\b", header, re.M))
    return sorted(names)


def render(hooks, legacy, version, known):
    h = [HEADER_TOP.format(version=version)]
    for name, params, _, _ in hooks:
        if name in legacy:
            continue
        h.append("CUresult CUDAAPI %s(%s);\n" % (name, ", ".join(params)))
    h.append("}\n\n// X(exact_name)\n#define VRAMSCOPE_WATCHED_ENTRY_POINTS(X) \\\n")
    h.append("".join("  X(%s) \\\n" % hook[0] for hook in hooks))
    h.append("\n")
    h.append(KNOWN_DECLARATION)
    c = ["""\
// clang-format off
// GENERATED by gen_stream_hooks.py from <cuda.h> (%s): do not edit.
//
// One wrapper per entry point that queues work on a stream: it tells ordered reuse (ordered.h)
// which stream the work goes to, calls the driver, then notes the stream for the event fences
// (stream_fence.h).
#include "hooks.h"
#include "ordered.h"
#include "stream_fence.h"
#include "stream_hooks_gen.h"

// The pre-4.0 launches (cuLaunch, cuLaunchGrid, cuLaunchGridAsync) are deprecated, still exported.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

using namespace vramscope::interposer;
""" % version]
    for name, params, expr, per_thread in hooks:
        args = ", ".join(arg_name(p) for p in params)
        c.append("\nVRAMSCOPE_EXPORT CUresult CUDAAPI %s(%s) {\n" % (name, ", ".join(params)))
        c.append("  VRAMSCOPE_PROLOGUE(%s);\n" % name)
        c.append("  WatchStream(%s, %s, \"%s\");\n" %
                 (expr if expr else "nullptr", "true" if per_thread else "false", name))
        c.append("  const StreamWorkNote note(%s, %s);\n" %
                 (expr if expr else "nullptr", "true" if per_thread else "false"))
        c.append("  return real.%s(%s);\n}\n" % (name, args))
    k = [KNOWN_TOP % version]
    k.append("".join('    "%s",\n' % n for n in known))
    k.append(KNOWN_BOTTOM)
    return "".join(h), "".join(c), "".join(k)


KNOWN_DECLARATION = """\
namespace vramscope::interposer {

// True if <cuda.h> (or the interop and profiler headers) declares `name`, exactly or as the base
// of an ABI variant (known_entry_points_gen.cc). The driver table (driver.cc) asks it of every
// looked-up name: an unknown one may queue work the shim does not watch.
bool IsKnownDriverEntryPoint(const char* name);

}  // namespace vramscope::interposer
"""

KNOWN_TOP = """\
// clang-format off
// GENERATED by gen_stream_hooks.py from <cuda.h> (%s): do not edit.
//
// The names <cuda.h> declares, for IsKnownDriverEntryPoint (stream_hooks_gen.h). It sits beside
// the driver table, at the bottom of the shim, and includes nothing above it.
#include <cstddef>
#include <cstring>

#include "stream_hooks_gen.h"

namespace vramscope::interposer {
namespace {

// Every entry point name <cuda.h> and the interop and profiler headers declare, exact and base
// (no _vN, _ptsz, _ptds), and their macros; sorted.
constexpr const char* kKnown[] = {
"""
KNOWN_BOTTOM = """};

bool Listed(const char* name) {
  std::size_t lo = 0;
  std::size_t hi = sizeof(kKnown) / sizeof(kKnown[0]);
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    const int order = std::strcmp(kKnown[mid], name);
    if (order == 0) return true;
    if (order < 0) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return false;
}

}  // namespace

// The name as given, else its base (without _ptsz / _ptds, then without _vN).
bool IsKnownDriverEntryPoint(const char* name) {
  if (Listed(name)) return true;
  char base[128];
  std::size_t n = std::strlen(name);
  if (n >= sizeof(base)) return false;
  std::memcpy(base, name, n + 1);
  if (n > 5 && (std::strcmp(base + n - 5, "_ptsz") == 0 || std::strcmp(base + n - 5, "_ptds") == 0)) {
    n -= 5;
    base[n] = '\\0';
  }
  std::size_t digits = 0;
  while (digits < n && base[n - 1 - digits] >= '0' && base[n - 1 - digits] <= '9') ++digits;
  if (digits != 0 && n > digits + 2 && base[n - 1 - digits] == 'v' && base[n - 2 - digits] == '_') {
    base[n - 2 - digits] = '\\0';
  }
  return Listed(base);
}

}  // namespace vramscope::interposer
"""


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuda-include", default="/usr/local/cuda/include")
    parser.add_argument("--cpp", default="cpp")
    parser.add_argument("--out", default=here)
    parser.add_argument("--check", action="store_true",
                        help="compare with the files in --out; exit 1 if they differ")
    parser.add_argument("--runtime", nargs="*", default=[],
                        help="with --check: libraries (the CUDA runtime) whose cu* names must all "
                        "be known, so that its lookups never end ordered reuse")
    args = parser.parse_args()
    legacy = declarations(preprocess(args.cpp, args.cuda_include, False))
    per_thread = declarations(preprocess(args.cpp, args.cuda_include, True))
    version = "CUDA_VERSION unknown"
    m = re.search(r"#define CUDA_VERSION (\d+)",
                  open(os.path.join(args.cuda_include, "cuda.h")).read())
    if m:
        version = "CUDA_VERSION " + m.group(1)
    internal = declarations(preprocess(args.cpp, args.cuda_include, False, internal=True))
    raw = open(os.path.join(args.cuda_include, "cuda.h")).read()
    interop = []
    for name in INTEROP_HEADERS:
        path = os.path.join(args.cuda_include, name)
        if os.path.exists(path):
            text = open(path).read()
            raw += text
            interop += re.findall(r"\b(cu[A-Z]\w*)\s*\(", text)
    header, source, known_source = render(collect(legacy, per_thread), legacy, version,
                            known_names(list(legacy) + list(per_thread) + list(internal) + interop,
                                        raw))
    files = {"stream_hooks_gen.h": header, "hooks_streams_gen.cc": source,
             "known_entry_points_gen.cc": known_source}
    if args.check:
        known = set(re.findall(r'^    "(cu\w+)",$', known_source, re.M))
        for lib in args.runtime:
            if not os.path.exists(lib):
                continue
            data = open(lib, "rb").read()
            names = set(m.decode() for m in re.findall(rb"(?<![\w])cu[A-Z]\w+(?=\x00)", data))
            unknown = sorted(n for n in names
                             if n not in known and
                             re.sub(r"_v\d+$", "", base_of(n)) not in known)
            if unknown:
                print("%s looks up entry points the shim does not know (they would end ordered "
                      "reuse): %s" % (lib, ", ".join(unknown)))
                return 1
            print("%s: all %d cu* names known" % (lib, len(names)))
        stale = []
        for name, text in files.items():
            path = os.path.join(args.out, name)
            if not os.path.exists(path) or open(path).read() != text:
                stale.append(path)
        if stale:
            print("out of date with %s: %s (run %s)" %
                  (os.path.join(args.cuda_include, "cuda.h"), ", ".join(stale), sys.argv[0]))
            return 1
        print("%d watched entry points, up to date with %s" %
              (source.count("VRAMSCOPE_PROLOGUE"), version))
        return 0
    for name, text in files.items():
        with open(os.path.join(args.out, name), "w") as f:
            f.write(text)
    print("wrote %d watched entry points (%s)" % (source.count("VRAMSCOPE_PROLOGUE"), version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
