"""Call c: what makes the H <= 16 kernel 16-20% slower after an L2 flush (call b), on S5. Modes:
bench (measure.time_calls: flush before each call, no host sync between calls: the bench protocol),
flush-sync (host sync, flush, call), warm (host sync, untimed call, timed call), other (host sync,
flush, the same kernel on other inputs of the shape, timed call), sleep (host sync, 2 ms host sleep,
timed call; no flush), flush+qi (host sync, flush, Q and indices read once, timed call)."""
import sys, time, torch
import mlagen
from mlagen import measure
from mlagen.families import mla_sparse_prefill as fam
from mlagen.families.mla_sparse_prefill.peers import FLASHMLA

shape = fam.parse_shape(sys.argv[1] if len(sys.argv) > 1 else "S5")
inp = fam.make_inputs(shape, "cuda", seed=0)
alt = fam.make_inputs(shape, "cuda", seed=1)
q, kv, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
print(f"{torch.cuda.get_device_name()} torch {torch.__version__} {time.strftime('%Y-%m-%d %H:%M')} {shape}", flush=True)
peer = FLASHMLA.load().sparse_fwd if FLASHMLA.status()[0] else None
def pad(t):
    qp = torch.zeros((t["q"].shape[0], 64, 576), dtype=t["q"].dtype, device="cuda"); qp[:, :t["q"].shape[1]] = t["q"]
    sp = torch.zeros(64, device="cuda"); sp[:t["q"].shape[1]] = t["attn_sink"]
    return qp, sp
fns, others = {}, {}
fns["ours"] = lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink)
others["ours"] = lambda: mlagen.mla_sparse_prefill(alt["q"], alt["kv"], alt["indices"], softmax_scale=sc,
                                                   attn_sink=alt["attn_sink"])
if peer is not None:
    qp, sp = pad(inp); qa, sa = pad(alt)
    fns["flashmla_pad64"] = lambda: peer(qp, kv.view(-1, 1, 576), idx, sc, 512, sp, None)
    others["flashmla_pad64"] = lambda: peer(qa, alt["kv"].view(-1, 1, 576), alt["indices"], sc, 512, sa, None)
flush = measure.L2Flush("cuda")
qbuf, ibuf = torch.empty_like(q), torch.empty_like(idx)
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
def one(fn, pre):
    torch.cuda.synchronize()
    pre()
    ev[0].record(); fn(); ev[1].record()
    torch.cuda.synchronize()
    return ev[0].elapsed_time(ev[1])
res = {}
for f in [*fns.values(), *others.values()]:
    f()
for rnd in range(4):
    for k, f in fns.items():
        res.setdefault((k, "bench"), []).extend(1e3 * t for t in measure.time_calls(f, 10, flush))
        for m, pre in {"flush-sync": flush, "warm": f, "other": lambda: (flush(), others[k]()),
                       "sleep": lambda: time.sleep(0.002), "flush+qi": lambda: (flush(), qbuf.copy_(q), ibuf.copy_(idx))}.items():
            for _ in range(8):
                res.setdefault((k, m), []).append(one(f, pre))
fl = fam.flops(shape.sq, shape.heads, shape.topk)
modes = ["bench", "flush-sync", "warm", "other", "sleep", "flush+qi"]
print(f"{'kernel':16s}" + "".join(f"{m:>20s}" for m in modes))
med = {}
for k in fns:
    row = f"{k:16s}"
    for m in modes:
        v = sorted(res[(k, m)]); med[(k, m)] = v[len(v) // 2]
        row += f"{med[(k, m)]:9.3f} ms {fl / med[(k, m)] / 1e9:4.0f} TF"
    print(row, flush=True)
if peer is not None:
    print("ours / flashmla:" + "".join(f" {m} {med[('flashmla_pad64', m)] / med[('ours', m)]:.3f}x" for m in modes))
