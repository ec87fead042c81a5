"""Host time of the public call and its pieces: min over reps of the mean of 100 calls."""
import sys, time, torch
import mlagen
from mlagen.families import get as get_family
from mlagen.families.mla_prefill import entry, tma
from mlagen.families.mla_prefill.call import prepare
from mlagen.families.mla_prefill.pack import common_values

family = get_family("mla_prefill")


def host(f, n=100, reps=7):
    best = 1e9
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    torch.cuda.synchronize()
    return f"{best * 1e6:6.1f}"


for sid in sys.argv[1:]:
    shape = family.shapes().get(sid) or family.parse_shape(sid)
    inp = family.make_inputs(shape, "cuda", 0)
    q, k, v = inp["q"], inp["k"], inp["v"]
    kw = {n: inp[n] for n in ("k_rope", "cu_seqlens_q", "cu_seqlens_k") if n in inp}
    for _ in range(3):
        mlagen.mla_prefill(q, k, v, **kw)
    call = prepare(q, k, v, **kw)
    dev, sel = entry.select(call)
    stream = torch.cuda.current_stream().cuda_stream
    p = tma._plan(sel, sel.env)
    row = {
        "public": host(lambda: mlagen.mla_prefill(q, k, v, **kw)),
        "entry.run": host(lambda: entry.run(q, k, v, **kw)),
        "prepare": host(lambda: prepare(q, k, v, **kw)),
        "select": host(lambda: entry.select(call)),
        "tma.launch": host(lambda: tma.launch(sel, call, sel.env, stream)),
        "5 maps": host(lambda: [tma.tensor_map(call.q, 64, 128, 128, "q") for _ in range(5)]),
        "common": host(lambda: common_values(call)),
        "zeros": host(lambda: torch.zeros(1, dtype=torch.int32, device=q.device)),
        "empty x2": host(lambda: (torch.empty((call.total_q, call.heads, 128), dtype=torch.bfloat16, device=q.device),
                                  torch.empty((call.total_q, call.heads), dtype=torch.float32, device=q.device))),
        "stream": host(lambda: torch.cuda.current_stream(0).cuda_stream),
        "capturing": host(lambda: torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()),
    }
    print(sid, sel.variant.symbol[-60:], " ".join(f"{k}={v}" for k, v in row.items()), flush=True)
