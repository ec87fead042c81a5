"""Dense FP8 prefill on the device (issue 10 item 3): the public call on e4m3 inputs against the
public call on bf16 inputs of the same shape, in one process, in interleaved rounds.

    python -m mlagen.families.mla_prefill.tools [--shapes D1,D3] [--variant block_n=128,swizzle_v=128 ...] [--rounds 5] [--iters 10]
                               [--fa3-fp8]

Per shape: the FP8 call's accuracy against the float32 reference on the dequantized inputs (2
heads; relative L2 error of out, largest |lse| error), then per round one block of ``--iters``
calls of each candidate (every other round in reverse order) (L2 flushed before every call, CUDA events, BENCHMARKS.md): bf16 as
dispatched, FP8 as dispatched (the spec default or its tuned record), each ``--variant`` of
``mla_prefill_sm90_fp8`` forced, and the V^T pre-pass alone (part of every FP8 call of a
``v_transpose: prepass`` variant; the ``kernel`` ones make V^T themselves).
With ``--fa3-fp8``, also FlashAttention-3's FP8 forward on the same e4m3 operands (the peer that
``tools/fa3_fp8/build.py`` builds; its K with the rope expanded to every head, made once before
timing, as for the bf16 FA3 peer), checked like ours.
Medians of the block medians; TFLOP/s by the BENCHMARKS.md count. This module names the dense
family: it is that family's tool, above ``mlagen.measure``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ... import measure
from ...errors import MlagenError

FP8_SPEC = "mla_prefill_sm90_fp8"
FA3_FP8_LIBRARY = "fa3_fp8_C.so"


def fa3_fp8_op():
    """``torch.ops.fa3_fp8.fwd`` from the library ``tools/fa3_fp8/build.py`` builds: ``$FA3_FP8_SO``, else
    ``$FA3_FP8_BUILD/fa3_fp8_C.so``, else ``<repo>/out/fa3_fp8/fa3_fp8_C.so``."""
    import os
    from pathlib import Path

    import torch

    path = os.environ.get("FA3_FP8_SO") or str(
        Path(os.environ.get("FA3_FP8_BUILD") or Path(__file__).resolve().parents[3] / "out" / "fa3_fp8")
        / FA3_FP8_LIBRARY)
    if not os.path.exists(path):
        raise SystemExit(f"--fa3-fp8: {path} not found; build it on the GPU machine with: "
                         "python tools/fa3_fp8/build.py")
    torch.ops.load_library(path)
    return torch.ops.fa3_fp8.fwd


def fa3_fp8_call(op, shape, f8: dict):
    """A call of FA3's FP8 forward on mlagen's e4m3 inputs ``f8``, returning (out, lse [Tq, H]) like
    ours. K nope and the shared rope are joined per head once, here (as the bf16 FA3 peer does)."""
    import torch

    q, k, v, rope = f8["q"], f8["k"], f8["v"], f8["k_rope"]
    joined = torch.cat([k.view(torch.uint8), rope.view(torch.uint8).expand(-1, shape.heads, -1)], dim=-1)
    k_full = joined.contiguous().view(k.dtype)
    cu_q, cu_k = f8["cu_seqlens_q"], f8["cu_seqlens_k"]
    if cu_q is None:
        cu_q = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
        cu_k = torch.tensor([0, k.shape[0]], dtype=torch.int32, device=q.device)
    max_q, max_k = max(shape.q_lens), max(shape.k_lens)

    def fn():
        out, lse = op(q, k_full, v, cu_q, cu_k, max_q, max_k, shape.causal, None, f8["q_descale"],
                      f8["k_descale"], f8["v_descale"])
        return out, lse.transpose(0, 1)

    return fn


def _parse_variant(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variant {text!r}: expected NAME=VALUE[,NAME=VALUE...]")
        if key.strip() in out:
            raise SystemExit(f"--variant {text!r}: {key.strip()} is given twice; give each name once")
        out[key.strip()] = value.strip()
    return out


def bench_shape(sid: str, variants: list[dict], rounds: int, iters: int, flush, fa3_fp8=None) -> list[str]:
    import torch

    from ...dispatch import family_specs
    from .. import get as get_family
    from . import call as call_mod
    from . import entry
    from ...variant import make

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
    if fa3_fp8 is not None:
        cands["FA3 fp8 (varlen, peer)"] = fa3_fp8_call(fa3_fp8, shape, f8)
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
    c = call_mod.prepare(call_mod.DenseArgs(f8["q"], f8["k"], f8["v"], k_rope=f8["k_rope"],
                                            cu_seqlens_q=f8["cu_seqlens_q"], cu_seqlens_k=f8["cu_seqlens_k"]))
    # The pre-pass kernel is the same in every variant (it depends on d_v only): a pre-pass one's.
    _, sel = entry.select(c, make(spec, {"v_transpose": "prepass", "mask": mask}))
    cands["V^T pre-pass alone"] = lambda: tma.launch_transpose_v(sel, c, torch.cuda.current_stream().cuda_stream)
    for fn in cands.values():
        fn()
    torch.cuda.synchronize()
    blocks = {name: [] for name in cands}
    order = list(cands.items())
    for r in range(rounds):
        # Every other round in reverse, so no candidate always follows the same one (at the power
        # cap a block's clocks depend on the block before it).
        for name, fn in (order if r % 2 == 0 else order[::-1]):
            blocks[name].append(measure.median(measure.time_calls(fn, iters, flush)))
    flops = family.flops(shape)
    base = measure.median(blocks["bf16 (dispatched)"])
    for name, meds in blocks.items():
        t = measure.median(meds)
        lines.append(f"{sid} {name:48s} {t * 1e3:8.3f} ms {flops / t / 1e12:8.1f} TFLOP/s  {base / t:5.2f}x bf16  "
                     f"(round medians {min(meds) * 1e3:.3f}-{max(meds) * 1e3:.3f} ms)")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mlagen.families.mla_prefill.tools", description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="D1,D3", help="ids of BENCHMARKS.md (default D1,D3)")
    ap.add_argument("--variant", action="append", default=[], help=f"tunables of {FP8_SPEC} to force (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--fa3-fp8", action="store_true", help="also FlashAttention-3's FP8 forward (tools/fa3_fp8/build.py)")
    args = ap.parse_args(argv)
    import torch

    try:
        measure.require_gpu("the FP8 dense benchmark")
    except MlagenError as exc:
        print(f"mlagen.families.mla_prefill.tools: {exc}", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}; CUDA {torch.version.cuda}", flush=True)
    flush = measure.L2Flush(torch.device("cuda", torch.cuda.current_device()))
    variants = [_parse_variant(v) for v in args.variant]
    fa3 = fa3_fp8_op() if args.fa3_fp8 else None
    for sid in args.shapes.split(","):
        for line in bench_shape(sid.strip(), variants, args.rounds, args.iters, flush, fa3):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
