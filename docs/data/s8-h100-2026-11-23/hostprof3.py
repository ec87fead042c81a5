"""entry.run's body with a timer per step (min over calls), to find where host time goes."""
import sys, time, torch
from collections import defaultdict
import mlagen
from mlagen.families import get as get_family
from mlagen.families.mla_prefill import entry, tma, record
from mlagen.families.mla_prefill.call import prepare
from mlagen.families.mla_prefill.pack import common_values, num_virtual_tiles
from mlagen.runtime import device_info

family = get_family("mla_prefill")
ns = time.perf_counter_ns


def timed_launch(sel, call, stream, acc):
    t = ns()
    p = tma._plan(sel, sel.env); t1 = ns(); acc["l.plan"].append(t1 - t); t = t1
    sw_q, sw_k, sw_v = p.swizzle
    values = common_values(call); t1 = ns(); acc["l.common"].append(t1 - t); t = t1
    values["tma_q"] = tma.tensor_map(call.q, sw_q // 2, p.block_m, sw_q, "q")
    values["tma_k"] = tma.tensor_map(call.k, sw_k // 2, p.kv_rows, sw_k, "k")
    values["tma_k_rope"] = tma.tensor_map(call.k_rope, sw_k // 2, p.kv_rows, sw_k, "k_rope")
    values["tma_v"] = tma.tensor_map(call.v, sw_v // 2, p.kv_rows, sw_v, "v")
    values["tma_o"] = tma.tensor_map(call.out, sw_q // 2, 64, sw_q, "out"); t1 = ns(); acc["l.maps"].append(t1 - t); t = t1
    s = p.schedule
    n_virtual = num_virtual_tiles(call, p.block_m * p.cluster)
    grid = s.grid(n_virtual * call.heads, device_info(call.q.device.index).sm_count if s.scheduler != "static" else 0)
    t1 = ns(); acc["l.grid"].append(t1 - t); t = t1
    counter = 0
    if s.scheduler == "dynamic":
        counter = torch.zeros(1, dtype=torch.int32, device=call.q.device).data_ptr()
    t1 = ns(); acc["l.zeros"].append(t1 - t); t = t1
    values["tile_counter"] = counter
    values["num_virtual_tiles"] = n_virtual
    values["head_group"] = tma.head_group(call, s.scheduler)
    values["rope_shared"] = int(call.k_rope.size(1) == 1)
    t1 = ns(); acc["l.misc"].append(t1 - t); t = t1
    packed = p.abi.pack(values); t1 = ns(); acc["l.pack"].append(t1 - t); t = t1
    sel.kernel.launch((grid, 1, 1), p.block, p.smem, stream, packed); t1 = ns(); acc["l.cuLaunch"].append(t1 - t)


for sid in sys.argv[1:]:
    shape = family.shapes().get(sid) or family.parse_shape(sid)
    inp = family.make_inputs(shape, "cuda", 0)
    q, k, v = inp["q"], inp["k"], inp["v"]
    kw = {n: inp[n] for n in ("k_rope", "cu_seqlens_q", "cu_seqlens_k") if n in inp}
    for _ in range(3):
        mlagen.mla_prefill(q, k, v, **kw)
    torch.cuda.synchronize()
    acc = defaultdict(list)
    for i in range(300):
        if i % 50 == 0:
            torch.cuda.synchronize()
        t0 = t = ns()
        call = prepare(q, k, v, **kw); t1 = ns(); acc["prepare"].append(t1 - t); t = t1
        record.note(call); t1 = ns(); acc["note"].append(t1 - t); t = t1
        call.tma_compatible(); t1 = ns(); acc["tma_check"].append(t1 - t); t = t1
        key = str(call.key); t1 = ns(); acc["key"].append(t1 - t); t = t1
        device, sel = entry.select(call); t1 = ns(); acc["select"].append(t1 - t); t = t1
        stream = torch.cuda.current_stream(device).cuda_stream; t1 = ns(); acc["stream"].append(t1 - t); t = t1
        same = device == torch.cuda.current_device(); t1 = ns(); acc["curdev"].append(t1 - t); t = t1
        timed_launch(sel, call, stream, acc); t1 = ns(); acc["launch"].append(t1 - t)
        acc["total"].append(t1 - t0)
        t = ns(); mlagen.mla_prefill(q, k, v, **kw); acc["public"].append(ns() - t)
    torch.cuda.synchronize()
    med = lambda xs: sorted(xs)[len(xs) // 2] / 1e3
    print(sid, " ".join(f"{k}={med(v):.1f}" for k, v in acc.items()), flush=True)
