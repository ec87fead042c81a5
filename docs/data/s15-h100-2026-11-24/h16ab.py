"""Call h: the H <= 16 kernel with split slot fills (every producer warp issues its 8 rows of every slot)
against the default (warps take slots in turn), under the bench protocol (L2 flushed before each call,
no host sync between calls), interleaved rounds in one process, FlashMLA padded to 64 heads beside;
outputs compared bit for bit first. Shapes: S5, S5 at H = 8, S5 with d_qk 512 (no FlashMLA).
Needs h-split-fill.patch (the `fill` tunable; not kept on main: no gain, h-ab.log)."""
import sys, time, torch
import mlagen
from mlagen import measure, spec as spec_mod, variant
from mlagen.families import mla_sparse_prefill as fam
from mlagen.families.mla_sparse_prefill.peers import FLASHMLA

def h16(d_qk, **o):
    return variant.make(spec_mod.load("mla_sparse_prefill_sm90_h16"), dict(o, d_qk=d_qk, paged=False, kv_format="bf16"))
peer = FLASHMLA.load().sparse_fwd if FLASHMLA.status()[0] else None
flush = measure.L2Flush("cuda")
print(f"{time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()} torch {torch.__version__}", flush=True)
for text in sys.argv[1:] or ["S5", "sq=4096,h=8,topk=2048,skv=32768", "sq=4096,h=16,topk=2048,skv=32768,d=512"]:
    shape = fam.parse_shape(text)
    inp = fam.make_inputs(shape, "cuda", seed=0)
    q, kv, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
    g = 4 if shape.d_qk == 512 else 6
    cands = {"default (fill warp)": h16(shape.d_qk, qk_group=g), "fill split": h16(shape.d_qk, qk_group=g, fill="split"),
             "fill split, 2 producers": h16(shape.d_qk, qk_group=g, fill="split", producers=2),
             "fill split, 5 -> 4 slots": h16(shape.d_qk, qk_group=g, fill="split", slots=4)}
    fns = {k: (lambda v=v: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink, kernel=v))
           for k, v in cands.items()}
    fns["dispatched"] = lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink)
    if peer is not None and shape.d_qk == 576:
        qp = torch.zeros((q.shape[0], 64, 576), dtype=q.dtype, device="cuda"); qp[:, :shape.heads] = q
        sp = torch.zeros(64, device="cuda"); sp[:shape.heads] = sink
        fns["flashmla padded"] = lambda: peer(qp, kv.view(-1, 1, 576), idx, sc, 512, sp, None)
    ref = fns["default (fill warp)"]()
    for k in cands:
        got = fns[k]()
        same = all(torch.equal(a, b) for a, b in zip(got, ref))
        print(f"{shape.id} {k}: {'bit-identical to the default' if same else 'DIFFERS from the default'}", flush=True)
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    blocks = {k: [] for k in fns}
    for _ in range(7):
        for k, f in fns.items():
            blocks[k].append(measure.median(measure.time_calls(f, 8, flush)))
    fl = fam.flops(shape.sq, shape.heads, shape.topk)
    base = measure.median(blocks["default (fill warp)"])
    for k, b in blocks.items():
        t = measure.median(b)
        extra = f"  ours/flashmla {measure.median(blocks['flashmla padded']) / t:.3f}x" if "flashmla padded" in blocks else ""
        print(f"{shape.id:40s} {k:26s} {t * 1e3:7.3f} ms {fl / t / 1e12:6.1f} TFLOP/s {base / t:6.3f}x default"
              f" (rounds {min(b) * 1e3:.3f}-{max(b) * 1e3:.3f}){extra}", flush=True)
