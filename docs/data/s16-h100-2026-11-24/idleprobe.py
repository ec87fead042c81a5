"""Call d: why do our sparse kernels run 11-19% slower after the GPU idled (fifteenth session)? The 64-head
kernel with idleprobe.patch applied records, per CTA, clock64 and %globaltimer at its start and at the end of
consumer 0 (and %smid). Three modes, S1: "warm" (the call right after another call), "spin" (right after a
2 ms spin kernel), "idle" (after a host sync and 5 ms of sleep). Per mode: the call's event time, the CTAs'
effective SM clock (clock64 ticks per ns), their median duration, and the span from the first CTA's start
to the last one's end."""
import statistics as st, time, torch
from cuda.bindings import driver as d
import mlagen
from mlagen.families import mla_sparse_prefill as fam

shape = fam.parse_shape("S1")
inp = fam.make_inputs(shape, "cuda", seed=0)
kw = {"softmax_scale": inp["softmax_scale"], "attn_sink": inp["attn_sink"]}
call = lambda: mlagen.mla_sparse_prefill(inp["q"], inp["kv"], inp["indices"], **kw)
call(); torch.cuda.synchronize()
_, sel = fam.select(fam.prepare(inp["q"], inp["kv"], inp["indices"], **kw))
err, dptr, size = d.cuModuleGetGlobal(sel.kernel.module, b"mlagen_probe")
assert int(err) == 0, err
host = torch.empty(size // 8, dtype=torch.int64)
n_cta = shape.sq * 2
spin = int(2e-3 * 1.98e9)

def read():
    torch.cuda.synchronize()
    (e,) = d.cuMemcpyDtoH(host.data_ptr(), dptr, size)
    assert int(e) == 0
    return host.view(-1, 5)[:n_cta].tolist()

def once(mode):
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
    if mode == "warm":
        call()
    elif mode == "spin":
        torch.cuda._sleep(spin)
    else:
        torch.cuda.synchronize(); time.sleep(0.005)
    ev[0].record(); call(); ev[1].record()
    rows = read()
    ms = ev[0].elapsed_time(ev[1])
    mhz = [(c1 - c0) / (t1 - t0) * 1e3 for c0, c1, t0, t1, _ in rows if t1 > t0]
    dur = [(t1 - t0) / 1e3 for c0, c1, t0, t1, _ in rows]
    span = (max(r[3] for r in rows) - min(r[2] for r in rows)) / 1e6
    # the first and the last tenth of the CTAs by start time: does the clock move during the call?
    order = sorted(rows, key=lambda r: r[2])
    tenth = max(1, len(order) // 10)
    f = lambda rs: st.median((c1 - c0) / (t1 - t0) * 1e3 for c0, c1, t0, t1, _ in rs if t1 > t0)
    return ms, st.median(mhz), min(mhz), max(mhz), st.median(dur), span, f(order[:tenth]), f(order[-tenth:])

print(torch.cuda.get_device_name(), sel.variant.symbol, flush=True)
print(f"{'mode':6s} {'event ms':>9s} {'MHz med':>8s} {'min':>6s} {'max':>6s} {'CTA us':>7s} {'span ms':>8s} {'MHz first 10%':>14s} {'last 10%':>9s}")
res = {}
for rnd in range(4):
    for mode in ("warm", "spin", "idle"):
        for _ in range(2):
            r = once(mode)
            res.setdefault(mode, []).append(r)
            print(f"{mode:6s} {r[0]:9.3f} {r[1]:8.0f} {r[2]:6.0f} {r[3]:6.0f} {r[4]:7.1f} {r[5]:8.3f} {r[6]:14.0f} {r[7]:9.0f}", flush=True)
print("medians by mode:")
for mode, rs in res.items():
    cols = list(zip(*rs))
    print(f"{mode:6s} " + " ".join(f"{st.median(c):9.3f}" for c in cols))
