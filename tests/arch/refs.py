#!/usr/bin/env python3
"""refs.py — checks that no reference in the tree points outside it.

  refs.py check ROOT
      Reads every tracked text file (code, scripts, cmake, docs) and fails on
      (1) a cited Markdown file (`x.md`, `docs/design.md`, `tests/oracle/SPARSE.md`) that does
          not exist, resolved from the repository root or from the citing file's folder, or one
          that lies outside the repository (a path that climbs above its root);
      (2) a cited section that the file does not have: `docs/design.md §3` needs a heading
          `## 3.`, `§3.4` one starting `### 3.4`, and `README "Two commands"` or
          `docs/operations.md "Metrics"` a heading that contains the quoted words;
      (3) an issue-tracker number or a finding of one (`issue 23`, `issue #14`, `finding 7`,
          `(#16)`) in product code: common/, kernels/, coordinator/, worker/, proto/, deploy/
          and the CMake files. History belongs in git log, reasons in words.
  refs.py self-test
      Plants each kind of violation in a scratch tree and requires the check to catch it, and
      requires a clean scratch tree to pass.
"""
import os
import re
import subprocess
import sys
import tempfile

TEXT_EXT = (".c", ".h", ".cu", ".cuh", ".py", ".sh", ".cmake", ".txt", ".md", ".proto",
            ".service", ".yaml", ".yml", ".json", ".mjs", ".toml", ".conf", ".in")
PRODUCT = re.compile(r"^(common|kernels|coordinator|worker|proto|deploy)/|(^|/)CMakeLists\.txt$")
SELF = "tests/arch/refs.py"
SKIP_DIRS = {".git", "tests/.cache", "demo"}

# A Markdown path: a run of path characters ending in .md (not part of a URL).
MD_REF = re.compile(r"(?<![\w/.:-])((?:\.\./|[\w-]+/)*[\w.-]+\.md)\b(?:\s+§(\d+(?:\.\d+)?)|#([\w-]+))?")
# README "Heading" / docs/x.md "Heading" (the quoted words must be in a heading of that file).
NAMED_REF = re.compile(r"\b((?:[\w-]+/)*(?:README|[\w-]+\.md))\s+\"([^\"\n]{2,80})\"")
LINK_TEXT = re.compile(r"\[[^\]]*\]\(")
ISSUE_REF = re.compile(r"\b(?:issues?|findings?|tasks?)\s+#?\d+\b|(?:(?<=\s)|(?<=\())#\d+(?=[\s:),;])",
                       re.IGNORECASE)


def tracked_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode()
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            rel = os.path.relpath(d, root)
            dirs[:] = [x for x in dirs if os.path.normpath(os.path.join(rel, x)) not in SKIP_DIRS
                       and not x.startswith("build")]
            files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    files = [f for f in files if f != SELF]  # its docstring and self-test plant bad references
    return [f for f in files if f.endswith(TEXT_EXT) or os.path.basename(f) == "CMakeLists.txt"]


def headings(path):
    with open(path, encoding="utf-8", errors="replace") as fh:
        return [ln.lstrip("#").strip() for ln in fh if ln.startswith("#")]


def slug(heading):
    """The anchor a Markdown renderer (GitHub's rule) gives a heading."""
    h = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return h.replace(" ", "-")


def resolve(root, citing, ref):
    """The cited file's path inside root, or None (missing or outside the tree)."""
    if ref == "README":
        ref = "README.md"
    for base in (root, os.path.join(root, os.path.dirname(citing))):
        p = os.path.realpath(os.path.join(base, ref))
        if not p.startswith(os.path.realpath(root) + os.sep):
            continue
        if os.path.isfile(p):
            return p
    return None


