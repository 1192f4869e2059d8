#!/usr/bin/env python3
"""layers.py — checks that the tree keeps its architecture (the layer maps in
coordinator/coord.h and worker/worker.h, and the rooms below).

Two checks, each a ctest:
  layers.py src ROOT
      Reads the maps from the headers and every `#include "..."` of the project's C/CUDA
      sources, and fails on
      (0) a module of coordinator/ or worker/ missing from its folder's map, or a map entry
          that names no file,
      (1) an include from a lower room into a higher one (the room table of docs/design.md §7), or from a
          lower layer of a daemon's map into a higher one, and
      (2) an include cycle between modules (x.c, x.h and x.cu are one module), which is how two
          files that call each other show up once every module declares its functions in its
          own header.
  layers.py calls NAME=OBJ,OBJ,... [NAME=...]
      Reads the symbols each object file of a target defines and uses (nm) and fails when two
      modules of one target call each other, directly or around a longer circle: calls must go
      one way (a lower module that must reach up takes a callback).
  layers.py self-test
      Proves both checks fail on a planted upward include, an include circle, a call circle and
      a module missing from its map.
"""
import os
import re
import subprocess
import sys
import tempfile

# The two daemons' maps live in their folders' headers, nowhere else: comment lines
# "core: a b store*" (coordinator/ only: the core library dpc_coord, which coordinator.cmake
# builds from the same line) and "layer N: a b" list every module of the folder (x.c with its
# x.h; a trailing * is a glob). Inside a folder a module may include modules of its own layer
# or lower ones, never a higher one; a new file must be given its layer there.
MAP_HEADERS = {"coordinator": "coordinator/coord.h", "worker": "worker/worker.h"}
MAP_LINE = re.compile(r"^ \*   (core|layer (\d+)): ((?:[A-Za-z_][A-Za-z0-9_]*\*? ?)+)$")


def read_map(root, folder):
    """[(name pattern, layer)] from the folder's map header, layer None for the core library."""
    path = os.path.join(root, MAP_HEADERS[folder])
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = MAP_LINE.match(line.rstrip("\n"))
            if m:
                layer = None if m.group(1) == "core" else int(m.group(2))
                out += [(name, layer) for name in m.group(3).split()]
    if not out:
        raise SystemExit(f"layers: {MAP_HEADERS[folder]} has no ' *   layer N: ...' map lines")
    return out


def name_rx(name):
    return re.escape(name.rstrip("*")) + ("[^/]*" if name.endswith("*") else "")


# The rooms and what each may include live once, in the table of docs/design.md §7: one row per
# room, first match wins, "| `room` | `path/` ... | `room`, `room` |"; the coordinator's core
# library is the row whose files cell names the "core:" line of coordinator/coord.h's map.
DESIGN = "docs/design.md"
ROOM_ROW = re.compile(r"^\|\s*`([a-z-]+)`\s*\|([^|]*)\|([^|]*)\|\s*$")


def read_rooms(root):
    """[(room, path prefix, or None for the core library)] in table order, and
    {room: rooms it may include}, from docs/design.md §7."""
    rooms, may, in_layout = [], {}, False
    with open(os.path.join(root, DESIGN), encoding="utf-8") as f:
        for line in f:
            if line.startswith("## "):
                in_layout = line.startswith("## 7.")
            m = ROOM_ROW.match(line.strip()) if in_layout else None
            if not m:
                continue
            name, files, allowed = m.group(1), m.group(2), m.group(3)
            paths = re.findall(r"`([^`]+)`", files)
            rooms.append((name, None if "core:" in files else (paths[0] if paths else "")))
            may[name] = set(re.findall(r"`([a-z-]+)`", allowed))
    if not rooms:
        raise SystemExit(f"layers: {DESIGN} §7 has no room table (rows '| `room` | `path/` | `room`, ... |')")
    for name, allowed in may.items():
        unknown = allowed - set(may)
        if unknown:
            raise SystemExit(f"layers: {DESIGN} §7: room '{name}' may include unknown room(s) {sorted(unknown)}")
    return rooms, may


def rooms_and_layers(root):
    """Rooms (first match wins: (name, path regex relative to the root)) from docs/design.md §7,
    each room's allowed includes, and each daemon folder's {module: layer} from the map headers."""
    maps = {folder: read_map(root, folder) for folder in MAP_HEADERS}
    core = "|".join(name_rx(n) for n, layer in maps["coordinator"] if layer is None)
    table, may = read_rooms(root)
    rooms = []
    for name, prefix in table:
        if prefix is None:
            rooms.append((name, rf"^coordinator/({core})\.[ch]$" if core else r"^$"))
        else:
            rooms.append((name, "^" + re.escape(prefix)))
    layers = {folder: {n: layer for n, layer in m if layer is not None} for folder, m in maps.items()}
    return rooms, may, layers, maps


