"""The sparse call's host path with a timer per step (median over calls): where do its 120-200 us go?"""
import sys, time, math, torch
from collections import defaultdict
import mlagen
from mlagen.families import mla_sparse_prefill as fam
from mlagen.families.mla_sparse_prefill import op
from mlagen.runtime import current_stream

ns = time.perf_counter_ns
for sid in sys.argv[1:] or ["S1"]:
    shape = fam.parse_shape(sid)
    inp = fam.make_inputs(shape, "cuda", seed=0)
    q, kv, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
    for _ in range(3):
        mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink)
    torch.cuda.synchronize()
    acc = defaultdict(list)
    for i in range(200):
        if i % 20 == 0:
            torch.cuda.synchronize()
        t0 = t = ns()
        op._tracing(q); t1 = ns(); acc["tracing?"].append(t1 - t); t = t1
        call = fam.prepare(q, kv, idx, softmax_scale=sc, attn_sink=sink); t1 = ns(); acc["prepare"].append(t1 - t); t = t1
        device, sel = fam.select(call); t1 = ns(); acc["select"].append(t1 - t); t = t1
        stream = current_stream(torch, device); t1 = ns(); acc["stream"].append(t1 - t); t = t1
        same = device == torch.cuda.current_device(); t1 = ns(); acc["curdev"].append(t1 - t); t = t1
        g = fam.grid(sel, call); t1 = ns(); acc["grid"].append(t1 - t); t = t1
        packed = fam.pack(call); t1 = ns(); acc["pack"].append(t1 - t); t = t1
        res = sel.resources
        sel.kernel.launch(g, (res.threads, 1, 1), res.smem_bytes, stream, packed); t1 = ns(); acc["cuLaunch"].append(t1 - t)
        acc["total"].append(t1 - t0)
        t = ns(); mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink); acc["public"].append(ns() - t)
        t = ns(); mlagen.flash_mla_sparse_fwd(q, kv, idx, sc, 512, sink); acc["flashmla_api"].append(ns() - t)
    torch.cuda.synchronize()
    med = lambda xs: sorted(xs)[len(xs) // 2] / 1e3
    print(sid, " ".join(f"{k}={med(v):.1f}" for k, v in acc.items()), flush=True)
    # prepare's parts
    import cProfile, pstats, io
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        fam.prepare(q, kv, idx, softmax_scale=sc, attn_sink=sink)
    pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[:4000])
    del inp, q, kv, idx
    torch.cuda.empty_cache()