def check(root):
    errors = []
    for rel in tracked_files(root):
        path = os.path.join(root, rel)
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError):
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            where = f"{rel}:{lineno}"
            if rel.endswith(".md"):
                line = LINK_TEXT.sub("(", line)  # a link's words are not a path; its target is
            for m in MD_REF.finditer(line):
                ref, sec, anchor = m.group(1), m.group(2), m.group(3)
                target = resolve(root, rel, ref)
                if target is None:
                    errors.append(f"{where}: cites {ref}, which is not a file in the repository")
                    continue
                if anchor and anchor not in {slug(h) for h in headings(target)}:
                    errors.append(f"{where}: links {ref}#{anchor}, which has no such heading")
                if sec:
                    depth = "##" if "." not in sec else "###"
                    pat = re.compile(r"^" + depth + r"\s+" + re.escape(sec) + r"[.\s]")
                    with open(target, encoding="utf-8", errors="replace") as fh:
                        if not any(pat.match(ln) for ln in fh):
                            errors.append(f"{where}: cites {ref} §{sec}, which has no heading "
                                          f"'{depth} {sec}'")
            for m in NAMED_REF.finditer(line):
                ref, name = m.group(1), m.group(2)
                target = resolve(root, rel, ref)
                if target is None:
                    errors.append(f"{where}: cites {ref}, which is not a file in the repository")
                elif not any(name.lower() in h.lower() for h in headings(target)):
                    errors.append(f"{where}: cites {ref} \"{name}\", which is no heading of it")
            if PRODUCT.search(rel):
                for m in ISSUE_REF.finditer(line):
                    errors.append(f"{where}: issue-tracker reference '{m.group(0)}' in product "
                                  f"code (say why in words; history belongs in git log)")
    return errors


def self_test():
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "docs"))
        os.makedirs(os.path.join(d, "common"))
        with open(os.path.join(d, "docs", "design.md"), "w") as fh:
            fh.write("# design\n## 1. Processes\n### 1.2 Workers\n## 3. Math\n")
        with open(os.path.join(d, "README.md"), "w") as fh:
            fh.write("# x\n## Two commands\nSee docs/design.md §3 and docs/design.md §1.2, "
                     "[maths](docs/design.md#3-math).\n")
        good = ('/* a.c — see docs/design.md §1 and README "Two commands"; '
                'color:#222 "#1f77b4" */\n')
        with open(os.path.join(d, "common", "a.c"), "w") as fh:
            fh.write(good)
        if check(d):
            print("refs self-test: a clean tree failed:", check(d))
            return 1
        planted_md = {"missing anchor"}
        bad = {
            # Built at run time, so the tree itself holds no reference to a missing file.
            "missing file": "/* see notes/" + "absent_spec.md */\n",
            "outside the tree": "/* see ../" + "outside/DESIGN.md */\n",
            "missing section": "/* see docs/design.md §4 */\n",
            "missing subsection": "/* see docs/design.md §3.1 */\n",
            "missing named heading": '/* see README "Architecture" */\n',
            "missing anchor": "see [x](docs/design.md#2-vocabulary)\n",
            "issue number": "/* the limit (issue 23) */\n",
            "issue hash": "/* packing costs more (#16: a 256x768 block) */\n",
            "finding": "/* issue 13, finding 7 */\n",
        }
        failed = 0
        for what, planted in bad.items():
            name = os.path.join(d, "common", "b.md" if what in planted_md else "b.c")
            with open(name, "w") as fh:
                fh.write(planted)
            if not check(d):
                print(f"refs self-test: a planted {what} was not caught")
                failed = 1
            os.remove(name)
        if failed:
            return 1
    print("refs self-test: every planted reference caught, the clean tree passed")
    return 0


def main(argv):
    if len(argv) == 2 and argv[1] == "self-test":
        return self_test()
    if len(argv) != 3 or argv[1] != "check":
        print(__doc__)
        return 2
    errors = check(argv[2])
    for e in errors:
        print(e)
    print(f"refs: {len(errors)} reference(s) point outside the tree or to nothing")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
