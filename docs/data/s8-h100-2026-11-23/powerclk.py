"""Blocks of 200 calls, FA3 and the public mla_prefill call alternating, with wall-clock stamps, so
an nvidia-smi trace taken beside it (-lms 20) gives each peer's SM clock and power while it runs."""
import json, sys, time, torch
from mlagen import measure
from mlagen.families import get as get_family
from mlagen.families.mla_prefill.peers import fa3_peer

family = get_family("mla_prefill")
out = []
for sid in sys.argv[1:]:
    shape = family.shapes().get(sid) or family.parse_shape(sid)
    inp = family.make_inputs(shape, "cuda", 0)
    flush = measure.L2Flush(torch.device("cuda", 0))
    cands = {"fa3": fa3_peer(shape, inp).fn, "mlagen": lambda: family.call(inp)}
    for fn in cands.values():
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    for rnd in range(6):
        for name, fn in cands.items():
            t0 = time.time()
            ts = measure.time_calls(fn, 200, flush)
            t1 = time.time()
            out.append({"shape": sid, "peer": name, "round": rnd, "t0": t0, "t1": t1, "median_s": measure.median(ts),
                        "tflops": family.flops(shape) / measure.median(ts) / 1e12})
            print(sid, name, rnd, f"{out[-1]['tflops']:.1f}", flush=True)
json.dump(out, open(sys.argv[0].replace("powerclk.py", "blocks.json") if False else "/tmp/blocks.json", "w"))
