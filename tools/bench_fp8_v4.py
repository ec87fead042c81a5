"""Time DeepSeek-V4 attention read from the V4 FP8 cache (``kv_format="fp8_v4"``, 584 B per token)
through the public call, against dequantize-then-FlashMLA, on BENCHMARKS.md's V1 (or V2).

The cache is the one-pool form of V1: the raw pool (131072 tokens) and the 4x-compressed pool
(32768 entries) concatenated into one V4 FP8 cache of 64-token pages; each of the 4096 queries
(the last 4096 positions) lists its 128-token window and 512 (V2: 1024) compressed entries drawn
without repetition among those complete at its position; the sink on; softmax scale 1/sqrt(512).

Columns, each the median of ``--rounds`` interleaved rounds of ``--iters`` calls (CUDA events, the
L2 cache flushed before each call, mlagen.measure):

* ``call``: ``mlagen.mla_sparse_prefill(q, cache, idx, kv_format="fp8_v4", ...)`` as users write
  it (the named rows staged into bf16, then dispatch's kernel);
* ``in_kernel``: the same with ``kernel="mla_sparse_prefill_sm90"`` (rows converted in the kernel);
* ``bf16_copy``: our default call on the bf16 copy of the dequantized rows (no conversion);
* ``dequant_flashmla``: the cache dequantized into a bf16 buffer with torch ops, then FlashMLA's
  ``flash_mla_sparse_fwd`` on it (a server without a kernel for the cache);
* ``flashmla_copy``: FlashMLA on the bf16 copy alone.

FlashMLA comes from ``$MLAGEN_PEERS_DIR/flashmla`` (skipped, saying why, when it is not built).
Needs a CUDA GPU.

    python tools/bench_fp8_v4.py                 # V1
    python tools/bench_fp8_v4.py --shape V2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import mlagen
from mlagen import operands
from mlagen.families.mla_sparse_prefill.peers import FLASHMLA
from mlagen.measure import L2Flush, time_calls

SHAPES = {"V1": (4096, 64, 512), "V2": (4096, 128, 1024)}   # Sq, heads, compressed entries per query
RAW, COMPRESSED, WINDOW, RATIO = 131072, 32768, 128, 4
V4 = operands.get("fp8_v4")


def v4_indices(sq: int, topk_c: int, gen) -> torch.Tensor:
    """[Sq, 128 + topk_c] int32 rows of the concatenated pool: the window, then the compressed
    choices (RAW + j), a uniform choice without repetition among the entries visible at the query."""
    pos = torch.arange(RAW - sq, RAW, device="cuda")
    window = pos[:, None] - torch.arange(WINDOW - 1, -1, -1, device="cuda")[None, :]
    visible = (pos + 1) // RATIO                            # entries j with RATIO * j + RATIO - 1 <= pos
    chosen = []
    for t0 in range(0, sq, 256):
        r = torch.rand((min(256, sq - t0), COMPRESSED), generator=gen, device="cuda")
        r[torch.arange(COMPRESSED, device="cuda")[None, :] >= visible[t0:t0 + 256, None]] = -1.0
        chosen.append(r.topk(topk_c, dim=-1).indices + RAW)
    return torch.cat([window, torch.cat(chosen)], dim=1).to(torch.int32).contiguous()


def dequantize_into(cache, out):
    """The cache's rows dequantized into ``out`` [N, 512] bf16 with torch ops (fp32 product, bf16)."""
    pages = cache.shape[0]
    ps = V4.page_size_of(cache.shape[1])
    body = cache[:, :ps * 576].view(pages, ps, 576)
    scales = cache[:, ps * 576:ps * 584].view(pages, ps, 8)[..., :7].view(torch.float8_e8m0fnu).float()
    vals = body[..., :448].view(torch.float8_e4m3fn).float().view(pages, ps, 7, 64) * scales[..., None]
    rows = out.view(pages, ps, 512)
    rows[..., :448] = vals.view(pages, ps, 448)
    rows[..., 448:] = body[..., 448:].view(torch.bfloat16)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="V1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_fp8_v4: needs a CUDA GPU, and torch sees none", file=sys.stderr)
        return 2
    sq, heads, topk_c = SHAPES[args.shape]
    gen = torch.Generator(device="cuda").manual_seed(0)
    n = RAW + COMPRESSED
    rows = torch.randn((n, 512), generator=gen, device="cuda")
    cache = operands.quantize(rows, V4, page_size=64)          # [2560, 37440] uint8
    del rows
    idx = v4_indices(sq, topk_c, gen)
    topk = idx.shape[1]
    q = torch.randn((sq, heads, 512), generator=gen, device="cuda").to(torch.bfloat16)
    sink = torch.randn((heads,), generator=gen, device="cuda")
    scale = 512 ** -0.5
    copy = operands.dequantize(cache, V4, round_bf16=True)
    buf = torch.empty_like(copy)
    assert torch.equal(dequantize_into(cache, buf), copy), "the torch dequantization must make the kernel's rows"
    flops = 2 * sq * heads * topk * (512 + 512)
    dev = torch.cuda.get_device_properties(0)
    print(f"device: {dev.name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}; {args.shape}: Sq {sq}, "
          f"H {heads}, keys {WINDOW} + {topk_c}, pool {n} tokens in {cache.shape[0]} pages of 64 "
          f"({cache.numel() / 2**20:.0f} MiB FP8, {copy.numel() * 2 / 2**20:.0f} MiB bf16)", flush=True)

    kw = dict(softmax_scale=scale, attn_sink=sink)
    fns = {
        "call": lambda: mlagen.mla_sparse_prefill(q, cache, idx, kv_format="fp8_v4", **kw),
        "in_kernel": lambda: mlagen.mla_sparse_prefill(q, cache, idx, kv_format="fp8_v4",
                                                       kernel="mla_sparse_prefill_sm90", **kw),
        "bf16_copy": lambda: mlagen.mla_sparse_prefill(q, copy, idx, **kw),
    }
    path, why = FLASHMLA.status()
    if path:
        fwd = FLASHMLA.load().sparse_fwd
        idx3 = idx.view(sq, 1, topk)
        fns["dequant_flashmla"] = lambda: fwd(q, dequantize_into(cache, buf).view(n, 1, 512), idx3, scale, 512, sink, None)
        fns["flashmla_copy"] = lambda: fwd(q, copy.view(n, 1, 512), idx3, scale, 512, sink, None)
    else:
        print(f"flashmla skipped: {why}", flush=True)
    results = {k: f() for k, f in fns.items()}
    twin = mlagen.mla_sparse_prefill(q, copy, idx, **kw)
    twin_k = mlagen.mla_sparse_prefill(q, copy, idx, kernel="mla_sparse_prefill_sm90", **kw)
    torch.cuda.synchronize()
    checks = {"call == bf16 kernel on the copy": all(torch.equal(a, b) for a, b in zip(results["call"], twin)),
              "in_kernel == sm90 on the copy": all(torch.equal(a, b) for a, b in zip(results["in_kernel"], twin_k))}
    if "flashmla_copy" in results:
        o, f = results["call"][0].float(), results["flashmla_copy"][0].float()
        checks["call vs FlashMLA out rel L2"] = ((o - f).norm() / f.norm()).item()
    print(checks, flush=True)
    flush = L2Flush("cuda")
    times = {k: [] for k in fns}
    for _ in range(args.rounds):
        for k, f in fns.items():
            times[k].append(statistics.median(time_calls(f, args.iters, flush)) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"| {args.shape} | ms | TFLOP/s | call / this |")
    print("|---|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {flops / v / 1e9:.0f} | {v / med['call']:.3f} |")
    row = {"shape": args.shape, "ms": med, "rounds_ms": times, "checks": checks, "device": dev.name}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(row, fh, indent=1)
    return 0 if checks["call == bf16 kernel on the copy"] and checks["in_kernel == sm90 on the copy"] else 1


if __name__ == "__main__":
    sys.exit(main())
