"""Call f: what a planned call's host time is made of, each part timed alone in a loop (median of 7 runs of
2000 calls), on the S1 and D2 inputs; then the public calls themselves."""
import statistics as st, time, torch
import mlagen
from mlagen import knobs, plans
from mlagen.families import get
from mlagen.families.mla_prefill import plan as dplan
from mlagen.families.mla_sparse_prefill import op as sop
from mlagen.runtime import current_stream

sp, dn = get("mla_sparse_prefill"), get("mla_prefill")
si = sp.make_inputs(sp.parse_shape("S1"), "cuda", seed=0)
di = dn.make_inputs(dn.parse_shape("D2"), "cuda", seed=0)
q, kv, idx, sink = si["q"], si["kv"], si["indices"], si["attn_sink"]
dev = q.device

def t(fn, n=2000):
    runs = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return st.median(runs)

call_s = lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=si["softmax_scale"], attn_sink=sink)
call_d = lambda: mlagen.mla_prefill(di["q"], di["k"], di["v"], k_rope=di["k_rope"], cu_seqlens_q=di["cu_seqlens_q"],
                                    cu_seqlens_k=di["cu_seqlens_k"])
call_s(); call_d(); torch.cuda.synchronize()
parts = {
    "torch.empty [4096,128,512] bf16": lambda: torch.empty((4096, 128, 512), dtype=torch.bfloat16, device=dev),
    "torch.empty [4096,128] f32": lambda: torch.empty((4096, 128), dtype=torch.float32, device=dev),
    "q.new_empty [4096,128,512]": lambda: q.new_empty((4096, 128, 512)),
    "tensor_sig(q)": lambda: plans.tensor_sig(q, torch.Tensor),
    "q.shape, q.stride(), q.dtype": lambda: (q.shape, q.stride(), q.dtype),
    "q.data_ptr()": lambda: q.data_ptr(),
    "knobs.call_state()": knobs.call_state,
    "torch.cuda.current_device()": torch.cuda.current_device,
    "current_stream": lambda: current_stream(torch, 0),
    "op._tracing(q)": lambda: sop._tracing(q),
    "sparse signature": lambda: sp._signature(torch, q, kv, idx, si["softmax_scale"], None, sink, 512, None, None,
                                              None, None, "bf16", "bf16"),
    "dense signature": lambda: dplan.signature(torch, di["q"], di["k"], di["v"], di["k_rope"], di["cu_seqlens_q"],
                                               di["cu_seqlens_k"], True, None, None, None, None, None, None, None,
                                               None, None, None),
}
print(torch.cuda.get_device_name(), flush=True)
for name, fn in parts.items():
    print(f"{name:36s} {t(fn):7.2f} us", flush=True)
for name, fn in (("public sparse call (S1, plan)", call_s), ("public dense call (D2, plan)", call_d)):
    runs = []
    for _ in range(7):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        runs.append((time.perf_counter() - t0) / 20 * 1e6)
    print(f"{name:36s} {min(runs):7.2f} us (fastest of 7 x 20)", flush=True)
