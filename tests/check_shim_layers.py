#!/usr/bin/env python3
"""Fails when interposer/shim does not read bottom-up (interposer/shim/layers.txt):

  1. a .h/.cc of the folder that layers.txt does not list, lists twice, or lists but is missing;
  2. an upward include: `#include "x"` of a file of the folder in a higher layer than the
     includer's;
  3. a circle: modules (a file's stem, so x.h and x.cc are one module) that include each other,
     directly or through others, even inside one layer.

usage: check_shim_layers.py SOURCE_ROOT [SHIM_DIR]   (SHIM_DIR defaults to interposer/shim)
Exit 0 when the folder is layered, 1 with one line per problem, 2 on bad usage.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_layers(path):
    layers = []  # [(name, [files])]
    for number, line in enumerate(open(path, encoding="utf-8"), 1):
        text = line.split("#", 1)[0].rstrip()
        if not text.strip():
            continue
        if text[0].isspace():
            if not layers:
                raise SystemExit("%s:%d: continuation before any layer" % (path, number))
            layers[-1][1].extend(text.split())
            continue
        name, sep, files = text.partition(":")
        if not sep:
            raise SystemExit("%s:%d: expected `NAME: FILE...`" % (path, number))
        layers.append((name.strip(), files.split()))
    return layers


def find_circle(edges):
    """A list of modules forming a circle (first == last), or None."""
    state = {}  # 1: on the current path, 2: done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    shim = os.path.join(argv[1], argv[2] if len(argv) == 3 else "interposer/shim")
    layers_path = os.path.join(shim, "layers.txt")
    if not os.path.isfile(layers_path):
        print("no %s" % layers_path, file=sys.stderr)
        return 2
    layers = read_layers(layers_path)
    rank = {}
    problems = []
    for index, (name, files) in enumerate(layers):
        for f in files:
            if f in rank:
                problems.append("%s is listed twice in layers.txt" % f)
            rank[f] = (index, name)
    present = sorted(f for f in os.listdir(shim) if f.endswith((".h", ".cc")))
    for f in present:
        if f not in rank:
            problems.append("%s is in no layer of layers.txt" % f)
    for f in sorted(rank):
        if f not in present:
            problems.append("layers.txt lists %s, which does not exist" % f)
    edges = {}
    for f in present:
        text = open(os.path.join(shim, f), encoding="utf-8").read()
        module = os.path.splitext(f)[0]
        for target in INCLUDE.findall(text):
            if "/" in target or target not in present:
                continue  # another folder's header (vramscope/...), not a file of the shim
            if f in rank and target in rank and rank[target][0] > rank[f][0]:
                problems.append("upward include: %s (layer %s) includes %s (layer %s)" %
                                (f, rank[f][1], target, rank[target][1]))
            other = os.path.splitext(target)[0]
            if other != module:
                edges.setdefault(module, set()).add(other)
    circle = find_circle(edges)
    if circle:
        problems.append("circle: " + " -> ".join(circle))
    for p in problems:
        print(p)
    if problems:
        return 1
    print("%d files in %d layers (%s): no upward include, no circle" %
          (len(present), len(layers), " < ".join(name for name, _ in layers)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
