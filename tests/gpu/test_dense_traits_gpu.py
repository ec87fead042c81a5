"""Dense MLA prefill's traits on the GPU (MLA.md section 1b): head geometries, masks (window,
chunked), softcap and attention sinks, against the float32 reference.

Every case draws fresh random inputs, poisons ``out`` and ``lse`` with NaN, runs the public call
(``mlagen.mla_prefill``, which dispatches the sm_90a kernel of the traits) and compares every
head with the reference; rows whose mask leaves no key must give out = 0 and lse = +inf. The
cases are chosen to compile few kernels (one per geometry x mask x score combination used,
about 15): odd lengths (1, tiles not filled, empty sequences, ragged batches, prefixes and
Lq > Lk), head counts 1, 5, 8, 16, 64, 128, windows narrower and wider than a key tile, chunks
that are no multiple of it.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen.families.mla_prefill.entry import mla_prefill_kernel  # noqa: E402
from mlagen.families.mla_prefill.problem import GEOMETRIES, Shape  # noqa: E402
from mlagen.families.mla_prefill.reference import REL_TOL, compare, make_inputs, reference_heads  # noqa: E402
from mlagen.runtime import device_info  # noqa: E402


def _hopper() -> bool:
    return torch.cuda.is_available() and device_info(torch.cuda.current_device()).target.name == "sm_90a"


needs_sm90 = pytest.mark.skipif(not _hopper(), reason="needs an sm_90a GPU (H100 / H200): the traits run on the sm90 kernel")

# Ragged batches: lengths 1, unfilled tiles, an empty sequence, prefixes (Lk > Lq) and Lq > Lk.
RAGGED_Q = (1, 77, 0, 300, 129, 200)
RAGGED_K = (1, 90, 5, 333, 129, 150)


def _run(shape: Shape, seed: int = 0, per_head_rope: bool = False, fold_rope: bool = False):
    inputs = make_inputs(shape, "cuda", seed)
    if per_head_rope and inputs["k_rope"] is not None:
        inputs["k_rope"] = torch.randn(inputs["k"].shape[0], shape.heads, inputs["k_rope"].shape[2],
                                       device="cuda").to(torch.bfloat16)
    d_v = shape.dims[2]
    out = torch.full((shape.total_q, shape.heads, d_v), math.nan, dtype=torch.bfloat16, device="cuda")
    lse = torch.full((shape.total_q, shape.heads), math.nan, dtype=torch.float32, device="cuda")
    k, k_rope = inputs["k"], inputs["k_rope"]
    if fold_rope and k_rope is not None:   # k holds nope and rope (no k_rope argument)
        k, k_rope = torch.cat([k, k_rope.expand(-1, shape.heads, -1)], dim=-1), None
    traits = {n: inputs[n] for n in ("window_size", "chunk_size", "softcap", "attn_sink") if n in inputs}
    mlagen.mla_prefill(inputs["q"], k, inputs["v"], k_rope=k_rope, cu_seqlens_q=inputs["cu_seqlens_q"],
                       cu_seqlens_k=inputs["cu_seqlens_k"], causal=shape.causal, out=out, lse=lse, **traits)
    torch.cuda.synchronize()
    inputs["k_rope"] = k_rope if not fold_rope else None
    if fold_rope:
        inputs["k"] = k
    ref_out, ref_lse = reference_heads(shape, inputs, heads=None)
    check = compare(out, lse, ref_out, ref_lse, rel_tol=REL_TOL)
    assert check.problem is None, f"{shape.description}: {check.problem}"
    empty = torch.isinf(ref_lse)
    assert bool((out[empty] == 0).all()), f"{shape.description}: rows that see no key must be 0"
    return out, lse, ref_lse


def _shape(q, k, heads, geometry="n128r64v128", causal=True, window=(-1, -1), chunk=0, softcap=0.0, sink=False):
    q, k = (q,) if isinstance(q, int) else q, (k,) if isinstance(k, int) else k
    return Shape("t", tuple(q), tuple(k), heads, causal, geometry, window, chunk, softcap, sink)


@needs_sm90
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
@pytest.mark.parametrize("causal", [True, False])
def test_geometries_on_ragged_batches(geometry, causal):
    _run(_shape(RAGGED_Q, RAGGED_K, 5, geometry, causal))


@needs_sm90
@pytest.mark.parametrize("geometry", ["n192r64v256", "n128r64v128"])
def test_rope_layouts(geometry):
    """Shared rope [Tk, 1, d_rope], per-head rope [Tk, H, d_rope] and rope folded into k."""
    shape = _shape((130, 1), (260, 64), 8, geometry)
    _run(shape, per_head_rope=True)
    _run(shape, fold_rope=True)


@needs_sm90
@pytest.mark.parametrize("heads", [1, 16, 64, 128])
def test_glm5_heads(heads):
    _run(_shape(333 if heads <= 16 else 129, 333 if heads <= 16 else 200, heads, "n192r64v256"))


@needs_sm90
@pytest.mark.parametrize("window", [(0, 0), (5, 0), (200, 0), (33, 17), (-1, 40), (300, -1), (1, 1000)])
@pytest.mark.parametrize("geometry", ["n128r64v128", "n192r64v256"])
def test_windows_narrower_and_wider_than_a_tile(window, geometry):
    out, lse, ref_lse = _run(_shape(RAGGED_Q, RAGGED_K, 5, geometry, False, window))
    if window == (0, 0):   # every row sees its own key only, where it exists
        assert bool(torch.isfinite(ref_lse).any())


@needs_sm90
def test_window_long_sequence_and_no_rope():
    """Many key tiles skipped below the window; the geometry without a rope part."""
    _run(_shape(3000, 3000, 2, "n128r64v128", False, (500, 0)))
    _run(_shape(RAGGED_Q, RAGGED_K, 8, "n128r0v128", False, (40, 3)))
    _run(_shape(RAGGED_Q, RAGGED_K, 8, "n128r0v128", True))


@needs_sm90
@pytest.mark.parametrize("chunk", [1, 64, 100, 1000])
def test_chunked(chunk):
    _run(_shape(RAGGED_Q, RAGGED_K, 5, "n128r64v128", chunk=chunk))


@needs_sm90
def test_chunked_glm5_long_prefix():
    _run(_shape((700, 1), (2000, 513), 8, "n192r64v256", chunk=300))


@needs_sm90
def test_softcap_and_sink():
    _run(_shape(RAGGED_Q, RAGGED_K, 5, softcap=5.0))
    _run(_shape(RAGGED_Q, RAGGED_K, 16, causal=False, sink=True))
    _run(_shape(RAGGED_Q, RAGGED_K, 5, "n192r64v256", False, (77, 0), softcap=20.0, sink=True))
    _run(_shape(RAGGED_Q, RAGGED_K, 5, "n128r0v128", chunk=100, sink=True))


@needs_sm90
def test_a_sink_changes_only_the_denominator():
    """Out with a sink is out without it times sum / (sum + exp(sink)) per row: lse unchanged."""
    base = _shape(200, 250, 8, causal=True)
    inputs = make_inputs(base, "cuda", 3)
    sink = torch.full((8,), 1.5, device="cuda")
    args = (inputs["q"], inputs["k"], inputs["v"])
    out0, lse0 = mlagen.mla_prefill(*args, k_rope=inputs["k_rope"])
    out1, lse1 = mlagen.mla_prefill(*args, k_rope=inputs["k_rope"], attn_sink=sink)
    torch.testing.assert_close(lse1, lse0, atol=1e-4, rtol=0)   # two kernels (the plain one may be a record)
    factor = (1 / (1 + torch.exp(1.5 - lse0))).unsqueeze(-1)
    torch.testing.assert_close(out1.float(), out0.float() * factor, atol=2e-2, rtol=2e-2)


@needs_sm90
def test_rows_the_mask_leaves_empty():
    """Lq > Lk (chunked and window rows at negative positions) and a window that misses every key."""
    out, lse, _ = _run(_shape((50, 10), (10, 0), 2, chunk=4))
    assert bool(torch.isinf(lse[:40]).all()) and bool((out[:40] == 0).all())
    out, lse, _ = _run(_shape(40, 10, 1, causal=False, window=(2, 0), sink=True))
    assert bool(torch.isinf(lse[:28]).all()) and bool((out[:28] == 0).all())


@needs_sm90
def test_dispatch_picks_the_traits_kernel():
    shape = _shape(300, 300, 4, "n192r64v256", False, (100, 0), softcap=10.0)
    inputs = make_inputs(shape, "cuda", 0)
    sel = mla_prefill_kernel(inputs["q"], inputs["k"], inputs["v"], k_rope=inputs["k_rope"], causal=False,
                             window_size=(100, 0), softcap=10.0)
    assert sel.variant.specialization == {"mask": "window", "geometry": "n192r64v256", "score": "softcap"}
    assert sel.binary.resources.spill_bytes == 0


@needs_sm90
def test_flash_attn_window_and_softcap_pass_through():
    from mlagen.families.mla_prefill.reference import reference

    g = torch.Generator(device="cuda").manual_seed(1)
    lens = [129, 5, 300]
    cu = torch.tensor([0, 129, 134, 434], dtype=torch.int32, device="cuda")
    q, k = (torch.randn(434, 4, 192, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    v = torch.randn(434, 4, 128, generator=g, device="cuda").to(torch.bfloat16)
    out = mlagen.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, window_size=(64, 64),
                                        softcap=8.0)
    ref, _ = reference(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True, window_size=(64, 64), softcap=8.0,
                       softmax_scale=192 ** -0.5, dtype=torch.float32)
    rel = float((out.float() - ref).norm() / ref.norm())
    assert rel < REL_TOL, rel
