"""Session 21: one-process A/B of tunable overrides on the shipped sparse FP8-cache record
(bf16 compute mode, fp8_v32 pages of 64, UE8M0 scales), as call b's short tune suggested
(gather_fence 0, late_fence 1: 1.02x in its final rounds). Interleaved rounds (order reversed
every other round), L2 flushed before each call, outputs compared bit for bit with the record's;
the public call and the bf16 kernel on the dequantized copy in the same rounds.
usage: sab.py S1,S3 ROUNDS key=v[,key=v] ...   (--compile: build the candidates only)"""
import dataclasses
import json
import sys
from pathlib import Path

from mlagen import operands, spec, variant
from mlagen.families import get

fam = get("mla_sparse_prefill")
ROOT = Path(__file__).resolve().parents[3]
REC = next(r for r in json.loads((ROOT / "mlagen/tuned/h100.json").read_text())["best"]
           if r["spec"] == "mla_sparse_prefill_sm90" and r["problem"].endswith("fp8_v32"))
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
S = spec.load("mla_sparse_prefill_sm90")


def conv(v):
    return int(v) if v.lstrip("-").isdigit() else {"True": True, "False": False}.get(v, v)


def candidates(paged):
    base = {**REC["variant"], "d_qk": 576, "paged": paged, "kv_format": "fp8_v32"}
    out = [("record", variant.make(S, base))]
    for a in ARGS[2:]:
        out.append((a, variant.make(S, {**base, **{k: conv(v) for k, v in (kv.split("=", 1) for kv in a.split(","))}})))
    return out


def bench(sid, rounds, torch, mlagen, measure, flush):
    fmt = operands.get("fp8_v32")
    shape = dataclasses.replace(fam.parse_shape(sid), kv_format=fmt.name)
    inp = fam.make_inputs(shape, "cuda", seed=0)
    q, cache, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
    cache = operands.quantize(operands.dequantize(cache, fmt), fmt, scale_fmt="ue8m0").view(cache.shape)
    copy = operands.dequantize(cache, fmt, round_bf16=True)
    cands = candidates(not cache.is_contiguous())   # a contiguous pool of pages is read as flat rows
    print(f"{sid}: cache {tuple(cache.shape)}; record {cands[0][1].symbol}", flush=True)
    fns = {"public call": lambda: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=sc, attn_sink=sink,
                                                            kv_format=fmt.name)}
    for name, v in cands:
        fns[name] = (lambda v=v: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=sc, attn_sink=sink,
                                                           kv_format=fmt.name, kernel=v))
    fns["bf16 copy"] = lambda: mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=sc, attn_sink=sink)
    outs = {k: f()[0] for k, f in fns.items()}
    torch.cuda.synchronize()
    same = {k: torch.equal(o, outs["record"]) for k, o in outs.items()}
    times = {k: [] for k in fns}
    for r in range(rounds):
        order = list(fns.items()) if r % 2 == 0 else list(reversed(fns.items()))
        for k, f in order:
            times[k].append(measure.median(measure.time_calls(f, 10, flush)) * 1e3)
    med = {k: measure.median(v) for k, v in times.items()}
    fl = fam.flops(shape.sq, shape.heads, shape.topk)
    for k in fns:
        ratios = [a / b for a, b in zip(times["record"], times[k])]
        print(f"{sid} {k:40s} {med[k]:7.3f} ms {fl / med[k] / 1e9:6.1f} TFLOP/s  x record {med['record'] / med[k]:.3f} "
              f"(rounds {min(ratios):.3f}-{max(ratios):.3f})  x bf16 copy {med['bf16 copy'] / med[k]:.3f}  "
              f"same as record: {same[k]}", flush=True)


def main():
    if "--compile" in sys.argv:
        from mlagen.build import build_many
        for r in build_many([v for p in (False, True) for _, v in candidates(p)], ["sm_90a"]):
            print(r.variant.symbol, r.status, r.binary.resources if r.binary else "", *r.reasons, flush=True)
        return
    import torch

    import mlagen
    from mlagen import measure

    flush = measure.L2Flush("cuda")
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for sid in ARGS[0].split(","):
        bench(sid, int(ARGS[1]), torch, mlagen, measure, flush)


if __name__ == "__main__":
    main()
