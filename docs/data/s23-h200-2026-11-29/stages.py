"""Session 23: the staging alone (staging.stage on a prepared call, no attention kernel), each route, L2 flushed
before each call, median of 20 calls; then the same per launch with CUDA events (one call)."""
import sys

import torch

from mlagen import measure
from mlagen.families import mla_sparse_prefill as fam
from mlagen.families.mla_sparse_prefill import staging

sys.path.insert(0, "docs/data/s23-h200-2026-11-29")
from routes import case  # noqa: E402

flush = measure.L2Flush("cuda")
DEFAULT_FRACTION = staging.WHOLE_POOL_FRACTION
for name in sys.argv[1:] or ["S1", "S3", "big"]:
    inp = case(name)
    call = fam.prepare(inp["q"], inp["kv"], inp["indices"], softmax_scale=inp["softmax_scale"],
                       attn_sink=inp["attn_sink"], kv_format="fp8_v32")
    res = {}
    for route, fraction in (("whole", 0), ("compacted", 10**9)):
        staging.WHOLE_POOL_FRACTION = fraction
        res[route] = measure.median(measure.time_calls(lambda: staging.stage(call), 20, flush)) * 1e3
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                flush()
                staging.stage(call)
            torch.cuda.synchronize()
        kern = [(e.key, e.device_time_total / e.count / 1e3, e.count) for e in prof.key_averages()
                if e.device_time_total > 0 and "zero" not in e.key.lower() or "kv_stage" in e.key]
        print(f"  {name} {route}: " + "; ".join(f"{k[:60]} {t:.3f} ms x{c}" for k, t, c in kern), flush=True)
    staging.WHOLE_POOL_FRACTION = DEFAULT_FRACTION
    print(f"{name}: pool {call.num_kv} rows, refs {call.sq * call.topk}: staging alone " +
          ", ".join(f"{k} {v:.3f} ms" for k, v in res.items()), flush=True)
    inp = call = None
    torch.cuda.empty_cache()
