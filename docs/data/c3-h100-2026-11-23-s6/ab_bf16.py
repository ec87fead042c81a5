"""bf16 dense: FA3, the dispatched record and forced variants of mla_prefill_sm90, interleaved rounds,
L2 flushed, CUDA events (the BENCHMARKS.md protocol). Usage: ab_bf16.py SHAPE 'k=v,...' ['k=v,...' ...]"""
import sys, torch
from mlagen import measure
from mlagen.dispatch import family_specs
from mlagen.families import get as get_family
from mlagen.families.mla_prefill.peers import fa3_peer
from mlagen.variant import make

sid, variants = sys.argv[1], sys.argv[2:]
family = get_family("mla_prefill")
spec = next(s for s in family_specs("mla_prefill") if s.name == "mla_prefill_sm90")
shape = family.shapes().get(sid) or family.parse_shape(sid)
mask = "causal" if shape.causal else "none"
inp = family.make_inputs(shape, "cuda", 0)
flush = measure.L2Flush(torch.device("cuda", 0))
cands = {"fa3": fa3_peer(shape, inp).fn, "dispatched": lambda: family.call(inp)}
ref = family.reference(shape, inp, heads=2)
for text in variants:
    vals = dict(item.split("=") for item in text.split(","))
    v = make(spec, {**vals, "mask": mask})
    got = family.call(inp, variant=v); torch.cuda.synchronize()
    ok = family.compare(got, ref)
    print(f"{sid} {v.symbol}: {'ok' if ok.ok else 'WRONG'}", flush=True)
    if ok.ok:
        cands[v.symbol[len('mla_prefill_sm90_'):]] = (lambda v=v: family.call(inp, variant=v))
for fn in cands.values():
    fn()
torch.cuda.synchronize()
blocks = {n: [] for n in cands}
for _ in range(4):
    for n, fn in cands.items():
        blocks[n].append(measure.median(measure.time_calls(fn, 30, flush)))
flops = family.flops(shape)
fa3 = measure.median(blocks["fa3"])
for n, meds in blocks.items():
    t = measure.median(meds)
    print(f"{sid} {n:110s} {t*1e3:7.3f} ms {flops/t/1e12:6.1f} TFLOP/s {fa3/t:5.3f}x fa3 (rounds {min(meds)*1e3:.3f}-{max(meds)*1e3:.3f})", flush=True)
