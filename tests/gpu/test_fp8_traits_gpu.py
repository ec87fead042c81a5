"""The FP8 (e4m3) dense kernel's mask and score traits on the GPU (MLA.md section 1b): window and
chunked masks, softcap and attention sinks, against the float32 reference on the FP8-rounded
(dequantized) inputs with FP8_REL_TOL, as tests/gpu/test_fp8_gpu.py compares.

Every case draws fresh random inputs (q and v with one descale per head, k and k_rope one for the
tensor; some cases a per-tensor q descale), poisons ``out`` and ``lse`` with NaN, runs the public
call (which must dispatch mla_prefill_sm90_fp8 of the traits) and compares every head; rows whose
mask leaves no key must give out = 0 and lse = +inf. The descales are far from 1 (amax / 448), so
a softcap that saw the stored score instead of the true one, or a sink in another domain than the
row maximum, fails. Odd shapes: lengths 1, unfilled tiles, empty sequences, ragged batches,
prefixes and Lq > Lk, H 1, 5, 8, 16, 64, 128, windows narrower and wider than a key tile (96 keys
by default), chunks that are no multiple of it; both geometries of the FP8 kernel (128 / 64 / 128
and 128 / 0 / 128).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen.families import get as get_family  # noqa: E402
from mlagen.families.mla_prefill.entry import mla_prefill_kernel  # noqa: E402
from mlagen.families.mla_prefill.problem import Shape  # noqa: E402
from mlagen.families.mla_prefill.reference import FP8_REL_TOL, compare, reference_heads  # noqa: E402
from mlagen.runtime import device_info  # noqa: E402

FAMILY = get_family("mla_prefill")
SPEC = "mla_prefill_sm90_fp8"
DTYPE = "fp8_e4m3"


def _hopper() -> bool:
    return torch.cuda.is_available() and device_info(torch.cuda.current_device()).target.name == "sm_90a"


needs_sm90 = pytest.mark.skipif(not _hopper(), reason="needs an sm_90a GPU (H100 / H200): the FP8 traits run on the "
                                                      "sm90 FP8 kernel (GPU tests run on the device machine)")

# Ragged batches: lengths 1, unfilled tiles, an empty sequence, prefixes (Lk > Lq) and Lq > Lk.
RAGGED_Q = (1, 77, 0, 300, 129, 200)
RAGGED_K = (1, 90, 5, 333, 129, 150)


def _shape(q, k, heads, causal=True, window=(-1, -1), chunk=0, softcap=0.0, sink=False, geometry="n128r64v128"):
    q, k = (q,) if isinstance(q, int) else q, (k,) if isinstance(k, int) else k
    return Shape("fp8t", tuple(q), tuple(k), heads, causal, geometry, window, chunk, softcap, sink)


def _run(shape: Shape, seed: int = 0, kernel=None, per_tensor_q: bool = False):
    inputs = FAMILY.make_inputs(shape, "cuda", seed=seed, dtype=DTYPE)
    if per_tensor_q:   # one q descale for every head (the stored values then mean other reals; the reference follows)
        inputs["q_descale"] = inputs["q_descale"].mean().reshape(1).contiguous()
    out, lse = FAMILY.make_outputs(shape, "cuda")   # NaN-poisoned
    FAMILY.call(inputs, kernel=kernel, outputs=(out, lse), check=True)
    torch.cuda.synchronize()
    ref_out, ref_lse = reference_heads(shape, inputs, heads=None)
    check = compare(out, lse, ref_out, ref_lse, rel_tol=FP8_REL_TOL)
    assert check.problem is None, f"{shape.description}: {check.problem}"
    empty = torch.isinf(ref_lse)
    assert bool((out[empty] == 0).all()), f"{shape.description}: rows that see no key must be 0"
    return out, lse, ref_lse


@needs_sm90
@pytest.mark.parametrize("window", [(0, 0), (5, 0), (200, 0), (33, 17), (-1, 40), (300, -1), (1, 1000)])
def test_windows_narrower_and_wider_than_a_tile(window):
    _run(_shape(RAGGED_Q, RAGGED_K, 5, False, window))


@needs_sm90
def test_window_long_sequence_and_many_heads():
    """Many key tiles skipped below the window; a causal window (left, 0) at 64 heads."""
    _run(_shape(3000, 3000, 2, False, (500, 0)))
    _run(_shape((129, 1, 300), (129, 1, 700), 64, True, (100, 0)))


@needs_sm90
@pytest.mark.parametrize("chunk", [1, 64, 100, 1000])
def test_chunked(chunk):
    _run(_shape(RAGGED_Q, RAGGED_K, 5, chunk=chunk))


@needs_sm90
def test_chunked_long_prefix():
    _run(_shape((700, 1), (2000, 513), 8, chunk=300))


@needs_sm90
@pytest.mark.parametrize("per_tensor_q", [False, True], ids=["q-per-head", "q-per-tensor"])
def test_softcap_sees_the_true_score(per_tensor_q):
    """Small caps saturate tanh: scores taken before the descales would be capped wrong."""
    _run(_shape(RAGGED_Q, RAGGED_K, 5, softcap=5.0), per_tensor_q=per_tensor_q)
    _run(_shape(RAGGED_Q, RAGGED_K, 16, causal=False, softcap=1.5), seed=1, per_tensor_q=per_tensor_q)


@needs_sm90
def test_sinks_and_both_score_traits():
    _run(_shape(RAGGED_Q, RAGGED_K, 16, causal=False, sink=True))
    _run(_shape(RAGGED_Q, RAGGED_K, 1, sink=True), per_tensor_q=True)
    _run(_shape(RAGGED_Q, RAGGED_K, 8, False, (77, 0), softcap=20.0, sink=True))
    _run(_shape(RAGGED_Q, RAGGED_K, 5, chunk=100, sink=True))
    _run(_shape(200, 260, 128, softcap=10.0, sink=True))


@needs_sm90
def test_the_geometry_without_a_rope_part():
    """128 / 0 / 128 (q and k 128 wide, no k_rope): the plain kernel and each trait."""
    _run(_shape(RAGGED_Q, RAGGED_K, 8, geometry="n128r0v128"))
    _run(_shape(RAGGED_Q, RAGGED_K, 8, False, (40, 3), softcap=5.0, sink=True, geometry="n128r0v128"))
    _run(_shape(RAGGED_Q, RAGGED_K, 1, chunk=100, sink=True, geometry="n128r0v128"), per_tensor_q=True)
    _run(_shape(129, 200, 128, False, geometry="n128r0v128"))


@needs_sm90
def test_a_sink_changes_only_the_denominator():
    """Out with a sink is out without it times sum / (sum + exp(sink)) per row (v_descale applies to
    both alike); lse unchanged. Both kernels of one schedule, so P is rounded to e4m3 alike."""
    from mlagen import spec as spec_mod, variant

    fp8 = spec_mod.load(SPEC)
    base = _shape(200, 250, 8)
    inputs = FAMILY.make_inputs(base, "cuda", seed=3, dtype=DTYPE)
    sink = torch.full((8,), 1.5, device="cuda")
    args = (inputs["q"], inputs["k"], inputs["v"])
    kw = {n: inputs[n] for n in ("k_rope", "q_descale", "k_descale", "v_descale")}
    out0, lse0 = mlagen.mla_prefill(*args, **kw, kernel=variant.make(fp8, {"mask": "causal"}))
    out1, lse1 = mlagen.mla_prefill(*args, **kw, attn_sink=sink,
                                    kernel=variant.make(fp8, {"mask": "causal", "score": "sink"}))
    torch.testing.assert_close(lse1, lse0, atol=1e-4, rtol=0)
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
@pytest.mark.parametrize("kwargs,specialization", [
    ({"causal": False, "window_size": (100, 0)}, {"mask": "window", "score": "plain"}),
    ({"chunk_size": 100, "softcap": 10.0}, {"mask": "chunked", "score": "softcap"}),
    ({"attn_sink": True}, {"mask": "causal", "score": "sink"}),
    ({"causal": False, "window_size": (50, 50), "no_rope": True}, {"mask": "window", "geometry": "n128r0v128",
                                                                    "score": "plain"}),
], ids=["window", "chunked-softcap", "sink", "no-rope-window"])
def test_dispatch_picks_the_fp8_traits_kernel(kwargs, specialization):
    kwargs = dict(kwargs)
    no_rope = kwargs.pop("no_rope", False)
    shape = _shape(300, 300, 4, geometry="n128r0v128" if no_rope else "n128r64v128")
    inputs = FAMILY.make_inputs(shape, "cuda", seed=0, dtype=DTYPE)
    if kwargs.get("attn_sink"):
        kwargs = {**kwargs, "attn_sink": torch.zeros(4, device="cuda")}
    sel = mla_prefill_kernel(inputs["q"], inputs["k"], inputs["v"], k_rope=inputs["k_rope"],
                             q_descale=inputs["q_descale"], k_descale=inputs["k_descale"],
                             v_descale=inputs["v_descale"], **kwargs)
    assert sel.spec.name == SPEC
    assert sel.variant.specialization == {"geometry": "n128r64v128", **specialization}
    assert not sel.binary.resources.spills


# The H100 FP8 records' schedule (three consumers, the fp32 O copy in shared memory, lazy rescale,
# half diagonal), the V^T pre-pass, Q in registers, one consumer with narrow tiles; each with two
# of the three trait sets (every set on three schedules).
_C3 = {"consumers": 3, "order": "none", "consumer_regs": 160, "rescale": "lazy", "pv_wait": "late", "load_warps": 1,
       "o_copy": "smem", "diagonal": "half"}
_PREPASS = {"v_transpose": "prepass", "scheduler": "persistent"}
_QREGS = {"q_operand": "regs", "block_n": 64, "scheduler": "static"}
_ONE = {"consumers": 1, "order": "none", "block_n": 64, "diagonal": "half"}


@needs_sm90
@pytest.mark.parametrize("values,traits", [
    (_C3, "window+softcap_sink"), (_C3, "chunked+sink"),
    (_PREPASS, "chunked+sink"), (_PREPASS, "causal+softcap"),
    (_QREGS, "causal+softcap"), (_QREGS, "window+softcap_sink"),
    (_ONE, "window+softcap_sink"), (_ONE, "chunked+sink"), (_C3, "causal+softcap"),
], ids=["c3-window", "c3-chunked", "prepass-chunked", "prepass-causal", "qregs-causal", "qregs-window",
        "one-window", "one-chunked", "c3-causal"])
def test_traits_on_other_schedules(values, traits):
    """The traits with the schedule options that move the code they touch: the first key tile
    visited (the band's, not tile 0), half diagonal tiles, the V^T pre-pass's columns, Q in
    registers, other tile widths."""
    from mlagen import arch, resources, spec as spec_mod, variant

    mask, score = traits.split("+")
    v = variant.make(spec_mod.load(SPEC), {**values, "mask": mask, "score": score})
    assert resources.check(v, arch.target("sm_90a")).ok, resources.check(v, arch.target("sm_90a")).reasons
    sc, sink = (7.0 if "softcap" in score else 0.0), "sink" in score
    if mask == "window":
        _run(_shape(RAGGED_Q, RAGGED_K, 5, False, (150, 0), softcap=sc, sink=sink), kernel=v)
        _run(_shape(1200, 1300, 3, False, (200, 7), softcap=sc, sink=sink), kernel=v)
    elif mask == "chunked":
        _run(_shape(RAGGED_Q, RAGGED_K, 5, chunk=100, softcap=sc, sink=sink), kernel=v)
        _run(_shape(1200, 1300, 3, chunk=257, softcap=sc, sink=sink), kernel=v)
    else:
        _run(_shape(RAGGED_Q, RAGGED_K, 5, softcap=sc, sink=sink), kernel=v)
        _run(_shape(1200, 1300, 3, softcap=sc, sink=sink), kernel=v)
