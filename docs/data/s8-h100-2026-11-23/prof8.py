"""One call per candidate inside cudaProfilerStart/Stop, for ncu --profile-from-start off.
Usage: prof8.py SHAPE CAND...; CAND = fa3 | label[=K=V;K=V][@symbol[:k=v,...]] (as ab_env.py)."""
import os, sys, torch
from mlagen.dispatch import family_specs
from mlagen.families import get as get_family
from mlagen.families.mla_prefill.peers import fa3_peer
from mlagen.variant import from_symbol, make

sid, args = sys.argv[1], sys.argv[2:]
family = get_family("mla_prefill")
specs = {s.name: s for s in family_specs("mla_prefill")}
shape = family.shapes().get(sid) or family.parse_shape(sid)
inp = family.make_inputs(shape, "cuda", 0)
KEYS = ("MLAGEN_TILE_DEAL", "MLAGEN_HEAD_GROUP")
for a in args:
    for k in KEYS:
        os.environ.pop(k, None)
    if a == "fa3":
        fn = fa3_peer(shape, inp).fn
    else:
        a, _, sym = a.partition("@")
        label, _, envs = a.partition("=")
        os.environ.update(dict(kv.split("=", 1) for kv in envs.split(";") if kv))
        kw = {}
        if sym:
            sym, _, over = sym.partition(":")
            spec = specs[sym.split("_causal_")[0].split("_none_")[0]]
            v = from_symbol(spec, sym)
            if over:
                v = make(spec, {**dict(v.values), **dict(kv.split("=") for kv in over.split(","))})
            kw = {"variant": v}
        fn = lambda kw=kw: family.call(inp, **kw)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(sid, a, flush=True)
