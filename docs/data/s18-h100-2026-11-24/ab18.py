"""Session 18: one-process A/B of the FP8 dense kernel against the committed one installed as
mla_prefill_sm90_fp8_base (tools/ab_install.py), on D1 / D3, several schedules; outputs compared
bit for bit, order reversed every other round, L2 flushed before each call."""
import sys

import torch

from mlagen import measure, spec, variant
from mlagen.families import get

fam = get("mla_prefill")
R = dict(consumers=3, order="none", block_n=96, swizzle_v=32, load_warps=1, consumer_regs=160, rescale="lazy",
         epilogue="direct", producer_regs=32, v_transpose="kernel")
SCHEDULES = {"D1rec": dict(R, pv_wait="late", diagonal="half", stages=2),
             "D3k": dict(R, pv_wait="early", diagonal="full", stages=3),
             "cl2": dict(cluster=2, scheduler="persistent", block_n=96, swizzle_v=32)}
flush = measure.L2Flush(torch.device("cuda", 0))
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
for sid in sys.argv[1].split(","):
    shape = fam.shapes()[sid]
    mask = "causal" if shape.causal else "none"
    f8 = fam.make_inputs(shape, "cuda", 0, dtype="fp8_e4m3")
    cands = {}
    for name, vals in SCHEDULES.items():
        outs = []
        for sp in ("mla_prefill_sm90_fp8", "mla_prefill_sm90_fp8_base"):
            v = variant.make(spec.load(sp), {**vals, "mask": mask})
            fn = (lambda v=v: fam.call(f8, variant=v))
            outs.append(fn())
            cands[f"{name} {'new' if sp.endswith('fp8') else 'base'}"] = fn
        torch.cuda.synchronize()
        same = torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        print(f"{sid} {name}: new == base bit for bit: {same}", flush=True)
    order = list(cands.items())
    times = {k: [] for k in cands}
    for r in range(rounds):
        for k, fn in (order if r % 2 == 0 else order[::-1]):
            times[k].append(measure.median(measure.time_calls(fn, 10, flush)) * 1e3)
    for name in SCHEDULES:
        a, b = measure.median(times[f"{name} new"]), measure.median(times[f"{name} base"])
        print(f"{sid} {name}: new {a:.3f} ms, base {b:.3f} ms, new/base speed {b / a:.3f}x "
              f"(new rounds {min(times[f'{name} new']):.3f}-{max(times[f'{name} new']):.3f})", flush=True)
