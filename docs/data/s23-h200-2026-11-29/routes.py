"""Session 23: the staged FP8-cache call's two routes (the pool converted whole; the named rows compacted),
timed as users call it (public call, L2 flushed before each call, median of iters, interleaved rounds), on S1 / S3
and on a serving-like pool (1 M rows of which the request's indices name 8192), with the in-kernel conversion and
our bf16 kernel on a bf16 copy of the rows beside them. Prints one line per case and route."""
import dataclasses
import os
import sys

import torch

os.environ.setdefault("MLAGEN_STAGING_MB", "100000")   # the routes timed whatever their workspace (the 1 M-row pool: 1.2 GiB)

import mlagen
from mlagen import measure, operands
from mlagen.families import mla_sparse_prefill as fam
from mlagen.families.mla_sparse_prefill import staging

fmt = operands.get("fp8_v32")
DEFAULT_FRACTION = staging.WHOLE_POOL_FRACTION
flush = measure.L2Flush("cuda")
rounds, iters = 3, 10


def case(name):
    if name == "big":   # S1's queries against a 1 M-row pool, indices into 8192 scattered rows of it
        shape = dataclasses.replace(fam.parse_shape("S1"), kv_format="fp8_v32")
        inp = fam.make_inputs(shape, "cuda", seed=0)
        n = 1 << 20
        g = torch.Generator(device="cuda").manual_seed(1)
        pool = torch.randint(0, 256, (n, fmt.row_bytes), dtype=torch.uint8, device="cuda", generator=g)
        pool[:, :fmt.values] &= 0x77          # finite e4m3 values, moderate
        pool[:, fmt.scale_offset:fmt.rope_offset] = torch.full((n, fmt.scales), 2.0 ** -4).view(torch.uint8)
        pool[:, fmt.rope_offset:] = torch.randn((n, 64), device="cuda", generator=g).to(torch.bfloat16).view(torch.uint8)
        slots = torch.randperm(n, device="cuda", generator=g)[:8192].to(torch.int32)
        rows = inp["kv"].reshape(-1, fmt.row_bytes)
        pool[slots.long()] = rows[: 8192]
        idx = inp["indices"]
        inp["indices"] = torch.where(idx >= 0, slots[idx.clamp(0, 8191).long()], idx)
        inp["kv"] = pool.view(n // 64, 64, fmt.row_bytes)
        return inp
    shape = dataclasses.replace(fam.parse_shape(name), kv_format="fp8_v32")
    return fam.make_inputs(shape, "cuda", seed=0)


for name in (sys.argv[1:] or ["S1", "S3", "big"]) if __name__ == "__main__" else []:
    inp = case(name)
    q, cache, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
    copy = operands.dequantize(cache, fmt, round_bf16=True)
    base = mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=sc, attn_sink=sink, kv_format="fp8_v32",
                                     kernel="mla_sparse_prefill_sm90")

    def staged(fraction):
        def f():
            staging.WHOLE_POOL_FRACTION = fraction
            return mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=sc, attn_sink=sink, kv_format="fp8_v32")
        return f

    fns = {"whole": staged(0), "compacted": staged(10**9),
           "in-kernel": lambda: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=sc, attn_sink=sink,
                                                          kv_format="fp8_v32", kernel="mla_sparse_prefill_sm90"),
           "bf16 copy": lambda: mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=sc, attn_sink=sink)}
    extra = {}
    for k in ("whole", "compacted"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        got = fns[k]()
        torch.cuda.synchronize()
        extra[k] = (torch.cuda.max_memory_allocated() - before) / 2**20
        assert all(torch.equal(a, b) for a, b in zip(got, base)), (name, k)
        got = None
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            times[k].append(measure.median(measure.time_calls(f, iters, flush)) * 1e3)
    med = {k: measure.median(v) for k, v in times.items()}
    n = cache.numel() // fmt.row_bytes
    print(f"{name}: pool {n} rows, refs {idx.numel()}; " + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items())
          + f"; whole / compacted {med['compacted'] / med['whole']:.3f}x; peak MiB over the call (outputs included): "
          + ", ".join(f"{k} {v:.0f}" for k, v in extra.items()) + f"; rounds {times}", flush=True)
    staging.WHOLE_POOL_FRACTION = DEFAULT_FRACTION
    inp = copy = cache = base = fns = None
    torch.cuda.empty_cache()
