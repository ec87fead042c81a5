"""Session 19: one-process A/B of the dense sm90 kernels (bf16 and FP8) against the committed ones
installed as <spec>_base (tools/ab_install.py), each on its shipped record for D1 / D3 (read from
mlagen/tuned/h100.json); outputs compared bit for bit, order reversed every other round, L2 flushed
before each call. usage: ab19.py D1,D3 [rounds]"""
import json
import sys
from pathlib import Path

import torch

from mlagen import measure, spec, variant
from mlagen.families import get

fam = get("mla_prefill")
RECORDS = json.loads((Path(__file__).resolve().parents[3] / "mlagen/tuned/h100.json").read_text())["best"]
flush = measure.L2Flush(torch.device("cuda", 0))
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
for sid in sys.argv[1].split(","):
    shape = fam.shapes()[sid]
    mask = "causal" if shape.causal else "none"
    cands, kinds = {}, []
    for sp, dtype in (("mla_prefill_sm90", "bf16"), ("mla_prefill_sm90_fp8", "fp8_e4m3")):
        inputs = fam.make_inputs(shape, "cuda", 0, dtype=dtype) if dtype != "bf16" else fam.make_inputs(shape, "cuda", 0)
        rec = next(r for r in RECORDS if r["spec"] == sp and r["problem"] == f"{mask}/h{shape.heads}/q{shape.q_lens[0]}/k{shape.k_lens[0]}")
        outs = []
        for name in (sp, sp + "_base"):
            v = variant.make(spec.load(name), {**rec["variant"], "mask": mask})
            fn = (lambda v=v, x=inputs: fam.call(x, variant=v))
            outs.append(fn())
            cands[f"{dtype} {'base' if name.endswith('_base') else 'new'}"] = fn
        torch.cuda.synchronize()
        same = torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        print(f"{sid} {dtype} record {rec['symbol']}: new == base bit for bit: {same}", flush=True)
        kinds.append(dtype)
    order = list(cands.items())
    times = {k: [] for k in cands}
    for r in range(rounds):
        for k, fn in (order if r % 2 == 0 else order[::-1]):
            times[k].append(measure.median(measure.time_calls(fn, 10, flush)) * 1e3)
    flops = fam.flops(shape)
    for dt in kinds:
        a, b = measure.median(times[f"{dt} new"]), measure.median(times[f"{dt} base"])
        print(f"{sid} {dt}: new {a:.3f} ms ({flops / a / 1e9:.0f} TFLOP/s), base {b:.3f} ms, new/base speed {b / a:.3f}x "
              f"(new rounds {min(times[f'{dt} new']):.3f}-{max(times[f'{dt} new']):.3f}, "
              f"base {min(times[f'{dt} base']):.3f}-{max(times[f'{dt} base']):.3f})", flush=True)
    n8, nb = measure.median(times["fp8_e4m3 new"]), measure.median(times["bf16 new"])
    b8, bb = measure.median(times["fp8_e4m3 base"]), measure.median(times["bf16 base"])
    print(f"{sid} fp8 / bf16 speed: new {nb / n8:.3f}x, base {bb / b8:.3f}x", flush=True)
