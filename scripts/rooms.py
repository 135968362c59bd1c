#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""rooms.py: the rooms of src/ (or another folder) and their floors.

A room is a source file with its header (src/lookup.c and src/lookup.h are
the room src/lookup).  Room A stands on room B when a file of A includes a
header of B (the public include/encache.h is nobody's room), or when A's
object file uses a symbol that B's object file defines (nm).  A circle is
a set of rooms that stand on each other (a strongly connected component);
the floors are the rooms of the longest chain of the graph once each
circle is taken as one room.

  scripts/rooms.py BUILD_DIR [--under src/store] [--room FOLDER]...
                   [--check] [--allow REGEX]

prints the circles and the floors of the rooms under the given folder (all
of src/ by default, or tools/, or the Python extension's python/_encache;
edges leaving it are ignored).  --room makes a folder
one room (a backend's files: src/store/shm); --part NAME=REGEX makes the
rooms REGEX matches one (to count the floors of parts: the Store's
backends, the read path).  --check fails (exit 1)
on a circle with a room that REGEX (re.fullmatch, default: none) does not
match: the allowed circle is the tiered Store, which opens Stores through
the scheme table that opens it.
"""
import argparse
import os
import re
import subprocess
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SEARCH = ["src", "src/store", "src/config", "include", "tools/bench",
          "tools/demo"]  # CMake's -I


FOLDERS = []  # --room: folders that are one room each
PARTS = []  # --part NAME=REGEX: rooms that count as one part


def room_of(path):
    room = os.path.splitext(path)[0]
    for f in FOLDERS:
        if path.startswith(f + "/"):
            room = f
    for name, rx in PARTS:
        if re.fullmatch(rx, room):
            return name
    return room


def sources(root, under):
    out = []
    for d, _, files in os.walk(os.path.join(root, under)):
        for f in files:
            if f.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def includes(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        text = f.read()
    for name in INCLUDE.findall(text):
        for base in [os.path.dirname(path)] + SEARCH:
            cand = os.path.normpath(os.path.join(base, name))
            if os.path.exists(os.path.join(root, cand)):
                yield cand
                break


def objects(build):
    """Source path (src/x.c) -> its object file; the library's first."""
    found = {}
    top = os.path.join(build, "CMakeFiles")
    dirs = sorted(os.listdir(top), key=lambda d: d != "encache_objects.dir")
    for t in dirs:
        for d, _, files in os.walk(os.path.join(top, t)):
            for f in files:
                if f.endswith(".c.o"):
                    rel = os.path.relpath(os.path.join(d, f),
                                          os.path.join(top, t))
                    found.setdefault(rel[:-2], os.path.join(d, f))
    return found


def symbols(obj):
    out = subprocess.run(["nm", obj], check=True, capture_output=True,
                         text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
        elif len(parts) == 3 and parts[1] in "TDBRVWC" and parts[1].isupper():
            defined.add(parts[2])
    return defined, used


def graph(root, build, under):
    files = sources(root, under)
    rooms = {room_of(f) for f in files}
    edges = {r: set() for r in rooms}
    for f in files:
        for g in includes(root, f):
            if room_of(g) in rooms and room_of(g) != room_of(f):
                edges[room_of(f)].add(room_of(g))
    objs = {k: v for k, v in objects(build).items() if room_of(k) in rooms}
    if not objs:
        sys.exit("rooms.py: no object files under %s (build first)" % build)
    owner, uses = {}, {}
    for src, obj in objs.items():
        defined, used = symbols(obj)
        for s in defined:
            owner[s] = room_of(src)
        uses.setdefault(room_of(src), set()).update(used)
    for r, used in uses.items():
        for s in used:
            o = owner.get(s)
            if o is not None and o != r:
                edges[r].add(o)
    return edges


def circles(edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out = {}, {}, set(), [], []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.append(x)
                        if x == v:
                            break
                    out.append(sorted(comp))
            elif w not in index:
                index[w] = low[w] = len(index)
                stack.append(w)
                on.add(w)
                work.append((w, iter(sorted(edges[w]))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def floors(edges, comps):
    comp_of = {r: i for i, c in enumerate(comps) for r in c}
    memo = {}

    def floor(i):  # Tarjan emits components bottom first
        if i not in memo:
            below = {comp_of[w] for r in comps[i] for w in edges[r]} - {i}
            memo[i] = 1 + max((floor(j) for j in below), default=0)
        return memo[i]

    for i in range(len(comps)):
        floor(i)
    return {r: memo[comp_of[r]] for r in edges}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build")
    ap.add_argument("--under", default="src")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--allow", default="")
    ap.add_argument("--room", action="append", default=[],
                    help="a folder whose files are one room (a backend)")
    ap.add_argument("--part", action="append", default=[],
                    help="NAME=REGEX: the rooms REGEX matches are one part")
    a = ap.parse_args()
    FOLDERS.extend(r.rstrip("/") for r in a.room)
    for p in a.part:
        name, _, rx = p.partition("=")
        PARTS.append((name, rx))
    root = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
    edges = graph(root, a.build, a.under)
    comps = circles(edges)
    level = floors(edges, comps)
    bad = []
    for c in comps:
        if len(c) > 1:
            print("circle of %d: %s" % (len(c), " ".join(c)))
            if not all(a.allow and re.fullmatch(a.allow, r) for r in c):
                bad.append(c)
    top = max(level.values(), default=0)
    print("%s: %d rooms on %d floors" % (a.under, len(edges), top))
    for f in range(top, 0, -1):
        print("  floor %d: %s" % (f, " ".join(sorted(
            r for r in level if level[r] == f))))
    if a.check and bad:
        print("rooms.py: %d circle(s) not allowed" % len(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
