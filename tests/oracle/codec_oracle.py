#!/usr/bin/env python3
"""codec_oracle.py — PyTorch as the oracle for common/codec.c's bf16: test_codec --dump prints
random fp32 patterns and the bf16 codes dipaco made; torch converts the same floats with
.to(torch.bfloat16) (round to nearest even) and every code must match.

usage: codec_oracle.py TEST_CODEC"""
import subprocess
import sys

import torch


def main():
    out = subprocess.run([sys.argv[1], "--dump", "20000", "12345"], check=True, capture_output=True,
                         text=True).stdout.split()
    bits = torch.tensor([int(h, 16) for h in out[0::2]], dtype=torch.int64)
    ours = [int(h, 16) for h in out[1::2]]
    x = bits.to(torch.int32).view(torch.float32)
    ref = x.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    bad = [i for i in range(len(ours)) if ours[i] != int(ref[i])]
    for i in bad[:10]:
        print(f"float {out[2 * i]}: dipaco bf16 {ours[i]:04x}, torch {int(ref[i]):04x}")
    print(f"codec_oracle: {len(ours)} floats, {len(bad)} bf16 codes differ from torch")
    return 1 if bad or not ours else 0


if __name__ == "__main__":
    sys.exit(main())
