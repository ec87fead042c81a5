"""Session 19: one-process comparison of variants of one spec on its shipped records for D1 / D3
(read from mlagen/tuned/h100.json), each record with a list of overrides; every candidate checked
against the reference, order reversed every other round, L2 flushed before each call, the bf16
record as dispatched timed alongside for the ratio. usage: abvar.py SPEC D1,D3 ROUNDS key=v[,key=v] ..."""
import json
import sys
from pathlib import Path

import torch

from mlagen import measure, spec, variant
from mlagen.families import get

fam = get("mla_prefill")
RECORDS = json.loads((Path(__file__).resolve().parents[3] / "mlagen/tuned/h100.json").read_text())["best"]
flush = measure.L2Flush(torch.device("cuda", 0))
sp_name, shapes, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
overrides = [{}] + [dict(kv.split("=", 1) for kv in a.split(",")) for a in sys.argv[4:]]
dtype = "fp8_e4m3" if sp_name.endswith("fp8") else "bf16"
for sid in shapes.split(","):
    shape = fam.shapes()[sid]
    mask = "causal" if shape.causal else "none"
    x = fam.make_inputs(shape, "cuda", 0, dtype=dtype) if dtype != "bf16" else fam.make_inputs(shape, "cuda", 0)
    bf = fam.make_inputs(shape, "cuda", 0)
    key = f"{mask}/h{shape.heads}/q{shape.q_lens[0]}/k{shape.k_lens[0]}"
    rec = next(r for r in RECORDS if r["spec"] == sp_name and r["problem"] == key)
    ref = fam.reference(shape, x, heads=2)
    cands = {"bf16 (dispatched)": lambda: fam.call(bf)}
    for o in overrides:
        conv = lambda v: int(v) if v.lstrip("-").isdigit() else {"True": True, "False": False}.get(v, v)
        vals = {**rec["variant"], **{k: conv(v) for k, v in o.items()}}
        v = variant.make(spec.load(sp_name), {**vals, "mask": mask})
        name = "record" + ("".join(f" {k}={x_}" for k, x_ in o.items()) if o else "")
        fn = (lambda v=v: fam.call(x, variant=v))
        got = fn()
        torch.cuda.synchronize()
        chk = fam.compare(got, ref, dtype=dtype)
        rel = float((got[0][:, :2].float() - ref[0]).double().norm() / ref[0].double().norm())
        lse = float((got[1][:, :2] - ref[1]).abs().max())
        print(f"{sid} {name}: {'ok' if chk.ok else 'WRONG: ' + str(chk.problem)}; out rel L2 {rel:.4f}, lse max abs {lse:.2e}",
              flush=True)
        if chk.ok:
            cands[name] = fn
    order = list(cands.items())
    times = {k: [] for k in cands}
    for r in range(rounds):
        for k, fn in (order if r % 2 == 0 else order[::-1]):
            times[k].append(measure.median(measure.time_calls(fn, 10, flush)) * 1e3)
    flops = fam.flops(shape)
    base = measure.median(times["record"])
    bfm = measure.median(times["bf16 (dispatched)"])
    for k, ts in times.items():
        t = measure.median(ts)
        print(f"{sid} {k}: {t:.3f} ms ({flops / t / 1e9:.0f} TFLOP/s) rounds {min(ts):.3f}-{max(ts):.3f}; "
              f"x record {base / t:.3f}; x bf16 {bfm / t:.3f}", flush=True)
