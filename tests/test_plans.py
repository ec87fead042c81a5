"""mlagen.plans: a launch plan writes exactly what a full pack would, and signatures tell apart
every argument the checks read (the GPU side: tests/gpu/test_op_gpu.py, "plan")."""

from __future__ import annotations

import threading

import pytest
import torch

from mlagen import knobs, plans
from mlagen.families.mla_prefill.params import TMA_PARAMS
from mlagen.families.mla_sparse_prefill.params import params_for


class RecordingKernel:
    """Stands in for a loaded kernel: keeps the bytes of every parameter buffer it is given."""

    def __init__(self):
        self.launches = []

    def launch(self, grid, block, smem, stream, params):
        self.launches.append((grid, block, smem, stream, bytes(params.data)))


def _values(ps, seed: int) -> dict:
    out = {}
    for i, f in enumerate(ps.fields):
        if f.kind == "tensormap":
            out[f.name] = bytes((seed + i + j) % 256 for j in range(128))
        elif f.kind == "float":
            out[f.name] = 0.5 * (seed + i)
        else:
            out[f.name] = 1000 * seed + 16 * i
    return out


@pytest.mark.parametrize("ps, variable", [
    (params_for("bf16"), ("q", "kv", "indices", "topk_length", "attn_sink", "out", "max_logits", "lse", "extra_kv",
                          "extra_indices", "extra_topk_length")),
    (TMA_PARAMS, ("tma_q", "tma_k", "tma_k_rope", "tma_v", "tma_o", "tile_counter", "out", "lse", "cu_seqlens_q",
                  "cu_seqlens_k", "attn_sink")),
])
def test_a_plan_writes_what_a_full_pack_writes(ps, variable):
    kernel = RecordingKernel()
    first = _values(ps, 1)
    plan = plans.LaunchPlan(kernel, (7, 1, 1), (384, 1, 1), 1000, ps, first, variable)
    for seed in (2, 3):   # later calls: new pointers and maps, the rest as at the first call
        values = {**first, **{n: _values(ps, seed)[n] for n in variable}}
        plan.launch(99, [values[n] for n in variable])
        assert kernel.launches[-1] == ((7, 1, 1), (384, 1, 1), 1000, 99, bytes(ps.pack(values).data))


def test_each_thread_writes_its_own_buffer():
    ps = params_for("bf16")
    kernel = RecordingKernel()
    plan = plans.LaunchPlan(kernel, (1, 1, 1), (32, 1, 1), 0, ps, _values(ps, 1),
                            ("q", "kv", "indices", "topk_length", "attn_sink", "out", "max_logits", "lse", "extra_kv",
                             "extra_indices", "extra_topk_length"))
    buffers = []
    for _ in range(2):
        t = threading.Thread(target=lambda: buffers.append(plan._buffer()))
        t.start()
        t.join()
    assert buffers[0] is not buffers[1]


def test_only_pointers_and_maps_vary_and_every_pointer_does():
    ps = params_for("bf16")
    every = ("q", "kv", "indices", "topk_length", "attn_sink", "out", "max_logits", "lse", "extra_kv",
             "extra_indices", "extra_topk_length")
    with pytest.raises(ValueError, match="only pointers and tensor maps"):
        plans.LaunchPlan(RecordingKernel(), (1, 1, 1), (32, 1, 1), 0, ps, _values(ps, 1), every + ("topk",))
    with pytest.raises(ValueError, match=r"pointer fields \['out'\] must be written per call"):
        plans.LaunchPlan(RecordingKernel(), (1, 1, 1), (32, 1, 1), 0, ps, _values(ps, 1),
                         tuple(n for n in every if n != "out"))


