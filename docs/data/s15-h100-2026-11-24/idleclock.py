"""Call e: is the H <= 16 kernel's loss after an idle GPU (call c) the clock? S5, our kernel and FlashMLA
padded, each timed call preceded (after a host sync and 2 ms of host sleep) by nothing ("idle"), a 2 ms
torch.cuda._sleep spin ("spin"), 2 ms of bf16 GEMMs ("gemm"), or the same call ("warm"); nvidia-smi samples
the SM clock and power every 10 ms meanwhile (e-clocks.csv), and each mode's clocks are summarised."""
import subprocess, time, os, torch
import mlagen
from mlagen.families import mla_sparse_prefill as fam
from mlagen.families.mla_sparse_prefill.peers import FLASHMLA

out = os.environ.get("OUT", "/tmp")
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw", "--format=csv,noheader",
                        "-lms", "10"], stdout=open(os.path.join(out, "e-clocks.csv"), "w"))
shape = fam.parse_shape("S5")
inp = fam.make_inputs(shape, "cuda", seed=0)
q, kv, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
fns = {"ours": lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink)}
if FLASHMLA.status()[0]:
    peer = FLASHMLA.load().sparse_fwd
    qp = torch.zeros((q.shape[0], 64, 576), dtype=q.dtype, device="cuda"); qp[:, :16] = q
    sp = torch.zeros(64, device="cuda"); sp[:16] = sink
    fns["flashmla_pad64"] = lambda: peer(qp, kv.view(-1, 1, 576), idx, sc, 512, sp, None)
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
def gemm():
    for _ in range(8):
        a @ a
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
spin_cycles = int(2e-3 * 1.755e9)
modes = {"idle": lambda: None, "spin": lambda: torch.cuda._sleep(spin_cycles), "gemm": gemm}
for f in fns.values():
    f()
gemm(); torch.cuda.synchronize()
t0 = time.time(); gemm(); torch.cuda.synchronize(); print(f"gemm block {1e3 * (time.time() - t0):.2f} ms")
res, spans = {}, []
for rnd in range(4):
    for k, f in fns.items():
        for m, pre in [*modes.items(), ("warm", f)]:
            s = time.time()
            for _ in range(10):
                torch.cuda.synchronize(); time.sleep(0.002)
                pre()
                ev[0].record(); f(); ev[1].record(); torch.cuda.synchronize()
                res.setdefault((k, m), []).append(ev[0].elapsed_time(ev[1]))
            spans.append((k, m, s, time.time()))
time.sleep(0.05); smi.terminate(); smi.wait()
print(f"{'kernel':16s}" + "".join(f"{m:>12s}" for m in [*modes, "warm"]))
for k in fns:
    print(f"{k:16s}" + "".join(f"{sorted(res[(k, m)])[len(res[(k, m)]) // 2]:9.3f} ms" for m in [*modes, "warm"]))
# clocks per mode (samples inside each mode's span)
import datetime
rows = []
for line in open(os.path.join(out, "e-clocks.csv")):
    parts = [p.strip() for p in line.split(",")]
    try:
        ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        rows.append((ts, float(parts[1].split()[0]), float(parts[3].split()[0])))
    except (ValueError, IndexError):
        pass
off = 0.0  # nvidia-smi prints local time; compare against time.time() in the same zone
for k in fns:
    for m in [*modes, "warm"]:
        smp = [(c, p) for ts, c, p in rows for (kk, mm, s, e) in spans if kk == k and mm == m and s <= ts + off <= e]
        if smp:
            cs = sorted(c for c, _ in smp); ps = sorted(p for _, p in smp)
            print(f"clocks {k:16s} {m:6s}: SM MHz median {cs[len(cs) // 2]:.0f} (min {cs[0]:.0f}, max {cs[-1]:.0f}), "
                  f"power median {ps[len(ps) // 2]:.0f} W, {len(smp)} samples")
