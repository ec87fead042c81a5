"""Same-process A/B of the public call under environment settings (and kernels) against FA3.
Usage: ab_env.py SHAPE CAND [CAND ...]; CAND = label[=K=V;K=V][@symbol[:k=v,...]]
(K: an environment variable, e.g. MLAGEN_TILE_DEAL; the symbol replaces the launcher's choice).
AB_DTYPE=fp8_e4m3 runs FP8 inputs (ratios then against the first candidate; FA3 is bf16 only)."""
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
dtype = os.environ.get("AB_DTYPE", "bf16")
inp = family.make_inputs(shape, "cuda", 0, dtype=dtype)
flush = measure.L2Flush(torch.device("cuda", 0))
ref = family.reference(shape, inp, heads=2)
fp8 = dtype != "bf16"
KEYS = ("MLAGEN_TILE_DEAL", "MLAGEN_HEAD_GROUP")


def under(env, fn):
    def run():
        for k in KEYS:
            os.environ.pop(k, None)
        os.environ.update(env)
        return fn()
    return run


cands = {} if fp8 else {"fa3": under({}, fa3_peer(shape, inp).fn)}
cands["auto"] = under({}, lambda: family.call(inp))
for a in args:
    a, _, sym = a.partition("@")
    label, _, envs = a.partition("=")
    env = dict(kv.split("=", 1) for kv in envs.split(";") if kv)
    kw = {}
    if sym:
        sym, _, over = sym.partition(":")
        spec = specs[sym.split("_causal_")[0].split("_none_")[0]]
        v = from_symbol(spec, sym)
        if over:
            v = make(spec, {**dict(v.values), **dict(kv.split("=") for kv in over.split(","))})
        kw = {"variant": v}
        label = f"{label} {v.symbol.split('_', 3)[-1]}"
    cands[label] = under(env, lambda kw=kw: family.call(inp, **kw))
for name, fn in list(cands.items()):
    out = fn(); torch.cuda.synchronize()
    if name != "fa3":
        ok = family.compare(out, ref, dtype=dtype) if fp8 else family.compare(out, ref)
        if not ok.ok:
            print(f"{sid} {name}: WRONG", flush=True)
            del cands[name]
blocks = {n: [] for n in cands}
for _ in range(5):
    for n, fn in cands.items():
        blocks[n].append(measure.median(measure.time_calls(fn, 30, flush)))
for k in KEYS:
    os.environ.pop(k, None)
flops = family.flops(shape)
fa3 = measure.median(blocks["fa3" if not fp8 else next(iter(blocks))])
for n, meds in blocks.items():
    t = measure.median(meds)
    print(f"{sid} {n:60s} {t*1e3:7.3f} ms {flops/t/1e12:6.1f} TFLOP/s {fa3/t:5.3f}x fa3 (rounds {min(meds)*1e3:.3f}-{max(meds)*1e3:.3f})", flush=True)
