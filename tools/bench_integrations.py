"""Time transformers' DeepSeek-V3 attention call through attn_implementation="mlagen" against the
same attention on packed inputs and against SDPA on the model's own tensors (issue 38's bar: the
backend's call within 3% of the packed call).

The tensors are built as transformers' ``DeepseekV3Attention`` builds them: query and key
contiguous [B, H, S, 192] (a concatenation, a new tensor), value a [B, H, S, 128] slice of the
transposed [B, S, H, 256] output of ``kv_b_proj``. Each row is the median of ``--iters`` calls timed
by CUDA events with the L2 cache flushed before each (mlagen.measure), after warm-up calls (which
compile). Needs a CUDA GPU and transformers.

    python tools/bench_integrations.py                      # B=2, S=4096, H=128, causal
    python tools/bench_integrations.py --heads 64 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import mlagen
from mlagen import layouts
from mlagen.api import mla_prefill_kernel
from mlagen.measure import L2Flush, time_calls


def model_tensors(b: int, s: int, h: int):
    g = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)

    query, key = rnd(b, h, s, 192), rnd(b, h, s, 192)
    value = rnd(b, s, h, 256).transpose(1, 2)[..., 128:]
    return query, key, value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_integrations: needs a CUDA GPU", file=sys.stderr)
        return 2
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from mlagen.integrations.transformers import mlagen_attention_forward

    b, s, h = args.batch, args.seqlen, args.heads
    scale = 192 ** -0.5
    query, key, value = model_tensors(b, s, h)
    module = torch.nn.Module()
    module.is_causal = True
    module.num_key_value_groups = 1
    packed = [t.transpose(1, 2).reshape(b * s, h, t.shape[-1]).contiguous() for t in (query, key, value)]
    cu = torch.arange(b + 1, dtype=torch.int32, device="cuda") * s
    v_heads = value.contiguous()   # a value the heads fold takes (the model's own does not: see layouts)
    bshd = [t.transpose(1, 2) for t in (query, key, v_heads)]

    def copying_adapter():   # the obvious adapter of the issue: copies q, k and v
        q, k, v = (t.transpose(1, 2).reshape(b * s, h, t.shape[-1]) for t in (query, key, value))
        return mlagen.mla_prefill(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, softmax_scale=scale)

    cases = {
        "transformers mlagen (the model's tensors)": lambda: mlagen_attention_forward(
            module, query, key, value, None, scaling=scale),
        "mlagen packed [B*S, H, D] + cu_seqlens": lambda: mlagen.mla_prefill(
            *packed, cu_seqlens_q=cu, cu_seqlens_k=cu, softmax_scale=scale),
        "mlagen batched, heads fold (v contiguous)": lambda: layouts.dense_batched(
            mlagen.mla_prefill, False, *bshd, softmax_scale=scale, fold="heads"),
        "mlagen batched, per-sequence fold": lambda: layouts.dense_batched(
            mlagen.mla_prefill, False, *bshd, softmax_scale=scale, fold="batch"),
        "copying adapter (transpose + reshape)": copying_adapter,
        "transformers sdpa (the model's tensors)": lambda: sdpa_attention_forward(
            module, query, key, value, None, scaling=scale),
    }
    print(f"B={b} S={s} H={h} causal, {torch.cuda.get_device_name()}; fold of the model's tensors: "
          f"{layouts.choose_fold([t.transpose(1, 2) for t in (query, key, value)])}")
    for name, (qq, kk, vv), extra in (
            ("packed", packed, dict(cu_seqlens_q=cu, cu_seqlens_k=cu)),
            ("per sequence [S, H, D]", [t[0] for t in bshd], {}),
            ("heads fold [S, B*H, D]", [layouts.fold_heads(t) for t in bshd], {})):
        sel = mla_prefill_kernel(qq, kk, vv, **extra)
        print(f"  kernel for {name}: {sel.variant.symbol} ({sel.origin})")
    flush = L2Flush(torch.cuda.current_device())
    rows = []
    for name, fn in cases.items():
        for _ in range(3):
            fn()
        times = sorted(time_calls(fn, args.iters, flush))
        rows.append(dict(case=name, median_ms=statistics.median(times) * 1e3, p10_ms=times[len(times) // 10] * 1e3,
                         p90_ms=times[(9 * len(times)) // 10] * 1e3))
    base = rows[1]["median_ms"]
    print(f"{'case':46s} {'median ms':>10s} {'p10':>8s} {'p90':>8s} {'/ packed':>9s}")
    for r in rows:
        print(f"{r['case']:46s} {r['median_ms']:10.3f} {r['p10_ms']:8.3f} {r['p90_ms']:8.3f} "
              f"{r['median_ms'] / base:9.3f}")
    out_tf = mlagen_attention_forward(module, query, key, value, None, scaling=scale)[0]
    out_packed = cases["mlagen packed [B*S, H, D] + cu_seqlens"]()[0]
    diff = (out_tf.reshape(b * s, h, 128).float() - out_packed.float()).abs().max().item()
    ratio = rows[0]["median_ms"] / base
    print(f"transformers call / packed call: {ratio:.3f} ({'within' if ratio <= 1.03 else 'NOT within'} 3%); "
          f"max |out difference| {diff:.3g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(batch=b, seqlen=s, heads=h, device=torch.cuda.get_device_name(), rows=rows,
                           ratio=ratio, max_out_difference=diff), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
