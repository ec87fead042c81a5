"""Where the event-timed call spends its time: per call, the kernels of the call (torch profiler,
CUDA activity) and the gaps between them, for FA3 and the public mla_prefill call, bench protocol
(L2 flush before each call). Also the host time per call (enqueue rate, GPU busy)."""
import sys, time, torch
from torch.profiler import profile, ProfilerActivity
from mlagen import measure
from mlagen.families import get as get_family
from mlagen.families.mla_prefill.peers import fa3_peer

family = get_family("mla_prefill")
for sid in sys.argv[1:]:
    shape = family.shapes().get(sid) or family.parse_shape(sid)
    inp = family.make_inputs(shape, "cuda", 0)
    flush = measure.L2Flush(torch.device("cuda", 0))
    cands = {"fa3": fa3_peer(shape, inp).fn, "mlagen": lambda: family.call(inp)}
    for name, fn in cands.items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        ev = measure.median(measure.time_calls(fn, 20, flush))
        # host time per call with the GPU kept busy (a long flush queue ahead)
        for _ in range(20):
            flush()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        host = (time.perf_counter() - t0) / 20
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                flush(); fn()
            torch.cuda.synchronize()
        evs = sorted([e for e in prof.events() if e.device_type.name == "CUDA"], key=lambda e: e.time_range.start)
        # the last call: kernels after the last flush (the fill of 256 MiB)
        kern = [(e.name[:60], e.time_range.start, e.time_range.end) for e in evs]
        big = [i for i, k in enumerate(kern) if (k[2] - k[1]) > 50 and ("fill" in k[0].lower() or "elementwise" in k[0].lower())]
        last = kern[big[-1]:]
        t_first = last[0][2]
        desc = []
        prev = t_first
        for n, s, e in last[1:]:
            desc.append(f"gap {s - prev:.1f} us, {n} {e - s:.1f} us")
            prev = e
        print(f"{sid} {name}: events {ev*1e6:.1f} us; host {host*1e6:.1f} us/call; after flush: " + "; ".join(desc), flush=True)
