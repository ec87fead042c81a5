"""Call k: why `mlagen bench` gave S5 1.05x FlashMLA padded (call j) where calls c and h gave 1.11-1.14x.
S5 blocks of 20 calls (measure.time_calls: L2 flushed before each, no host sync inside a block), ours and
FlashMLA padded alternating, 4 rounds: first on a cool GPU, then right after ~15 s of S1 at the power cap
(FlashMLA and ours alternating, as bench had just run), then again after 20 s idle. Per block: the median
and the first call's time (the call after the host's gap between blocks); nvidia-smi clocks between."""
import subprocess, time, torch
import mlagen
from mlagen import measure
from mlagen.families import mla_sparse_prefill as fam
from mlagen.families.mla_sparse_prefill.peers import FLASHMLA

peer = FLASHMLA.load().sparse_fwd
flush = measure.L2Flush("cuda")
def smi():
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()
def prep(text):
    shape = fam.parse_shape(text)
    inp = fam.make_inputs(shape, "cuda", seed=0)
    q, kv, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
    qp, sp = q, sink
    if shape.heads not in (64, 128):
        qp = torch.zeros((q.shape[0], 64, 576), dtype=q.dtype, device="cuda"); qp[:, :shape.heads] = q
        sp = torch.zeros(64, device="cuda"); sp[:shape.heads] = sink
    return shape, {"ours": lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink),
                   "flashmla": lambda: peer(qp, kv.view(-1, 1, 576), idx, sc, 512, sp, None)}
s5, f5 = prep("S5")
s1, f1 = prep("S1")
for f in [*f5.values(), *f1.values()]:
    f()
torch.cuda.synchronize()
fl = fam.flops(s5.sq, s5.heads, s5.topk)
def s5_rounds(label):
    med = {k: [] for k in f5}
    first = {k: [] for k in f5}
    for _ in range(4):
        for k, f in f5.items():
            t = measure.time_calls(f, 20, flush)
            med[k].append(measure.median(t)); first[k].append(t[0])
    m = {k: measure.median(v) for k, v in med.items()}
    print(f"{label}: ours {m['ours'] * 1e3:.3f} ms ({fl / m['ours'] / 1e12:.1f} TF), flashmla {m['flashmla'] * 1e3:.3f} ms, "
          f"ratio {m['flashmla'] / m['ours']:.3f}x; first call of a block: ours {measure.median(first['ours']) * 1e3:.3f}, "
          f"flashmla {measure.median(first['flashmla']) * 1e3:.3f} ms; smi after: {smi()}", flush=True)
print(f"{time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()}; smi at start: {smi()}", flush=True)
s5_rounds("cool")
t0 = time.time()
while time.time() - t0 < 15:
    for k, f in f1.items():
        measure.time_calls(f, 10, flush)
print(f"after 15 s of S1: smi {smi()}", flush=True)
s5_rounds("hot (right after S1)")
time.sleep(20)
s5_rounds("after 20 s idle")
