"""Dense FP8 prefill on the device (issue 10 item 3): the public call on e4m3 inputs against the
public call on bf16 inputs of the same shape, in one process, in interleaved rounds.

    python -m mlagen.bench_fp8 [--shapes D1,D3] [--variant block_n=128,swizzle_v=128 ...] [--rounds 5] [--iters 10]

Per shape: the FP8 call's accuracy against the float32 reference on the dequantized inputs (2
heads; relative L2 error of out, largest |lse| error), then per round one block of ``--iters``
calls of each candidate (L2 flushed before every call, CUDA events, BENCHMARKS.md): bf16 as
dispatched, FP8 as dispatched (the spec default or its tuned record), each ``--variant`` of
``mla_prefill_sm90_fp8`` forced, and the V^T pre-pass alone (it is part of every FP8 call).
Medians of the block medians; TFLOP/s by the BENCHMARKS.md count. This module names the dense
family: it is that family's tool, above ``mlagen.measure``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from . import measure

FP8_SPEC = "mla_prefill_sm90_fp8"


def _parse_variant(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: expected NAME=VALUE[,NAME=VALUE...]")
        out[key.strip()] = value.strip()
    return out


def bench_shape(sid: str, variants: list[dict], rounds: int, iters: int, flush) -> list[str]:
    import torch

    from .dispatch import family_specs
    from .families import get as get_family
    from .families.mla_prefill import call as call_mod
    from .families.mla_prefill import entry
    from .variant import make

    tma = importlib.import_module("mlagen.families.mla_prefill.tma")
    family = get_family("mla_prefill")
    spec = next(s for s in family_specs("mla_prefill") if s.name == FP8_SPEC)
    shape = family.shapes()[sid.upper()]
    mask = "causal" if shape.causal else "none"
    bf = family.make_inputs(shape, "cuda", 0)
    f8 = family.make_inputs(shape, "cuda", 0, dtype="fp8_e4m3")
    lines = []
    cands = {"bf16 (dispatched)": lambda: family.call(bf), "fp8 (dispatched)": lambda: family.call(f8)}
    for values in variants:
        v = make(spec, {**values, "mask": mask})
        cands["fp8 " + ",".join(f"{k}={x}" for k, x in values.items())] = (lambda v=v: family.call(f8, variant=v))
    for name, fn in list(cands.items())[1:]:
        got = fn()
        torch.cuda.synchronize()
        ref = family.reference(shape, f8, heads=2)
        check = family.compare(got, ref, dtype="fp8_e4m3")
        rel = float((got[0][:, :2].float() - ref[0]).double().norm() / ref[0].double().norm())
        lse = float((got[1][:, :2] - ref[1]).abs().max())
        lines.append(f"{sid} {name}: {'ok' if check.ok else 'WRONG: ' + str(check.problem)}; out rel L2 "
                     f"{rel:.4f}, lse max abs {lse:.2e}")
        if not check.ok:
            del cands[name]
    c = call_mod.prepare(f8["q"], f8["k"], f8["v"], k_rope=f8["k_rope"], cu_seqlens_q=f8["cu_seqlens_q"],
                         cu_seqlens_k=f8["cu_seqlens_k"])
    _, sel = entry.select(c, FP8_SPEC)
    cands["V^T pre-pass alone"] = lambda: tma.launch_transpose_v(sel, c, torch.cuda.current_stream().cuda_stream)
    for fn in cands.values():
        fn()
    torch.cuda.synchronize()
    blocks = {name: [] for name in cands}
    for _ in range(rounds):
        for name, fn in cands.items():
            blocks[name].append(measure.median(measure.time_calls(fn, iters, flush)))
    flops = family.flops(shape)
    base = measure.median(blocks["bf16 (dispatched)"])
    for name, meds in blocks.items():
        t = measure.median(meds)
        lines.append(f"{sid} {name:48s} {t * 1e3:8.3f} ms {flops / t / 1e12:8.1f} TFLOP/s  {base / t:5.2f}x bf16  "
                     f"(round medians {min(meds) * 1e3:.3f}-{max(meds) * 1e3:.3f} ms)")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mlagen.bench_fp8", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="D1,D3", help="ids of BENCHMARKS.md (default D1,D3)")
    ap.add_argument("--variant", action="append", default=[], help=f"tunables of {FP8_SPEC} to force (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args(argv)
    import torch

    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; CUDA {torch.version.cuda}", flush=True)
    flush = measure.L2Flush(torch.device("cuda", torch.cuda.current_device()))
    variants = [_parse_variant(v) for v in args.variant]
    for sid in args.shapes.split(","):
        for line in bench_shape(sid.strip(), variants, args.rounds, args.iters, flush):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
