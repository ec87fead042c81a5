"""Host time per call of the public calls with launch plans (MLAGEN_PLANS=1, the default) and
without (MLAGEN_PLANS=0, the full path every call), in one process, as mlagen bench measures it
(measure.host_time: fastest of 5 runs of 20 calls back to back after a sync, divided by 20), in five
interleaved rounds (plans, full path, peer), medians of the rounds;
then a profile of the plan path. Peers (FA3, FlashMLA) where built."""
import cProfile, io, os, pstats, sys
import torch
from mlagen import measure
from mlagen.families import get
from mlagen.families.mla_prefill import peers as dpeers
from mlagen.families.mla_sparse_prefill import peers as speers

dense, sparse = get("mla_prefill"), get("mla_sparse_prefill")
ids = sys.argv[1:] or ["D1", "D2", "D4", "D6", "D7", "S1", "S4", "S5", "sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32",
                       "sq=64,h=16,topk=256,skv=4096"]
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
print(f"{'shape':44s} {'plans us':>9s} {'full us':>9s} {'peer us':>9s}  peer")
profiled = {}
for sid in ids:
    fam, pmod, peer = (sparse, speers, speers.flashmla_peer) if sid.startswith("S") or "topk" in sid else \
        (dense, dpeers, dpeers.fa3_peer)
    shape = fam.parse_shape(sid)
    inputs = fam.make_inputs(shape, "cuda", seed=0)
    mine = pmod.mlagen_peer(shape, inputs)
    mine.fn(); mine.fn(); torch.cuda.synchronize()
    try:
        p = peer(shape, inputs)
        p.fn(); torch.cuda.synchronize()
        pname = peer.__name__
    except Exception as exc:  # not built
        p, pname = None, f"({type(exc).__name__})"
    res = {"1": [], "0": [], "peer": []}
    for _ in range(5):   # interleaved rounds: plans, full path, peer; medians of the rounds' figures
        for flag in ("1", "0"):
            os.environ["MLAGEN_PLANS"] = flag
            res[flag].append(measure.host_time(mine.fn, calls=20, reps=5))
        os.environ["MLAGEN_PLANS"] = "1"
        if p is not None:
            res["peer"].append(measure.host_time(p.fn, calls=20, reps=5))
    med = lambda xs: f"{sorted(xs)[len(xs) // 2] * 1e6:9.1f}" if xs else f"{'-':>9s}"
    print(f"{sid:44s} {med(res['1'])} {med(res['0'])} {med(res['peer'])}  {pname}", flush=True)
    if sid in ("D2", "S1", "S5"):
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20):
            for _ in range(20):
                mine.fn()
            torch.cuda.synchronize()
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
        profiled[sid] = s.getvalue()
    del inputs, mine
    torch.cuda.synchronize(); torch.cuda.empty_cache()
for sid, text in profiled.items():
    print(f"--- profile of the plan path, {sid} (400 calls) ---")
    print("\n".join(text.splitlines()[:32]))
