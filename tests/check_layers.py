#!/usr/bin/env python3
"""Fails when the folders of the out-of-process layers depend on each other the wrong way.

The graph is derived from `#include "..."` lines only, so anyone draws it the same:

* A file's folder is its directory, except that a public header anywhere under `X/include/`
  belongs to `X/include` (agent/include/vramscope/agent/outbox.h is agent/include/, a folder
  below agent/ that agent/ and its users include).
* An include resolves as the compiler's quote form does: next to the including file first; else
  the one source file whose path ends in `/NAME` (`drain/ring_reader.h` is lib/drain/, whatever
  include path reaches it). Generated `*.pb.h` headers belong to proto/. An include that resolves
  to no file, or to files of two folders, is an error.
* A verb folder is a folder directly under viewer-cli/ holding a `*_command.cc` (the code of one
  `vramscope VERB`); the other folders there (client/, common/) are shared.

Rules (each edge is folder -> folder it includes):
  1. a verb folder includes no other verb folder;
  2. lib/ includes nothing of agent/, collector/, viewer-cli/;
  3. agent/ includes nothing of collector/ or viewer-cli/; collector/ nothing of agent/ or
     viewer-cli/;
  4. no folder includes a folder above it (its parent or further up): shared code lives beside
     or below, never in the folder that also holds the users;
  5. no circle.

Usage: check_layers.py SOURCE_ROOT [--graph]   (--graph prints every edge, one "A -> B" a line)
       check_layers.py --self-test              (each rule is broken once in a scratch tree)
"""

import os
import re
import sys
import tempfile

