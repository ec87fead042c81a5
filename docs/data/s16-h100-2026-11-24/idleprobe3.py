"""Call p: the fifteenth session saw the idle-GPU loss grow with sq (0.09 / 0.32 / 0.79 ms at sq 1024 / 4096 /
12288). Call e explained S1's (sq 4096) as launch latency. Here sq 1024, 4096 and 12288 (H 128, topk 2048,
s_kv 8192), launch plans on: "warm" (right after another call) and "idle" (host sync + 5 ms sleep), each
call's event time, the kernel's own span (%globaltimer per CTA, idleprobe.patch) and the marker -> first CTA gap."""
import statistics as st, sys, time, torch, cupy as cp
from cuda.bindings import driver as d
import mlagen
from mlagen.families import mla_sparse_prefill as fam

marker = cp.RawModule(code=r'''
extern "C" __global__ void marker(unsigned long long* out) {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); out[0] = t;
}''', options=("-arch=sm_90a",)).get_function("marker")
mbuf = torch.zeros(1, dtype=torch.int64, device="cuda")
print(torch.cuda.get_device_name(), flush=True)
print(f"{'sq':>6s} {'mode':5s} {'event ms':>9s} {'span ms':>8s} {'marker->CTA us':>15s} {'host us':>8s}")
for sq in [int(a) for a in sys.argv[1:]] or [1024, 4096, 12288]:
    shape = fam.parse_shape(f"sq={sq},h=128,topk=2048,skv=8192")
    inp = fam.make_inputs(shape, "cuda", seed=0)
    kw = {"softmax_scale": inp["softmax_scale"], "attn_sink": inp["attn_sink"]}
    call = lambda: mlagen.mla_sparse_prefill(inp["q"], inp["kv"], inp["indices"], **kw)
    call(); call(); torch.cuda.synchronize()
    _, sel = fam.select(fam.prepare(inp["q"], inp["kv"], inp["indices"], **kw))
    err, dptr, size = d.cuModuleGetGlobal(sel.kernel.module, b"mlagen_probe")
    host = torch.empty(size // 8, dtype=torch.int64)
    n_cta = min(sq * 2, 16384)   # the probe keeps 16384 CTAs (slot = blockIdx % 16384): the last ones win
    res = {}
    for _ in range(5):
        for mode in ("warm", "idle"):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            if mode == "warm":
                call()
            else:
                torch.cuda.synchronize(); time.sleep(0.005)
            marker((1,), (1,), (mbuf.data_ptr(),))
            ev[0].record(); h0 = time.perf_counter(); call(); h1 = time.perf_counter(); ev[1].record()
            torch.cuda.synchronize()
            d.cuMemcpyDtoH(host.data_ptr(), dptr, size)
            rows = host.view(-1, 5)[:n_cta].tolist()
            first, last = min(r[2] for r in rows), max(r[3] for r in rows)
            m = int(mbuf.item())
            # with more than 16384 CTAs the first ones were overwritten: the span from the marker is exact
            # for the end, the first CTA's start is bounded by the marker gap of the sq <= 8192 runs
            res.setdefault(mode, []).append((ev[0].elapsed_time(ev[1]), (last - first) / 1e6, (first - m) / 1e3,
                                             (h1 - h0) * 1e6, (last - m) / 1e6))
    for mode, rs in res.items():
        c = [st.median(x) for x in zip(*rs)]
        print(f"{sq:6d} {mode:5s} {c[0]:9.3f} {c[1]:8.3f} {c[2]:15.1f} {c[3]:8.1f}   marker->last CTA end {c[4]:.3f} ms",
              flush=True)
    inp = None
    torch.cuda.empty_cache()
