"""The sparse call's shape class names its KV pool's size, from the tensors' shapes at argument
checking (``call.prepare``: no device read), for a flat table, a strided pool of pages, a
``page_scales`` FP8 pool and two pools; a launch plan's hit computes no key."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import mlagen  # noqa: E402
from mlagen import operands  # noqa: E402
from mlagen.families.mla_sparse_prefill import call as sp_call, entry as sp_entry, reference as sp_ref  # noqa: E402


def _bf16(*shape):
    return torch.zeros(*shape, device="cuda", dtype=torch.bfloat16)


def _idx(sq, topk):
    return torch.zeros(sq, topk, device="cuda", dtype=torch.int32)


@pytest.mark.parametrize("kv, extra, key", [
    (lambda: _bf16(8192, 512), None, "d512/h64/k512/s8192/flat"),
    (lambda: _bf16(49152, 1, 512), None, "d512/h64/k512/s65536/flat"),
    (lambda: _bf16(300, 65, 512)[:, :64], None, "d512/h64/k512/s32768/paged"),            # 300 pages of 64
    (lambda: torch.zeros(3, operands.get("fp8_v4", 512).page_bytes(64), device="cuda", dtype=torch.uint8), None,
     "d512/h64/k512/s256/paged/fp8_v4"),
    (lambda: _bf16(2048, 64, 512), lambda: _bf16(32768, 512), "d512/h64/k1024/s262144/flat"),   # both pools' rows
    (lambda: _bf16(10, 65, 512)[:, :64], lambda: _bf16(100, 512), "d512/h64/k1024/s1024/paged"),
])
def test_a_prepared_call_keys_its_pool(kv, extra, key):
    q = _bf16(4, 64, 512)
    fmt = "fp8_v4" if "fp8_v4" in key else "bf16"
    more = {} if extra is None else {"extra_kv": extra(), "extra_indices": _idx(4, 512)}
    torch.cuda.synchronize()
    call = sp_call.prepare(q, kv(), _idx(4, 512), softmax_scale=0.1, kv_format=fmt, **more)
    assert str(call.key) == key


def test_a_plan_hit_computes_no_key(monkeypatch):
    args = sp_ref.make_inputs({"sq": 37, "heads": 64, "topk": 300, "s_kv": 1000}, "cuda", seed=7)
    monkeypatch.setenv("MLAGEN_PLANS", "1")
    mlagen.mla_sparse_prefill(**args)
    mlagen.mla_sparse_prefill(**args)   # the plan is kept after a full-path call
    keys = []
    real = sp_call.problem_key
    monkeypatch.setattr(sp_call, "problem_key", lambda c: keys.append(c) or real(c))
    hits = sp_entry._plans.hits
    mlagen.mla_sparse_prefill(**args)
    assert sp_entry._plans.hits == hits + 1 and keys == []
