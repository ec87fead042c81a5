"""Call e: call d found the 64-head kernel's own run (first CTA start to last CTA end, %globaltimer) the same
after an idle GPU as after a busy one, while the call's event time grew by 0.17-0.36 ms. Is the difference the
host's launch path, exposed when the GPU is idle as the start event is recorded? A marker kernel (cupy,
%globaltimer into a buffer) is enqueued just before the call: the gap from the marker to the first CTA's start
is the time the GPU waited for the launch. Modes: "idle" (host sync, 5 ms sleep) with launch plans on and off,
and "warm" (right after another call). Also the host's own time for the call (perf_counter around it)."""
import statistics as st, os, time, torch, cupy as cp
from cuda.bindings import driver as d
import mlagen
from mlagen.families import mla_sparse_prefill as fam

marker_mod = cp.RawModule(code=r'''
extern "C" __global__ void marker(unsigned long long* out) {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); out[0] = t;
}''', options=("-arch=sm_90a",))
marker = marker_mod.get_function("marker")
mbuf = torch.zeros(1, dtype=torch.int64, device="cuda")

shape = fam.parse_shape("S1")
inp = fam.make_inputs(shape, "cuda", seed=0)
kw = {"softmax_scale": inp["softmax_scale"], "attn_sink": inp["attn_sink"]}
call = lambda: mlagen.mla_sparse_prefill(inp["q"], inp["kv"], inp["indices"], **kw)
call(); call(); torch.cuda.synchronize()
_, sel = fam.select(fam.prepare(inp["q"], inp["kv"], inp["indices"], **kw))
err, dptr, size = d.cuModuleGetGlobal(sel.kernel.module, b"mlagen_probe")
host = torch.empty(size // 8, dtype=torch.int64)
n_cta = shape.sq * 2

def once(mode, plans):
    os.environ["MLAGEN_PLANS"] = plans
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    if mode == "warm":
        call()
    else:
        torch.cuda.synchronize(); time.sleep(0.005)
    marker((1,), (1,), (mbuf.data_ptr(),))
    ev[0].record()
    h0 = time.perf_counter(); call(); h1 = time.perf_counter()
    ev[1].record()
    torch.cuda.synchronize()
    d.cuMemcpyDtoH(host.data_ptr(), dptr, size)
    rows = host.view(-1, 5)[:n_cta].tolist()
    first, last = min(r[2] for r in rows), max(r[3] for r in rows)
    return ev[0].elapsed_time(ev[1]), (last - first) / 1e6, (first - int(mbuf.item())) / 1e3, (h1 - h0) * 1e6

print(torch.cuda.get_device_name(), flush=True)
print(f"{'mode':12s} {'event ms':>9s} {'span ms':>8s} {'marker->first CTA us':>21s} {'host us':>8s}")
res = {}
for rnd in range(5):
    for mode, plans in (("warm", "1"), ("idle", "1"), ("idle", "0"), ("warm", "0")):
        r = once(mode, plans)
        key = f"{mode} plans={plans}"
        res.setdefault(key, []).append(r)
        print(f"{key:12s} {r[0]:9.3f} {r[1]:8.3f} {r[2]:21.1f} {r[3]:8.1f}", flush=True)
print("medians:")
for key, rs in res.items():
    print(f"{key:12s} " + " ".join(f"{st.median(c):9.3f}" for c in zip(*rs)))
