#!/usr/bin/python3
"""tokenizer_hf_oracle.py — ids from common/tokenizer_hf.c (tokenizer.json) against npm
@huggingface/tokenizers, Hugging Face's own JavaScript implementation of the format.

For each tokenizer.json given (the packaged files of GPT-2, Llama 3 and Qwen3 that
deploy/fetch_assets.sh unpacks, and "smollm-style": GPT-2's file with SmolLM's pre-tokenizer,
Digits then ByteLevel), both implementations encode the same documents: the generated corpus
of tests/oracle/tokenizer_oracle.py (prose, contractions, numbers, whitespace runs, many
scripts, character soup), the SOTU demo corpus (pieces of every 4th address, or with
--full-corpus every address whole), and documents with the file's added tokens written into
the text. Every id must match, and the C tool checks that
decode gives each document back (the JavaScript decode is checked too).

A file with the NFC normalizer gets only the documents whose code points lie in the set
tokenizer_hf.c implements NFC for (it refuses other text); one with the Digits pre-tokenizer
only documents whose digits are ASCII (the JavaScript port splits on \d, Hugging Face's Rust
library and tokenizer_hf.c on every Unicode number); the count left out is printed.
Whitespace code points on which the regex engines' Unicode tables differ (the list in
tokenizer_oracle.py) are left out of the generated documents.

usage: tokenizer_hf_oracle.py --tool build/tests/test_tokenizer_tool --cache tests/.cache [--full-corpus] NAME...
Exit 0 pass, 1 fail (including node or the fetched assets missing).
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import tokenizer_oracle as base  # noqa: E402  (the generated corpus and the SOTU cutter)

PKG = "node_modules/@huggingface/tokenizers"


def nfc_stable(cp):
    """The code points tokenizer_hf.c's nfc_stable() accepts."""
    return (cp < 0x300 or 0x2002 <= cp <= 0x20C0 or 0x4E00 <= cp <= 0x9FFF or 0xAC00 <= cp <= 0xD7A3
            or 0x1F300 <= cp <= 0x1FAFF)


def added_docs(tj, rng):
    added = [a["content"] for a in tj.get("added_tokens") or []]
    docs = []
    for _ in range(40):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(rng.choice(added))
            parts.append(rng.choice(["", " ", "Hello", " world\n", "x", "  12345 ", "<|", "|>", "<"]))
        docs.append("".join(parts))
    return docs


def run(cmd, docs_path, n):
    r = subprocess.run(cmd + [docs_path], capture_output=True, timeout=600)
    if r.returncode != 0:
        sys.stderr.write(r.stderr.decode(errors="replace")[-2000:])
        raise SystemExit(f"FAIL: {' '.join(cmd)} exited with {r.returncode}")
    lines = r.stdout.decode().split("\n")[:-1]
    if len(lines) != n:
        raise SystemExit(f"FAIL: {cmd[0]} gave {len(lines)} lines for {n} documents")
    return lines


# SmolLM's pre-tokenizer (no package ships its file): digits split one by one, then GPT-2's
# ByteLevel regex. Checked on GPT-2's vocabulary and merges with that pipeline swapped in.
SMOLLM_PRE = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}