SOURCE_DIRS = ["common", "kernels", "worker", "coordinator", "proto"]
EXTS = (".c", ".h", ".cu", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(rel, rooms):
    for name, rx in rooms:
        if re.search(rx, rel):
            return name
    return None


def module_of(rel):
    """x.c, x.h and x.cu are one module; x_internal.h is x's private header, part of x too."""
    base = os.path.splitext(rel)[0]
    return base[: -len("_internal")] if base.endswith("_internal") else base


def sources(root):
    out = []
    for d in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for f in files:
                if f.endswith(EXTS):
                    out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def cycles(graph):
    """Strongly connected components with more than one node (Tarjan), each as a sorted list."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def witness(graph, comp, why):
    """One edge per member of a cycle, to show the reader where to cut."""
    lines = []
    members = set(comp)
    for a in comp:
        for b in sorted(graph.get(a, ())):
            if b in members:
                lines.append(f"    {a} -> {b}{why(a, b)}")
    return "\n".join(lines)


def sublayer_problems(layers, room, rel, line, inc):
    a, b = os.path.basename(module_of(rel)), os.path.basename(module_of(inc))
    for name, path in ((a, rel), (b, inc)):
        if name not in layers:
            return [f"{path}: module '{name}' has no layer in the map of {MAP_HEADERS[room]} (add it to a "
                    f"' *   layer N:' line)"]
    if layers[b] > layers[a]:
        return [f"{rel}:{line}: upward include inside {room}/: '{a}' (layer {layers[a]}) includes "
                f"\"{inc}\" (layer {layers[b]})"]
    return []


def map_problems(root, files, maps):
    """Every module directly in a mapped folder is on its map, and every map entry names a file."""
    errors = []
    for folder, entries in maps.items():
        mods = sorted({os.path.basename(module_of(f)) for f in files if os.path.dirname(f) == folder})
        rxs = [(n, re.compile(name_rx(n) + "$")) for n, _ in entries]
        for m in mods:
            if not any(rx.match(m) for _, rx in rxs):
                errors.append(f"{folder}/{m}: module not on the map in {MAP_HEADERS[folder]} (add it to a "
                              f"' *   layer N:' line{' or the core line' if folder == 'coordinator' else ''})")
        for n, rx in rxs:
            if not any(rx.match(m) for m in mods):
                errors.append(f"{MAP_HEADERS[folder]}: map names '{n}', which is no module of {folder}/")
    return errors


def check_src(root):
    rooms, may_include, layers, maps = rooms_and_layers(root)
    files = sources(root)
    errors = map_problems(root, files, maps)
    graph, edges = {}, {}
    for rel in files:
        room = room_of(rel, rooms)
        if room is None:
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
        for m in INCLUDE_RE.finditer(text):
            inc = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            if inc.startswith("proto/") and inc.endswith(".pb-c.h"):
                target_room = "proto"  # generated into the build tree
            elif os.path.exists(os.path.join(root, inc)):
                target_room = room_of(inc, rooms)
            else:
                errors.append(f"{rel}:{line}: includes \"{inc}\", which is not a path from the root")
                continue
            if target_room is None:
                continue
            if target_room != room and target_room not in may_include[room]:
                errors.append(f"{rel}:{line}: upward include: room '{room}' includes \"{inc}\" of room "
                              f"'{target_room}' (allowed: {', '.join(sorted(may_include[room])) or 'nothing'})")
            elif target_room == room and room in layers:
                errors.extend(sublayer_problems(layers[room], room, rel, line, inc))
            a, b = module_of(rel), module_of(inc)
            if a != b:
                graph.setdefault(a, set()).add(b)
                edges.setdefault((a, b), f"{rel}:{line}")
    for comp in cycles(graph):
        errors.append("include cycle between modules " + ", ".join(comp) + ":\n" +
                      witness(graph, comp, lambda a, b: f"  ({edges[(a, b)]})"))
    return errors, len(files)


def nm_symbols(obj):
    if not os.path.exists(obj):
        raise SystemExit(f"layers: object file {obj} is missing: build every target first")
    out = subprocess.run(["nm", "-P", obj], check=True, capture_output=True, text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            used.add(name)
        elif kind in "TDBRVWGS":  # global definitions (lower case = file-local)
            defined.add(name)
    return defined, used


def check_calls(targets):
    errors = []
    n = 0
    for name, objs in targets:
        owner, uses, mod = {}, {}, {}
        for o in objs:
            m = re.sub(r"\.(c|cu|cpp)\.o(bj)?$", "", os.path.basename(o))
            mod[o] = m
            d, u = nm_symbols(o)
            uses[m] = uses.get(m, set()) | u
            for s in d:
                owner[s] = m
            n += 1
        graph, via = {}, {}
        for m, u in uses.items():
            for s in sorted(u):
                t = owner.get(s)
                if t and t != m:
                    graph.setdefault(m, set()).add(t)
                    via.setdefault((m, t), s)
        for comp in cycles(graph):
            errors.append(f"{name}: modules call each other in a circle: " + ", ".join(comp) + ":\n" +
                          witness(graph, comp, lambda a, b: f"  (calls {via[(a, b)]})"))
    return errors, n


def parse_targets(args):
    out = []
    for a in args:
        name, _, objs = a.partition("=")
        out.append((name, [o for o in re.split(r"[,;]", objs) if o]))
    return out


def self_test():
    """Plant each kind of violation in a scratch tree and require the checks to find it."""
    failures = 0
    with tempfile.TemporaryDirectory() as t:
        def write(rel, text):
            p = os.path.join(t, rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        write("coordinator/coord.h", "/* map\n *   core: jobspec\n *   layer 0: coord x y\n"
                                     " *   layer 1: loop\n *   layer 3: rounds\n */\n")
        for m in ("jobspec", "y", "loop", "rounds"):  # every module the map names
            write(f"coordinator/{m}.h", "#pragma once\n")
        write("worker/worker.h", "/* map\n *   layer 0: worker\n */\n")
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", DESIGN),
                  encoding="utf-8") as f:
            write(DESIGN, f.read())  # the real room table
        write("common/a.h", "#pragma once\n")
        write("kernels/k.h", '#include "common/a.h"\n')
        write("coordinator/x.h", '#include "kernels/k.h"\n')
        errs, _ = check_src(t)
        if errs:
            print("self-test: a clean tree was refused:", *errs, sep="\n")
            failures += 1
        write("common/a.c", '#include "common/a.h"\n#include "kernels/k.h"\n')
        errs, _ = check_src(t)
        if not any("upward include" in e and "common/a.c:2" in e for e in errs):
            print("self-test: common/ including kernels/ was not caught:", errs)
            failures += 1
        os.remove(os.path.join(t, "common/a.c"))
        write("coordinator/y.h", '#include "coordinator/x.h"\n')
        write("coordinator/x.c", '#include "coordinator/y.h"\n')
        errs, _ = check_src(t)
        if not any("include cycle" in e and "coordinator/x" in e and "coordinator/y" in e for e in errs):
            print("self-test: the include circle x <-> y was not caught:", errs)
            failures += 1
        write("coordinator/loop.c", '#include "coordinator/rounds.h"\n')
        write("coordinator/rounds.h", "#pragma once\n")
        errs, _ = check_src(t)
        if not any("upward include inside coordinator/" in e and "coordinator/loop.c:1" in e for e in errs):
            print("self-test: loop.c including rounds.h (a higher layer) was not caught:", errs)
            failures += 1
        os.remove(os.path.join(t, "coordinator/loop.c"))
        write("coordinator/ctl/c.c", '#include "coordinator/x.h"\n')
        errs, _ = check_src(t)
        if not any("room 'ctl'" in e for e in errs):
            print("self-test: the CLI including the daemon was not caught:", errs)
            failures += 1
        write("coordinator/z.c", '#include "coordinator/x.h"\n')
        errs, _ = check_src(t)
        if not any("coordinator/z: module not on the map" in e for e in errs):
            print("self-test: coordinator/z.c, on no line of coord.h's map, was not caught:", errs)
            failures += 1
        os.remove(os.path.join(t, "coordinator/z.c"))
        os.remove(os.path.join(t, "coordinator/rounds.h"))
        errs, _ = check_src(t)
        if not any("map names 'rounds'" in e for e in errs):
            print("self-test: coord.h's map naming a module that is gone was not caught:", errs)
            failures += 1
        # A call circle through object files (only when a C compiler is at hand).
        cc = os.environ.get("CC", "cc")
        srcs = {"a": "int b(void); int a(void) { return b(); }\n",
                "b": "int c(void); int b(void) { return c(); }\n",
                "c": "int a(void); int c(void) { return 1; } int d(void) { return a(); }\n"}
        objs = []
        for m, src in srcs.items():
            write(f"o/{m}.c", src)
            objs.append(os.path.join(t, f"o/{m}.c.o"))
            subprocess.run([cc, "-c", os.path.join(t, f"o/{m}.c"), "-o", objs[-1]], check=True)
        errs, _ = check_calls([("t", objs)])
        if not any("circle" in e and "a, b, c" in e for e in errs):
            print("self-test: the call circle a -> b -> c -> a was not caught:", errs)
            failures += 1
        errs, _ = check_calls([("t", objs[:2])])
        if errs:
            print("self-test: one-way calls a -> b were refused:", errs)
            failures += 1
    print("self-test:", "FAILED" if failures else "ok (upward include, include circle, CLI→daemon, call circle, "
          "module off the map, stale map entry caught)")
    return 1 if failures else 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "self-test":
        return self_test()
    if len(argv) == 3 and argv[1] == "src":
        errs, n = check_src(argv[2])
        what = f"{n} source files"
    elif len(argv) >= 3 and argv[1] == "calls":
        errs, n = check_calls(parse_targets(argv[2:]))
        what = f"{n} object files"
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for e in errs:
        print(e)
    print(f"layers: {what}, {len(errs)} problem(s)")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
