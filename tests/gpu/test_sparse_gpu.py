"""Sparse MLA prefill on the GPU against the float32 reference of MLA.md section 2.

The matrix of mlagen.families.mla_sparse_prefill.tools.verify_cases (H in {1, 5, 16, 64, 128} x topk in
{1, 33, 640, 2048}; -1, negative, >= N and 2**31 - 1 indices; duplicates; topk_length short,
zero and past topk; sink absent, finite, +inf, -inf and mixed; flat, [N, 1, d] and strided
paged kv; empty rows; d_qk 512 and 576; strided q) runs on every spec of the family that
targets the device. ``out`` is poisoned with NaN, so an unwritten element fails.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen.families.mla_sparse_prefill import tools as bench_sparse  # noqa: E402
from mlagen.dispatch import family_specs  # noqa: E402
from mlagen.families import mla_sparse_prefill as fam  # noqa: E402
from mlagen.families.mla_sparse_prefill import reference as sp_ref  # noqa: E402
from mlagen.runtime import device_info  # noqa: E402


def _specs():
    """The specs targeting the device."""
    if not torch.cuda.is_available():
        return ["mla_sparse_prefill_sm90"]
    target = device_info(torch.cuda.current_device()).target.name
    return [s.name for s in family_specs(fam.FAMILY.name) if target in s.targets]


CASES = bench_sparse.verify_cases()


@pytest.mark.parametrize("spec_name", _specs())
@pytest.mark.parametrize("i", range(len(CASES)))
def test_matches_reference(spec_name, i):
    ok, msg = bench_sparse.check_case(torch, CASES[i], seed=1000 + i, kernel=spec_name)
    assert ok, f"{CASES[i]}: {msg}"


def _lazy_variant(case, **options):
    """The sm90 variant with the lazy running max (and ``options``), specialised for ``case``."""
    from mlagen import spec as spec_mod
    from mlagen import variant

    return variant.make(spec_mod.load("mla_sparse_prefill_sm90"),
                        {"softmax_max": "lazy", "d_qk": case.get("d_qk", 576),
                         # bench_sparse.make_kv's paged pool; one page is read as a flat table
                         "paged": case.get("kv") == "paged" and case["n"] > 64, "kv_format": "bf16", **options})


# The schedule options measured against FlashMLA at d_qk 512 (docs/notes.md, "DeepSeek-V4's d 512
# against FlashMLA"): the bulk-copy epilogue, consumer 0 freeing its buffer half before the P
# exchange, Q loaded evict-first. All three at once over the case matrix (one build per
# specialisation); each alone in the running-max test below.
_D512_OPTIONS = {"epilogue": "bulk", "early_free": True, "q_evict_first": True}


# The persistent kernel (one CTA per SM takes the items in turn), O through the P tiles (d_qk 512;
# at 576 consumer 0's P tile is buffer 0's rope tile, so O goes from registers).
_PERSISTENT = {"persistent": True, "epilogue": "warp"}


def _persistent(case, epilogue=None, **options):
    d512 = case.get("d_qk", 576) == 512
    return _lazy_variant(case, **{**_PERSISTENT, "epilogue": epilogue or ("warp" if d512 else "direct"), **options})

_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not _HOPPER, reason="the sm90 sparse kernel needs a Hopper GPU")
@pytest.mark.parametrize("i", range(len(CASES)))
def test_lazy_max_matches_reference(i):
    ok, msg = bench_sparse.check_case(torch, CASES[i], seed=1000 + i, kernel=_lazy_variant(CASES[i]))
    assert ok, f"{CASES[i]}: {msg}"


@pytest.mark.skipif(not _HOPPER, reason="the sm90 sparse kernel needs a Hopper GPU")
@pytest.mark.parametrize("i", range(len(CASES)))
def test_d512_options_match_reference(i):
    ok, msg = bench_sparse.check_case(torch, CASES[i], seed=1000 + i, kernel=_lazy_variant(CASES[i], **_D512_OPTIONS))
    assert ok, f"{CASES[i]}: {msg}"


@pytest.mark.skipif(not _HOPPER, reason="the sm90 sparse kernel needs a Hopper GPU")
@pytest.mark.parametrize("i", range(len(CASES)))
def test_persistent_matches_reference(i):
    ok, msg = bench_sparse.check_case(torch, CASES[i], seed=1000 + i, kernel=_persistent(CASES[i]))
    assert ok, f"{CASES[i]}: {msg}"


# Enough items that every persistent CTA takes several (132 SMs), with per-token lengths from 0 to
# topk: the CTAs' items have different pair counts (none too), which the barriers' phases follow.
_MANY_ITEMS = [
    {"sq": 700, "heads": 64, "topk": 640, "n": 3000, "d_qk": 512, "topk_length": "short", "sink": "mixed"},
    {"sq": 300, "heads": 128, "topk": 129, "n": 3000, "d_qk": 576, "kv": "paged", "topk_length": "short",
     "sink": "finite"},
    {"sq": 999, "heads": 5, "topk": 256, "n": 700, "d_qk": 512, "kv": "paged", "sink": "none"},
    {"sq": 400, "heads": 100, "topk": 1152, "n": 5000, "d_qk": 512, "topk_length": "long", "sink": "finite",
     "idx3": True},
]


@pytest.mark.skipif(not _HOPPER, reason="the sm90 sparse kernel needs a Hopper GPU")
@pytest.mark.parametrize("softmax_max", ["lazy", "exact"])
@pytest.mark.parametrize("epilogue", ["warp", "direct"])
@pytest.mark.parametrize("i", range(len(_MANY_ITEMS)))
def test_persistent_ctas_take_many_items(i, epilogue, softmax_max):
    case = _MANY_ITEMS[i]
    if epilogue == "warp" and case["d_qk"] == 576:
        pytest.skip("at d_qk 576 the persistent kernel stores O from registers (epilogue=direct)")
    kernel = _persistent(case, epilogue, softmax_max=softmax_max)
    ok, msg = bench_sparse.check_case(torch, case, seed=2000 + i, kernel=kernel)
    assert ok, f"{case}: {msg}"


@pytest.mark.skipif(not _HOPPER, reason="the sm90 sparse kernel needs a Hopper GPU")
@pytest.mark.parametrize("options", [{"softmax_max": "lazy"}, {"softmax_max": "exact"},
                                     *({"softmax_max": "lazy", k: v} for k, v in _D512_OPTIONS.items()),
                                     {"softmax_max": "lazy", "epilogue": "warp"},
                                     {"softmax_max": "lazy", "persistent": True, "epilogue": "direct"},
                                     {"softmax_max": "exact", "persistent": True, "epilogue": "direct"}],
                         ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
@pytest.mark.parametrize("rising", [True, False])
def test_running_max_with_rising_and_falling_scores(options, rising):
    """Key rows whose logits grow (or shrink) by tens of log2 units from one 64-row block to the
    next in the order the kernel visits them, both consumers' blocks alike: the lazy max must move
    in time (exp2 would overflow), skipped rescales must not change out or lse, and max_logits
    must stay the exact maximum although the kept one lags."""
    from mlagen import spec as spec_mod
    from mlagen import variant

    g = torch.Generator(device="cuda").manual_seed(77)
    sq, heads, topk, n = 6, 37, 640, 4096
    ramp = torch.linspace(0.5, 40.0, n, device="cuda").view(-1, 1)
    if not rising:
        ramp = ramp.flip(0)
    kv = (torch.randn((n, 576), generator=g, device="cuda") * ramp).to(torch.bfloat16)
    q = torch.randn((sq, heads, 576), generator=g, device="cuda").to(torch.bfloat16)
    # Each token's rows in increasing order, with a few invalid entries mixed in.
    idx = torch.sort(torch.randperm(n, generator=g, device="cuda")[:topk]).values.to(torch.int32)
    idx = idx.repeat(sq, 1)
    idx[:, 5::97] = -1
    sink = torch.randn((heads,), generator=g, device="cuda")
    v = variant.make(spec_mod.load("mla_sparse_prefill_sm90"), {**options, "d_qk": 576, "paged": False, "kv_format": "bf16"})
    out = torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device="cuda")
    got = mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=0.05, attn_sink=sink, out=out, kernel=v)
    ref = sp_ref.reference(q, kv, idx, softmax_scale=0.05, attn_sink=sink)
    torch.cuda.synchronize()
    # The first blocks' logits are a few units, the largest ones tens: far beyond the lazy margin.
    assert float(ref[1].min()) > 20
    ok, msg = bench_sparse.judge(torch, got, ref)
    assert ok, msg


def _shipped_records():
    """The shipped records of the 64-head sm90 spec (every device's), one param each."""
    from mlagen import db

    out = [pytest.param(b, id=f"{b.key.device}:{b.key.problem}") for b in db.shipped_records()
           if b.key.spec == "mla_sparse_prefill_sm90"]
    return out or [pytest.param(None, marks=pytest.mark.skip(reason="no shipped records of mla_sparse_prefill_sm90"))]


@pytest.mark.skipif(not _HOPPER, reason="the sm90 sparse kernel needs a Hopper GPU")
@pytest.mark.parametrize("best", _shipped_records())
def test_shipped_records_match_reference(best):
    """Each record the package ships (the variant dispatch runs for its class) over the case
    matrix's cases of its d_qk, bf16 pools flat and paged."""
    from mlagen.families.mla_sparse_prefill.problem import ProblemKey

    key = ProblemKey.parse(best.key.problem)
    if key.kv_format != "bf16":
        pytest.skip(f"{best.key.problem} reads an FP8 cache; the case matrix feeds bf16 pools "
                    "(test_sparse_fp8_gpu.py runs the FP8 formats)")
    cases = [c for c in CASES if c.get("d_qk", 576) == key.d_qk]
    assert cases
    for i, case in enumerate(cases):
        ok, msg = bench_sparse.check_case(torch, case, seed=3000 + i, kernel=_lazy_variant(case, **best.variant))
        assert ok, f"{best.symbol} {case}: {msg}"


# Schedule options of the H <= 16 kernel beside its default (the case matrix runs the default):
# the other gather and row layouts, register-set depths, the skipped rescale, the late drain,
# fewer producer warps and ring slots, two consumer warpgroups.
_H16_OPTIONS = [{}, {"skip_rescale": True}, {"gather": "bulk", "row_pad": 16}, {"gather": "bulk", "row_pad": 32},
                {"qk_sets": 2, "pv_sets": 2}, {"late_drain": True, "qk_sets": 2, "pv_sets": 2}, {"producers": 1, "slots": 3},
                {"qk_chains": 1, "qk_group": 12, "qk_sets": 2}, {"l2_evict_last": False}, {"consumers": 2},
                {"consumers": 2, "qk_group": 9, "skip_rescale": True, "pv_sets": 2}]


@pytest.mark.skipif(not _HOPPER, reason="the H <= 16 sparse kernel needs a Hopper GPU")
@pytest.mark.parametrize("options", _H16_OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("rising", [True, False])
def test_h16_schedules_with_rising_and_falling_scores(options, rising):
    """The H <= 16 kernel's schedule options on key rows whose logits grow (or shrink) by tens of
    log2 units from block to block (the running max moves every block, or never after the
    first), 20 heads (a full and a partial group), invalid entries mixed in, a strided paged pool."""
    from mlagen import spec as spec_mod
    from mlagen import variant

    g = torch.Generator(device="cuda").manual_seed(78)
    sq, heads, topk, n, page = 5, 20, 640, 4096, 64
    ramp = torch.linspace(0.5, 40.0, n, device="cuda").view(-1, 1)
    if not rising:
        ramp = ramp.flip(0)
    kv = (torch.randn((n, 576), generator=g, device="cuda") * ramp).to(torch.bfloat16)
    q = torch.randn((sq, heads, 576), generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.sort(torch.randperm(n, generator=g, device="cuda")[:topk]).values.to(torch.int32).repeat(sq, 1)
    idx[:, 5::97] = -1
    sink = torch.randn((heads,), generator=g, device="cuda")
    v = variant.make(spec_mod.load("mla_sparse_prefill_sm90_h16"),
                     dict(options, d_qk=576, paged=True, kv_format="bf16"))
    # A strided pool: each page of 64 rows sits in a slot of 65 (else the call reads it as a flat table).
    pool = torch.zeros((n // page, page + 1, 576), dtype=torch.bfloat16, device="cuda")
    pool[:, :page] = kv.view(n // page, page, 576)
    out = torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device="cuda")
    got = mlagen.mla_sparse_prefill(q, pool[:, :page], idx, softmax_scale=0.05, attn_sink=sink, out=out, kernel=v)
    ref = sp_ref.reference(q, kv, idx, softmax_scale=0.05, attn_sink=sink)
    torch.cuda.synchronize()
    assert float(ref[1].min()) > 20
    ok, msg = bench_sparse.judge(torch, got, ref)
    assert ok, msg


def test_cuda_graph_capture_and_replay():
    ok, msg = bench_sparse.check_graph(torch)
    assert ok, msg


def test_flash_mla_signature_and_return_order():
    inp = sp_ref.make_inputs({"sq": 8, "heads": 16, "topk": 100, "s_kv": 500}, "cuda", seed=3)
    out, max_logits, lse = mlagen.flash_mla_sparse_fwd(inp["q"], inp["kv"], inp["indices"], inp["softmax_scale"],
                                                       512, inp["attn_sink"], None)
    ro, rml, rlse = sp_ref.reference(inp["q"], inp["kv"], inp["indices"], softmax_scale=inp["softmax_scale"],
                                  attn_sink=inp["attn_sink"])
    assert out.shape == (8, 16, 512) and max_logits.shape == lse.shape == (8, 16)
    assert ((out.float() - ro).norm() / ro.norm()).item() < 1e-2
    assert torch.allclose(lse, rlse, atol=2e-3) and torch.allclose(max_logits, rml, atol=2e-3)


def test_empty_problems_fill_without_launch():
    q = torch.randn((3, 4, 576), device="cuda").to(torch.bfloat16)
    kv = torch.randn((10, 576), device="cuda").to(torch.bfloat16)
    idx = torch.zeros((3, 0), dtype=torch.int32, device="cuda")
    out, ml, lse = mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=0.1)
    assert (out == 0).all() and (ml == -math.inf).all() and (lse == math.inf).all()
    out, ml, lse = mlagen.mla_sparse_prefill(q[:0], kv, idx[:0], softmax_scale=0.1)
    assert out.shape == (0, 4, 512)


def test_unaligned_views_are_copied_not_misread():
    g = torch.Generator(device="cuda").manual_seed(11)
    base = torch.randn((5, 8, 577), generator=g, device="cuda").to(torch.bfloat16)
    q = base[:, :, 1:]  # 2-byte offset: cp.async cannot read it in place
    kv = torch.randn((50, 576), generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.randint(-5, 60, (5, 40), generator=g, device="cuda", dtype=torch.int32)
    out, ml, lse = mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=0.05)
    ro, _, rlse = sp_ref.reference(q, kv, idx, softmax_scale=0.05)
    assert ((out.float() - ro).norm() / ro.norm()).item() < 1e-2


@pytest.mark.parametrize("change, error, match", [
    ({"q": lambda q: q.float()}, TypeError, "q: dtype"),
    ({"q": lambda q: q[..., :500]}, ValueError, "q: last dimension"),
    ({"kv": lambda kv: kv[..., :512]}, ValueError, "kv: last dimension must match"),
    ({"indices": lambda i: i.long()}, TypeError, "indices: dtype"),
    ({"indices": lambda i: i[:2]}, ValueError, "indices: has 2 rows"),
    ({"attn_sink": lambda s: s[:3]}, ValueError, "attn_sink: expected shape"),
    ({"softmax_scale": lambda s: -1.0}, ValueError, "softmax_scale"),
    ({"d_v": lambda d: 128}, ValueError, "d_v"),
])
def test_argument_errors_name_the_argument(change, error, match):
    args = sp_ref.make_inputs({"sq": 4, "heads": 8, "topk": 16, "s_kv": 64}, "cuda", seed=1)
    args["d_v"] = 512
    for k, f in change.items():
        args[k] = f(args[k])
    with pytest.raises(error, match=match):
        mlagen.mla_sparse_prefill(**args)


def test_the_default_call_does_not_synchronise():
    inp = sp_ref.make_inputs({"sq": 16, "heads": 64, "topk": 256, "s_kv": 1024}, "cuda", seed=2)
    inp["topk_length"] = torch.full((16,), 200, dtype=torch.int32, device="cuda")
    mlagen.mla_sparse_prefill(**inp)  # builds the kernel
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mlagen.mla_sparse_prefill(**inp)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("preallocated", [False, True])
def test_torch_compile_fullgraph_matches_eager(preallocated):
    inp = sp_ref.make_inputs({"sq": 12, "heads": 20, "topk": 150, "s_kv": 700}, "cuda", seed=4)

    def layer(q, kv, indices, sink):
        if preallocated:
            out = torch.empty(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16, device=q.device)
            ml = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
            lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
            mlagen.mla_sparse_prefill(q * 0.5, kv, indices, softmax_scale=0.04, attn_sink=sink, out=out,
                                      max_logits=ml, lse=lse)
        else:
            out, ml, lse = mlagen.mla_sparse_prefill(q * 0.5, kv, indices, softmax_scale=0.04, attn_sink=sink)
        return out.float() + 1, ml * 2, lse * 2

    args = (inp["q"], inp["kv"], inp["indices"], inp["attn_sink"])
    eager = layer(*args)
    torch._dynamo.reset()
    got = torch.compile(layer, fullgraph=True)(*args)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


def test_opcheck_on_the_gpu():
    from mlagen.families.mla_sparse_prefill import op

    inp = sp_ref.make_inputs({"sq": 6, "heads": 8, "topk": 70, "s_kv": 300}, "cuda", seed=9)
    args = (inp["q"], inp["kv"], inp["indices"], 0.04, None, inp["attn_sink"], None, "bf16")
    for name, result in torch.library.opcheck(op._op, args).items():
        assert result == "SUCCESS", (name, result)
    outs = (torch.empty(6, 8, 512, dtype=torch.bfloat16, device="cuda"),
            torch.empty(6, 8, dtype=torch.float32, device="cuda"), torch.empty(6, 8, dtype=torch.float32, device="cuda"))
    for name, result in torch.library.opcheck(op._op_out, args + outs).items():
        assert result == "SUCCESS", (name, result)


@pytest.mark.parametrize("offset, row", [(2, 64 * 512), (8, 64 * 512 + 4)])
def test_an_out_the_kernels_cannot_store_into_is_refused(offset, row):
    """The sm90 kernels store O in 16-byte vectors: an out= view 4-byte but not 16-byte aligned
    (a base offset of 2 values, or a row stride of 4 more values) is refused with a ValueError
    naming out, before any launch (before 2026-12-02 it was accepted and faulted in the kernel)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev = torch.device("cuda")
    q = torch.randn(4, 64, 576, device=dev, dtype=torch.bfloat16)
    kv = torch.randn(128, 1, 576, device=dev, dtype=torch.bfloat16)
    idx = torch.randint(0, 128, (4, 1, 64), device=dev, dtype=torch.int32)
    buf = torch.zeros(offset + 4 * row, device=dev, dtype=torch.bfloat16)
    out = buf[offset:].as_strided((4, 64, 512), (row, 512, 1))
    with pytest.raises(ValueError, match=r"out: base address and row/head strides must be multiples of 16 bytes"):
        mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=0.06, out=out)
    # An aligned out still works, and the context is healthy afterwards.
    got, _, _ = mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=0.06, out=torch.empty(4, 64, 512, device=dev,
                                                                                            dtype=torch.bfloat16))
    torch.cuda.synchronize()
    assert torch.isfinite(got).all()
