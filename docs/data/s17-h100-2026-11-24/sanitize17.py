"""compute-sanitizer target (session 17): compute="fp8" with 64- and 32-value scale blocks, fuzzed
indices (negative, >= N, -1, duplicates), flat / paged / strided / 4-D pools; prints each check."""
import torch
from mlagen import bench_sparse as bs

cases = [dict(sq=3, heads=64, topk=640, n=3000, kv="p1", kv_format="fp8_b64", sink="finite", invalid=0.3),
         dict(sq=2, heads=128, topk=2048, n=5000, kv="p64_strided", kv_format="fp8_b32", sink="mixed",
              topk_length="short"),
         dict(sq=3, heads=5, topk=33, n=200, kv="p64_4d", kv_format="fp8_b32", sink="none", invalid=0.5, idx3=True),
         dict(sq=3, heads=20, topk=700, n=37, kv="p64", kv_format="fp8_b64", sink="mixed", topk_length="long")]
for i, c in enumerate(cases):
    print(i, c["kv_format"], bs.check_fp8_compute_case(torch, c, 40 + i), flush=True)