SCANNED = ("agent", "collector", "lib", "viewer-cli", "interposer", "proto")
SOURCE_SUFFIXES = (".h", ".hh", ".hpp", ".c", ".cc", ".cpp", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of(path):
    parts = path.split("/")
    if "include" in parts[:-1]:
        return "/".join(parts[: parts.index("include") + 1])
    return "/".join(parts[:-1])


def source_files(root):
    files = []
    for top in SCANNED:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    files.append(os.path.relpath(os.path.join(dirpath, name), root))
    return files


def build_graph(root):
    """Returns ({(from, to): [file:line ...]}, [error ...])."""
    files = source_files(root)
    by_suffix = {}
    for f in files:
        parts = f.split("/")
        for i in range(len(parts)):
            by_suffix.setdefault("/".join(parts[i:]), []).append(f)
    edges, errors = {}, []
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        for match in INCLUDE.finditer(text):
            name = match.group(1)
            line = text.count("\n", 0, match.start()) + 1
            where = f"{f}:{line}"
            if name.endswith(".pb.h"):
                target_folder = "proto"
            else:
                beside = os.path.normpath(os.path.join(os.path.dirname(f), name))
                if beside in files:
                    candidates = [beside]
                else:
                    candidates = by_suffix.get(os.path.normpath(name), [])
                folders = sorted({folder_of(c) for c in candidates})
                if not folders:
                    errors.append(f'{where}: #include "{name}" is no file of {", ".join(SCANNED)}')
                    continue
                if len(folders) > 1:
                    errors.append(f'{where}: #include "{name}" is ambiguous: {", ".join(folders)}')
                    continue
                target_folder = folders[0]
            source_folder = folder_of(f)
            if target_folder != source_folder:
                edges.setdefault((source_folder, target_folder), []).append(where)
    return edges, errors


def verb_folders(root):
    verbs = set()
    cli = os.path.join(root, "viewer-cli")
    for name in sorted(os.listdir(cli)) if os.path.isdir(cli) else []:
        folder = os.path.join(cli, name)
        if os.path.isdir(folder) and any(f.endswith("_command.cc") for f in os.listdir(folder)):
            verbs.add("viewer-cli/" + name)
    return verbs


def under(folder, top):
    return folder == top or folder.startswith(top + "/")


def violations(root, edges):
    verbs = verb_folders(root)
    bad = []
    forbidden = {
        "lib": ("agent", "collector", "viewer-cli"),
        "agent": ("collector", "viewer-cli"),
        "collector": ("agent", "viewer-cli"),
    }
    for (a, b), where in sorted(edges.items()):
        first = where[0]
        if a in verbs and b in verbs:
            bad.append(f"{first}: verb folder {a} includes verb folder {b}")
        for layer, tops in forbidden.items():
            if under(a, layer) and any(under(b, t) for t in tops):
                bad.append(f"{first}: {a} ({layer}/) includes {b}")
        if a.startswith(b + "/"):
            bad.append(f"{first}: {a} includes {b}, a folder above it")
    # Circles: depth-first search over the folder graph, reporting each back edge's circle once.
    graph = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    for targets in graph.values():
        targets.sort()
    state, stack, seen = {}, [], set()

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                circle = stack[stack.index(nxt):] + [nxt]
                key = frozenset(circle)
                if key not in seen:
                    seen.add(key)
                    first = edges[(node, nxt)][0]
                    bad.append(f"{first}: circle {' -> '.join(circle)}")
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return bad


def check(root, show_graph=False, quiet=False):
    edges, errors = build_graph(root)
    if show_graph:
        for a, b in sorted(edges):
            print(f"{a} -> {b}")
    problems = errors + violations(root, edges)
    if not quiet:
        for p in problems:
            print(p, file=sys.stderr)
    return problems


def self_test():
    """Each rule broken once in a scratch tree: the check must name it; the clean tree passes."""
    clean = {
        "lib/log/include/vramscope/log.h": "",
        "lib/drain/ring_reader.h": '#include "vramscope/log.h"\n',
        "agent/include/vramscope/agent/outbox.h": '#include "drain/ring_reader.h"\n',
        "collector/collector.cc": '#include "vramscope/log.h"\n#include "vramscope/v1/x.pb.h"\n',
        "viewer-cli/main.cc": '#include "run/run_command.h"\n#include "top/top_command.h"\n',
        "viewer-cli/common/size.h": "",
        "viewer-cli/run/run_command.h": '#include "common/size.h"\n',
        "viewer-cli/run/run_command.cc": '#include "vramscope/agent/outbox.h"\n',
        "viewer-cli/top/top_command.h": "",
        "viewer-cli/top/top_command.cc": '#include "common/size.h"\n',
    }
    broken = {
        "verb folder viewer-cli/top includes verb folder viewer-cli/run":
            ("viewer-cli/top/top_command.cc", '#include "run/run_command.h"\n'),
        "lib/drain (lib/) includes agent":
            ("lib/drain/ring_reader.cc", '#include "vramscope/agent/outbox.h"\n'),
        "agent (agent/) includes collector":
            ("agent/agent.cc", '#include "collector.cc"\n'),
        "collector (collector/) includes viewer-cli/common":
            ("collector/x.cc", '#include "common/size.h"\n'),
        "viewer-cli/common includes viewer-cli, a folder above it":
            ("viewer-cli/common/size.cc", '#include "main.cc"\n'),
        "circle":
            ("lib/log/include/vramscope/log.h", '#include "drain/ring_reader.h"\n'),
        "ambiguous":
            ("lib/log/x.cc", '#include "size.h"\n#include "viewer-cli/size.h"\n'),
        "is no file":
            ("lib/log/y.cc", '#include "nowhere/missing.h"\n'),
    }
    failures = 0

    def make(tree, files):
        for path, text in files.items():
            full = os.path.join(tree, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as handle:
                handle.write(text)

    with tempfile.TemporaryDirectory() as tree:
        make(tree, clean)
        problems = check(tree)
        print(f"clean tree: {len(problems)} problems (expected 0)")
        failures += bool(problems)
    for expected, (path, text) in broken.items():
        with tempfile.TemporaryDirectory() as tree:
            files = dict(clean)
            files[path] = text
            if expected == "ambiguous":
                files["viewer-cli/size.h"] = ""
                files["lib/size.h"] = ""
            make(tree, files)
            problems = check(tree, quiet=True)
            hit = any(expected in p for p in problems)
            print(f"{path} breaking '{expected}': {'caught' if hit else 'MISSED'}")
            failures += not hit
    print("self-test", "FAILED" if failures else "passed")
    return 1 if failures else 0


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        return self_test()
    if len(argv) not in (2, 3) or (len(argv) == 3 and argv[2] != "--graph"):
        print(__doc__, file=sys.stderr)
        return 2
    problems = check(argv[1], show_graph=len(argv) == 3)
    if problems:
        print(f"check_layers: {len(problems)} problems (rules: tests/check_layers.py)",
              file=sys.stderr)
        return 1
    print("check_layers: layering holds")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
