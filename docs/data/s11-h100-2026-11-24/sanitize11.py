"""A few cases of the H<=16 sparse kernel (H 16 / 5 / 20, flat and paged, invalid indices, short
topk_length) for compute-sanitizer; exits non-zero on a wrong result."""
import sys, torch
from mlagen import bench_sparse
cases = bench_sparse.verify_cases()
picked = [c for c in cases if c["heads"] in (5, 16) and c["topk"] <= 640][:4]
picked.append(dict(picked[0], heads=20, kv="paged", n=300))
bad = 0
for i, c in enumerate(picked):
    ok, msg = bench_sparse.check_case(torch, c, seed=7 + i, kernel="mla_sparse_prefill_sm90_h16")
    print(c, ok, msg, flush=True)
    bad += not ok
sys.exit(1 if bad else 0)
