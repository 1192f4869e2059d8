#!/usr/bin/env python3
"""sizes.py — keeps product code in pieces a reader can hold: no source file of common/,
kernels/, coordinator/, worker/ or proto/ over MAX_FILE lines and no function over MAX_FUNC.

  sizes.py check ROOT     lists every file and function over its limit; exit 1 if any
  sizes.py self-test      plants a long function and a long file and requires both caught

Functions are found the way the tree writes them (docs/design.md §7 and the code's own style):
a definition starts at column 0 with a line holding '(' that is not a declaration, and ends at
the first '}' in column 0. Generated code (the build tree) is not read.
"""
import os
import re
import sys
import tempfile

MAX_FILE = 900
MAX_FUNC = 120
DIRS = ["common", "kernels", "coordinator", "worker", "proto"]
EXTS = (".c", ".h", ".cu", ".cuh", ".proto")
NOT_A_FUNC = re.compile(r"^(#|/\*|\*|//|typedef\b|struct\s+\w+\s*\{|enum\b|union\b|extern\s+\"C\")")


def functions(lines):
    """[(name, first line, length)] of the function definitions in a C file's lines."""
    out, i, n = [], 0, len(lines)
    while i < n:
        line = lines[i]
        if line[:1].isalpha() or line[:1] == "_":
            if "(" in line and not NOT_A_FUNC.match(line) and not line.rstrip().endswith(";"):
                # The signature may run over several lines; the body opens with '{' at the end of
                # one of them, before any ';' (a prototype) or '=' (a table) ends the statement.
                j = i
                while j < n and not lines[j].rstrip().endswith("{"):
                    if lines[j].rstrip().endswith(";") or "=" in lines[j].split("(")[0]:
                        j = -1
                        break
                    j += 1
                if j > 0 and j < n:
                    k = j + 1
                    while k < n and not lines[k].startswith("}"):
                        k += 1
                    m = re.search(r"(\w+)\s*\(", line)
                    out.append((m.group(1) if m else "?", i + 1, k - i + 1))
                    i = k + 1
                    continue
        i += 1
    return out


def check(root):
    problems = []
    for d in DIRS:
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for f in sorted(files):
                if not f.endswith(EXTS):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    lines = fh.read().split("\n")
                if lines and lines[-1] == "":
                    lines.pop()
                if len(lines) > MAX_FILE:
                    problems.append(f"{rel}: {len(lines)} lines (at most {MAX_FILE}): split it by responsibility")
                if f.endswith(".proto"):
                    continue
                for name, first, length in functions(lines):
                    if length > MAX_FUNC:
                        problems.append(f"{rel}:{first}: function {name} is {length} lines (at most {MAX_FUNC})")
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as t:
        os.makedirs(os.path.join(t, "common"))
        short = "static int add(int a,\n               int b) {\n  return a + b;\n}\n"
        proto = "int add(int a, int b);\nstatic const int table[] = {\n  1,\n};\n"
        with open(os.path.join(t, "common", "ok.c"), "w") as fh:
            fh.write(proto + short)
        if check(t):
            print("sizes self-test: a clean tree was refused:", check(t))
            return 1
        body = "".join(f"  x += {i};\n" for i in range(MAX_FUNC))
        with open(os.path.join(t, "common", "long.c"), "w") as fh:
            fh.write(f"int long_one(int x)\n{{\n{body}  return x;\n}}\n")
        if not any("long_one" in p for p in check(t)):
            print("sizes self-test: a function over the limit was not caught")
            return 1
        os.remove(os.path.join(t, "common", "long.c"))
        with open(os.path.join(t, "common", "big.h"), "w") as fh:
            fh.write("/* big */\n" * (MAX_FILE + 1))
        if not any("big.h" in p for p in check(t)):
            print("sizes self-test: a file over the limit was not caught")
            return 1
    print("sizes self-test: a long function and a long file caught, the clean tree passed")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "self-test":
        return self_test()
    if len(argv) != 3 or argv[1] != "check":
        print(__doc__)
        return 2
    problems = check(argv[2])
    for p in problems:
        print(p)
    print(f"sizes: {len(problems)} file(s) or function(s) over the limits")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