def tokenizer_file(name, cache, tmp):
    """The path of NAME's tokenizer.json: hf-NAME/, or smollm-style derived from hf-gpt2/."""
    if name != "smollm-style":
        return os.path.join(cache, f"hf-{name}", "tokenizer.json")
    with open(os.path.join(cache, "hf-gpt2", "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    tj["pre_tokenizer"] = SMOLLM_PRE
    path = os.path.join(tmp, "smollm-style.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tj, f)
    return path


def check(name, tool, node, cache, docs_all, rng):
    with tempfile.TemporaryDirectory() as tmp:
        return check_file(name, tokenizer_file(name, cache, tmp), tool, node, docs_all, rng, cache)


def check_file(name, path, tool, node, docs_all, rng, cache):
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    docs = docs_all + added_docs(tj, rng)
    left_out, why = 0, ""
    if (tj.get("normalizer") or {}).get("type") == "NFC":
        keep = [d for d in docs if all(nfc_stable(ord(c)) for c in d)]
        left_out, why = len(docs) - len(keep), "outside the NFC subset"
        docs = keep
    if any(p.get("type") == "Digits" for p in (tj.get("pre_tokenizer") or {}).get("pretokenizers", [])):
        # Hugging Face's Digits splits on Rust's char::is_numeric (Unicode N*), as \p{N} does in
        # tokenizer_hf.c; the JavaScript port uses \d (ASCII only), so text with other digits
        # (½, ², Arabic-Indic ٣) is left out of this comparison.
        keep = [d for d in docs if not any(unicodedata.category(c)[0] == "N" and not "0" <= c <= "9" for c in d)]
        left_out, why = len(docs) - len(keep), "non-ASCII digits, which the JavaScript Digits does not split"
        docs = keep
    with tempfile.TemporaryDirectory() as tmp:
        docs_path = os.path.join(tmp, "docs.bin")
        base.write_docs(docs_path, docs)
        js = run([node, os.path.join(HERE, "tokenizer_hf_oracle.js"), os.path.join(cache, PKG), path],
                 docs_path, len(docs))
        c = run([tool, "encode", path], docs_path, len(docs))
    failures, n_tokens, js_decode_bad = 0, 0, 0
    for i, d in enumerate(docs):
        ids, back = js[i].split("\t")
        js_decode_bad += back != "1"
        n_tokens += len(ids.split())
        if ids != c[i]:
            failures += 1
            if failures <= 5:
                jt, ct = ids.split(), c[i].split()
                k = next((j for j in range(min(len(jt), len(ct))) if jt[j] != ct[j]), min(len(jt), len(ct)))
                print(f"{name}: MISMATCH doc {i}: {d[:200]!r}")
                print(f"  first difference at token {k}: js {jt[max(0, k - 3):k + 5]} c {ct[max(0, k - 3):k + 5]}")
    print(f"{name}: {len(docs)} documents, {n_tokens} tokens, {failures} mismatched"
          + (f", {left_out} left out ({why})" if left_out else "")
          + (f"; note: the JavaScript decode differs on {js_decode_bad}" if js_decode_bad else ""))
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--full-corpus", action="store_true", help="every SOTU address whole, not pieces of every 4th")
    ap.add_argument("names", nargs="+", help="gpt2, llama3, qwen3 (hf-NAME/ of the cache) or smollm-style")
    a = ap.parse_args()
    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        print("FAIL: node (Node.js) is not installed; the oracle is npm @huggingface/tokenizers run by node. "
              "Install it with `apt-get install npm`.")
        return 1
    need = [os.path.join(a.cache, PKG, "dist", "tokenizers.cjs")]
    need += [os.path.join(a.cache, "hf-gpt2" if n == "smollm-style" else f"hf-{n}", "tokenizer.json") for n in a.names]
    missing = [p for p in need if not os.path.exists(p)]
    if missing:
        print(f"FAIL: {', '.join(missing)} missing; run deploy/fetch_assets.sh tests/.cache "
              "(tests/run.sh does)")
        return 1
    rng = random.Random(20240520)
    docs = [d for d in base.PROSE + base.random_docs(rng)
            if not any(ord(c) in base.KNOWN_SPACE_DIFFS for c in d)]
    sotu = os.path.join(a.cache, "sotu")
    if os.path.isdir(sotu):
        if a.full_corpus:  # every address whole: the demo corpus as dipacoctl data prepare reads it
            for fn in sorted(os.listdir(sotu)):
                if fn.endswith(".txt"):
                    with open(os.path.join(sotu, fn), encoding="utf-8") as fh:
                        docs.append(fh.read())
        else:
            docs += base.sotu_docs(sotu, rng)
    else:
        print("note: no SOTU corpus in the cache; generated documents only")
    failures = sum(check(n, a.tool, node, a.cache, docs, random.Random(7)) for n in a.names)
    print("FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