def test_the_families_write_every_pointer_per_call():
    from mlagen.families.mla_prefill import entry as dense_entry
    from mlagen.families.mla_prefill.params import ABIS, VT_PARAMS
    from mlagen.families.mla_sparse_prefill.entry import _POINTERS
    from mlagen.families.mla_sparse_prefill.params import params_tma_for

    pairs = [(ABIS["simt"], dense_entry._SIMT_VARIABLE), (ABIS["tma"], dense_entry._TMA_VARIABLE),
             (ABIS["tma_fp8"], dense_entry._FP8_VARIABLE), (VT_PARAMS, dense_entry._VT_VARIABLE),
             (params_for("fp8_v32"), _POINTERS), (params_tma_for("bf16"), _POINTERS + ("kv_map", "extra_kv_map"))]
    for ps, variable in pairs:
        plans.LaunchPlan(RecordingKernel(), (1, 1, 1), (32, 1, 1), 0, ps, _values(ps, 1), variable)


def test_signatures_tell_apart_what_the_checks_read():
    t = torch.Tensor
    x = torch.zeros(8, 4, 64)
    sig = plans.tensor_sig(x, t)
    assert plans.tensor_sig(torch.zeros(8, 4, 64), t) == sig                     # same layout, other data
    assert plans.tensor_sig(x.to(torch.bfloat16), t) != sig                      # dtype
    assert plans.tensor_sig(torch.zeros(8, 4, 32), t) != sig                     # shape
    assert plans.tensor_sig(torch.zeros(4, 8, 64).transpose(0, 1), t) != sig     # strides
    assert plans.tensor_sig(torch.zeros(8 * 4 * 64 + 1)[1:].view(8, 4, 64), t) != sig  # base alignment
    assert plans.tensor_sig(None, t) is None
    with pytest.raises(plans.NoPlan):
        plans.tensor_sig(torch.nn.Parameter(x), t)   # a subclass: the full path decides
    assert len({plans.scalar_sig(v) for v in (1, 1.0, True, "1", None)}) == 5
    with pytest.raises(plans.NoPlan):
        plans.scalar_sig(torch.tensor(1.0))


def test_a_signature_of_values_tells_tensors_scalars_and_none_apart():
    t = torch.Tensor
    x = torch.zeros(8, 4, 64)
    sig = plans.values_sig((x, None, True, 0.5), t)
    assert sig == (plans.tensor_sig(x, t), None, plans.scalar_sig(True), plans.scalar_sig(0.5))
    assert plans.values_sig((torch.zeros(8, 4, 64), None, True, 0.5), t) == sig    # other data, same layout
    variants = [(None, None, True, 0.5), (x, x, True, 0.5), (x, None, 1, 0.5), (x, None, True, None),
                (x, 0.0, True, 0.5), (x.half(), None, True, 0.5)]
    assert len({plans.values_sig(v, t) for v in variants} | {sig}) == len(variants) + 1
    assert plans.values_sig(((-1, -1),), t) == ((tuple, (plans.scalar_sig(-1),) * 2),)   # a window_size pair
    assert plans.values_sig(((-1, -1),), t) != plans.values_sig(((-1, 0),), t)
    for bad in (torch.nn.Parameter(x), [x], object()):   # the full path says what is wrong with them
        with pytest.raises(plans.NoPlan):
            plans.values_sig((x, bad), t)


def test_plans_knob(monkeypatch):
    monkeypatch.delenv("MLAGEN_PLANS", raising=False)
    monkeypatch.delenv("MLAGEN_FAMILY", raising=False)
    assert knobs.plans() and knobs.call_state() is not None
    state = knobs.call_state()
    monkeypatch.setenv("MLAGEN_FAMILY", "mla_prefill_sm80")
    assert knobs.call_state() != state   # a knob a call reads changes the signature
    for off in ("0", "OFF", " false ", "no"):   # every spelling MLAGEN_PLANS reads as off
        monkeypatch.setenv("MLAGEN_PLANS", off)
        assert not knobs.plans() and knobs.call_state() is None
    for on in ("1", "", "yes", "On"):
        monkeypatch.setenv("MLAGEN_PLANS", on)
        assert knobs.plans() and knobs.call_state() is not None
    monkeypatch.setenv("MLAGEN_PLANS", "2")
    with pytest.raises(ValueError, match="MLAGEN_PLANS"):
        knobs.call_state()


def test_cache_is_bounded():
    cache = plans.PlanCache(limit=3)
    for i in range(5):
        cache.put(i, object())
    assert len(cache) <= 3 and cache.get(4) is not None
