"""The FP8 cache's staging into bf16 (mlagen/families/mla_sparse_prefill/staging.py) without a GPU:
its kernels compile for every format and CUDA target without spills, its parameter struct is laid
out as C lays it out, and the call takes the staged path exactly when dispatch picks the kernel for
an FP8 cache computed in bf16. The kernels' results are checked on the GPU
(tests/gpu/test_sparse_fp8_gpu.py: bit for bit the in-kernel conversion and the bf16 kernel on the
dequantized copy, both routes, graph capture)."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

from mlagen import operands
from mlagen.compiler import for_target
from mlagen.families.mla_sparse_prefill import staging
from tests.test_abi import as_ctypes

FORMATS = [n for n in operands.NAMES if operands.get(n).quantized]


def test_the_staging_params_match_the_c_layout():
    c = as_ctypes(staging.PARAMS)
    assert [(f.name, off) for f, off in staging.PARAMS.layout] == [(n, getattr(c, n).offset) for n, _ in c._fields_]
    assert staging.PARAMS.size == ctypes.sizeof(c)


# Every target a sparse bf16 spec runs on (the sm80 spec's: sm_80, 86, 89, 90a, 100a): the default FP8 call stages there.
@pytest.mark.parametrize("target", ["sm_90a", "sm_80", "sm_86", "sm_89", "sm_100a"])
@pytest.mark.parametrize("name", FORMATS)
def test_the_staging_kernels_compile_without_spills(name, target):
    fmt = operands.get(name)
    src = staging.source(fmt)
    for entry in ("", "_mark", "_rows", "_remap"):
        assert f'extern "C" __global__ void __launch_bounds__(256) {src.symbol}{entry}(' in src.text
    binary = for_target(target).compile(src, target)
    assert not binary.resources.spills, binary.log
    # the format's layout is in the source, not a literal of V3.2's
    assert f"kScaleBlock = {fmt.scale_block};" in src.text and f"kRopeOffset = {fmt.rope_offset};" in src.text


def _call(**kw):
    base = dict(kv_format="fp8_v32", d_qk=576, num_kv=8192, sq=4096, topk=2048)
    return SimpleNamespace(**{**base, **kw})


def test_the_workspace_bound_and_the_budget(monkeypatch):
    import mlagen.runtime as runtime

    monkeypatch.setattr(runtime, "vendor", lambda: "cuda")
    monkeypatch.delenv("MLAGEN_FAMILY", raising=False)
    monkeypatch.delenv("MLAGEN_STAGING_MB", raising=False)
    s1 = _call()                                       # S1: 8192 rows under 8 M references: converted whole
    assert staging.whole_pool(s1) and staging.workspace_bytes(s1) == 8192 * 1152
    big = _call(num_kv=1 << 20)                        # a serving pool: compacted, bounded by the pool's rows
    assert not staging.whole_pool(big)
    assert staging.workspace_bytes(big) == (1 << 20) * 1152 + 4 * (2 * (1 << 20) + (1 << 20) + 4096 * 2048)
    assert staging.applies(s1, None) and not staging.applies(big, None)    # 1.2 GiB > the 512 MiB default
    monkeypatch.setenv("MLAGEN_STAGING_MB", "2048")
    assert staging.applies(big, None)
    monkeypatch.setenv("MLAGEN_STAGING_MB", "0")
    assert not staging.applies(s1, None)
    monkeypatch.setenv("MLAGEN_STAGING_MB", "lots")
    with pytest.raises(ValueError, match="MLAGEN_STAGING_MB='lots': expected a whole number"):
        staging.applies(s1, None)


@pytest.mark.parametrize("call, kernel, staged", [
    (_call(), None, True),
    (_call(), "mla_sparse_prefill_sm90", False),          # a kernel named: it converts in the kernel
    (_call(kv_format="bf16"), None, False),               # nothing to stage
], ids=["default", "named", "bf16"])
def test_which_calls_are_staged(monkeypatch, call, kernel, staged):
    import mlagen.runtime as runtime

    monkeypatch.setattr(runtime, "vendor", lambda: "cuda")
    monkeypatch.delenv("MLAGEN_FAMILY", raising=False)
    monkeypatch.delenv("MLAGEN_STAGING_MB", raising=False)
    assert staging.applies(call, kernel) is staged
    monkeypatch.setenv("MLAGEN_FAMILY", "mla_sparse_prefill_sm90")   # a spec forced by the environment
    assert staging.applies(call, kernel) is False
    monkeypatch.delenv("MLAGEN_FAMILY")
    monkeypatch.setattr(runtime, "vendor", lambda: "hip")
    assert staging.applies(call, kernel) is False
