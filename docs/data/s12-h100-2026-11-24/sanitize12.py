"""FP8-cache cases of the H<=16 sparse kernel asked by name (raw rows dequantized in its ring):
every quantized format, pages of 64 and 1, FlashMLA's 4-D form, invalid indices, sinks, H 16 / 20,
for compute-sanitizer; exits non-zero on a wrong result."""
import sys, torch
from mlagen import bench_sparse
cases = [c for c in bench_sparse.fp8_cases() if c["topk"] <= 700 and c["heads"] <= 64][:6]
bad = 0
for i, c in enumerate(cases):
    ok, msg = bench_sparse.check_fp8_case(torch, c, seed=17 + i, kernel="mla_sparse_prefill_sm90_h16")
    print(c, ok, msg[:160], flush=True)
    bad += not ok
sys.exit(1 if bad else 0)
