"""Tile order A/B: FA3, the public call with the head group the launcher picks, and the same call with
Usage: ab_order.py SHAPE G [G ...] [symbol[:k=v,...] ...]   (G: an integer; 'auto' is always run)"""
import os, sys, torch
from mlagen import measure
from mlagen.dispatch import family_specs
from mlagen.families import get as get_family
from mlagen.families.mla_prefill.peers import fa3_peer
from mlagen.variant import from_symbol, make

sid, args = sys.argv[1], sys.argv[2:]
family = get_family("mla_prefill")
specs = {s.name: s for s in family_specs("mla_prefill")}
shape = family.shapes().get(sid) or family.parse_shape(sid)
inp = family.make_inputs(shape, "cuda", 0)
flush = measure.L2Flush(torch.device("cuda", 0))
ref = family.reference(shape, inp, heads=2)


def with_group(g, fn):
    def run():
        if g is None:
            os.environ.pop("MLAGEN_HEAD_GROUP", None)
        else:
            os.environ["MLAGEN_HEAD_GROUP"] = str(g)
        return fn()
    return run


cands = {"fa3": with_group(None, fa3_peer(shape, inp).fn)}
cands["auto"] = with_group(None, lambda: family.call(inp))
for a in args:
    if a.isdigit():
        cands[f"g{a}"] = with_group(int(a), lambda: family.call(inp))
        continue
    sym, _, over = a.partition(":")
    spec = specs[sym.split("_causal_")[0].split("_none_")[0]]
    v = from_symbol(spec, sym)
    if over:
        v = make(spec, {**dict(v.values), **dict(kv.split("=") for kv in over.split(","))})
    for g in (None, 1):
        os.environ.pop("MLAGEN_HEAD_GROUP", None) if g is None else os.environ.__setitem__("MLAGEN_HEAD_GROUP", "1")
        got = family.call(inp, variant=v); torch.cuda.synchronize()
        ok = family.compare(got, ref)
        print(f"{sid} {v.symbol} g={g or 'auto'}: {'ok' if ok.ok else 'WRONG'}", flush=True)
        if ok.ok:
            name = v.symbol.split("_", 3)[-1] + ("" if g is None else " g1")
            cands[name] = with_group(g, lambda v=v: family.call(inp, variant=v))
for name, fn in list(cands.items()):
    out = fn(); torch.cuda.synchronize()
    if name != "fa3":
        ok = family.compare(out, ref)
        if not ok.ok:
            print(f"{sid} {name}: WRONG", flush=True)
            del cands[name]
os.environ.pop("MLAGEN_HEAD_GROUP", None)
blocks = {n: [] for n in cands}
for _ in range(4):
    for n, fn in cands.items():
        blocks[n].append(measure.median(measure.time_calls(fn, 30, flush)))
flops = family.flops(shape)
fa3 = measure.median(blocks["fa3"])
for n, meds in blocks.items():
    t = measure.median(meds)
    print(f"{sid} {n:100s} {t*1e3:7.3f} ms {flops/t/1e12:6.1f} TFLOP/s {fa3/t:5.3f}x fa3 (rounds {min(meds)*1e3:.3f}-{max(meds)*1e3:.3f})", flush=True)
