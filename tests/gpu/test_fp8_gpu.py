"""FP8 (e4m3) inputs of dense MLA prefill on the GPU.

On a device with an FP8 kernel (sm_90a and gfx950: OCP e4m3; gfx942: FNUZ e4m3) every FP8 spec
targeting it runs ragged, causal and non-causal batches with per-head and per-tensor descales
against the float32 reference on the dequantized inputs (``FP8_REL_TOL``; the emulated error is
~2.4%, see tests/test_hip_mfma_layout.py). An fp8 dtype with no kernel for the device (FNUZ on the
H100) must fail with one clear line naming the dtype and the targets that have FP8 kernels.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen.dispatch import family_specs  # noqa: E402
from mlagen.families import get as get_family  # noqa: E402
from mlagen.families.mla_prefill.problem import Shape  # noqa: E402
from mlagen.runtime import device_info  # noqa: E402

FAMILY = get_family("mla_prefill")


def _target() -> str | None:
    if not torch.cuda.is_available():
        return None
    t = device_info(torch.cuda.current_device()).target
    return None if t is None else t.name


TARGET = _target()
# Why an FP8 test of one target skips: no GPU at all, or a GPU of another target.
_NO_SM90_FP8 = ("no GPU is visible on this machine (GPU tests run on the device machine)" if TARGET is None
                else f"the sm_90a FP8 kernel does not target {TARGET}")
FP8_SPECS = {s.name: dict(s.problem)["dtype"] for s in family_specs("mla_prefill")
             if TARGET in s.targets and dict(s.problem)["dtype"].startswith("fp8")}
needs_fp8_kernel = pytest.mark.skipif(not FP8_SPECS, reason=(f"no FP8 kernel targets {TARGET} (sm_90a, gfx942, gfx950)" if TARGET else _NO_SM90_FP8.split(" (")[0] + " (GPU tests run on the device machine)"))
TORCH_FP8 = {"fp8_e4m3": "float8_e4m3fn", "fp8_e4m3fnuz": "float8_e4m3fnuz"}


def _check(spec, dtype, shape):
    # make_inputs gives q and v one descale per head, k and k_rope one per tensor.
    inputs = FAMILY.make_inputs(shape, "cuda", seed=shape.heads, dtype=dtype)
    tq = shape.total_q
    out = torch.full((tq, shape.heads, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((tq, shape.heads), float("nan"), dtype=torch.float32, device="cuda")
    got = FAMILY.call(inputs, kernel=spec, outputs=(out, lse), check=True)
    torch.cuda.synchronize()
    ref = FAMILY.reference(shape, inputs, heads=None)
    check = FAMILY.compare(got, ref, dtype=dtype)
    assert check.ok, f"{spec} {shape}: {check.problem}"


@needs_fp8_kernel
@pytest.mark.parametrize("spec", sorted(FP8_SPECS))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [1, 16])
def test_fp8_ragged_batch(spec, causal, heads):
    shape = Shape("fp8", (5, 1, 0, 129, 77, 300), (5, 1, 0, 200, 77, 301), heads, causal)
    _check(spec, FP8_SPECS[spec], shape)


@needs_fp8_kernel
@pytest.mark.parametrize("spec", sorted(FP8_SPECS))
def test_fp8_long_causal_prefix(spec):
    _check(spec, FP8_SPECS[spec], Shape("fp8", (256,), (1280,), 16, True))


@pytest.mark.skipif(TARGET is None, reason="needs a GPU")
@pytest.mark.parametrize("dtype", sorted(TORCH_FP8))
def test_fp8_inputs_without_a_kernel_fail_in_one_line(dtype):
    if dtype in FP8_SPECS.values():
        pytest.skip(f"{TARGET} has a {dtype} kernel")
    fp8 = getattr(torch, TORCH_FP8[dtype])
    q = torch.zeros(8, 2, 192, device="cuda").to(fp8)
    k = torch.zeros(8, 2, 128, device="cuda").to(fp8)
    kr = torch.zeros(8, 1, 64, device="cuda").to(fp8)
    with pytest.raises(TypeError, match=rf"{dtype} inputs \(torch.{TORCH_FP8[dtype]}\) have no kernel for {TARGET}; "
                                        r"fp8 kernels: ") as exc:
        mlagen.mla_prefill(q, k, k, k_rope=kr)
    assert "\n" not in str(exc.value)


@needs_fp8_kernel
@pytest.mark.parametrize("spec", sorted(FP8_SPECS))
def test_fp8_per_tensor_descales_and_a_large_head_count(spec):
    """Per-tensor q and v descales (make_inputs gives per-head ones) on 128 heads, non-causal,
    against the reference with the same factors."""
    shape = Shape("fp8", (300, 129), (300, 129), 128, False)
    dtype = FP8_SPECS[spec]
    inputs = FAMILY.make_inputs(shape, "cuda", seed=3, dtype=dtype)
    for name in ("q_descale", "v_descale"):
        inputs[name] = inputs[name].max().reshape(1).contiguous()
    got = FAMILY.call(inputs, kernel=spec, check=True)
    torch.cuda.synchronize()
    ref = FAMILY.reference(shape, inputs, heads=None)
    check = FAMILY.compare(got, ref, dtype=dtype)
    assert check.ok, f"{spec} {shape}: {check.problem}"


# Schedule options of the sm_90a FP8 kernel: ring depth, wider key tiles (V^T swizzle below 128 B),
# no ordering, no overlap, clusters (V and V^T rows split between the CTAs), Q in registers (e4m3 A
# fragments by ldmatrix), one consumer, one load warp, the narrowest swizzles; V^T made by the
# kernel's transposing warps (the default) and by the pre-pass.
_PRE = {"v_transpose": "prepass"}
# Single-level accumulation (o_flush 0, biased on V with a channel mean: never shipped) for the schedule
# options as they were written before two-level accumulation became the default; the entries with
# o_flush below run them with it.
_SL = {"o_flush": 0}
_C3 = {"consumers": 3, "order": "none", "block_n": 96, "swizzle_v": 32, "load_warps": 1, "consumer_regs": 160}
SM90_FP8_SCHEDULES = [
    {},
    {**_SL, **_PRE},
    {**_SL, "stages": 3, "block_n": 128, "swizzle_v": 64},
    {**_SL, "stages": 3, "block_n": 192, "swizzle_v": 64, **_PRE},   # 3 x 192-key tiles and their V ring do not fit
    {**_SL, "block_n": 128, "swizzle_v": 128},
    {**_SL, "order": "none", "overlap": False, "block_n": 64, "swizzle_v": 64},
    {**_SL, "cluster": 2, "scheduler": "persistent", "block_n": 96, "swizzle_v": 32},
    {**_SL, "cluster": 2, "scheduler": "persistent", "block_n": 96, "swizzle_v": 32, **_PRE},
    {**_SL, "q_operand": "regs", "scheduler": "static", "block_n": 160, "swizzle_v": 32},
    {**_SL, "q_operand": "regs", "scheduler": "dynamic", "block_n": 160, "swizzle_v": 32, **_PRE},
    {**_SL, "q_operand": "regs", "scheduler": "persistent", "order": "none", "block_n": 128, "swizzle_v": 32},
    {**_SL, "consumers": 1, "order": "none", "load_warps": 1, "swizzle_q": 32, "swizzle_k": 32},
    {**_SL, "block_n": 224, "swizzle_v": 32, "producer_regs": 40, "consumer_regs": 232},
    # The D3 record of the ninth session.
    {**_SL, "scheduler": "static", "load_warps": 1, "producer_regs": 24, "consumer_regs": 240, **_PRE},
    # Three consumer warpgroups (192-row tiles).
    {**_SL, **_C3, "producer_regs": 24, **_PRE},
    {**_SL, **_C3, "producer_regs": 32},
    {**_SL, "consumers": 3, "order": "none", "block_n": 64, "swizzle_v": 64, "stages": 3, "load_warps": 1,
     "producer_regs": 24, "consumer_regs": 160, "rescale": "first", "cluster": 2, "scheduler": "persistent", **_PRE},
    {**_SL, "consumers": 3, "order": "none", "block_n": 64, "swizzle_v": 64, "stages": 3, "load_warps": 1,
     "producer_regs": 32, "consumer_regs": 160, "rescale": "first", "cluster": 2, "scheduler": "persistent"},
    # The lazy maximum (probabilities up to 2^8 in e4m3).
    {**_SL, "rescale": "lazy"},
    {**_SL, **_C3, "producer_regs": 24, "rescale": "lazy", "pv_wait": "late", "epilogue": "direct", **_PRE},
    # The first key tile on its first half only (half widths 96 and 48: P V's 32-key steps cover 64).
    {**_SL, "diagonal": "half"},
    {**_SL, **_C3, "producer_regs": 24, "rescale": "lazy", "pv_wait": "late", "epilogue": "direct", "diagonal": "half", **_PRE},
    # The D1 record of the fifteenth session (the D3 record's schedule but for pv_wait and diagonal):
    # the above with three stages; and with V^T made in the kernel.
    {**_SL, **_C3, "producer_regs": 24, "rescale": "lazy", "pv_wait": "late", "epilogue": "direct", "diagonal": "half",
     "stages": 3, **_PRE},
    {**_SL, **_C3, "producer_regs": 32, "rescale": "lazy", "pv_wait": "late", "epilogue": "direct", "diagonal": "half",
     "stages": 3},
    # The D1 record (eighteenth session): V^T in the kernel, two stages.
    {**_SL, **_C3, "producer_regs": 32, "rescale": "lazy", "pv_wait": "late", "epilogue": "direct", "diagonal": "half",
     "stages": 2},
    {"order": "none", "overlap": False, "block_n": 64, "swizzle_v": 64, "diagonal": "half"},
    # Two-level accumulation of O (an fp32 copy every o_flush tiles): with and without overlap, the
    # lazy maximum, the half diagonal.
    {"block_n": 128, "swizzle_v": 32, "o_flush": 1, "o_copy": "smem"},
    {"block_n": 96, "swizzle_v": 32, "consumer_regs": 232, "o_flush": 4, "order": "none", "rescale": "lazy",
     "pv_wait": "late", "diagonal": "half", "load_warps": 1},
    {"block_n": 64, "swizzle_v": 64, "consumer_regs": 232, "o_flush": 2, "order": "none", "overlap": False},
    # ... the copy in shared memory (o_copy smem): three consumer warpgroups (the eighteenth session's
    # D1 record's schedule), flushing every fourth tile and every tile; and the schedules of the winners
    # of the twentieth session's tune (call b; not shipped: slower than the first of these in one process),
    # flushing every 2 tiles (they flushed every 4 then: 512 and 768 keys, more than the spec allows now).
    {**_C3, "producer_regs": 32, "rescale": "lazy", "pv_wait": "late", "epilogue": "direct", "diagonal": "half",
     "o_flush": 4, "o_copy": "smem"},
    {**_C3, "producer_regs": 32, "rescale": "lazy", "pv_wait": "late", "epilogue": "direct", "diagonal": "half",
     "o_flush": 1, "o_copy": "smem"},
    {"block_n": 192, "swizzle_v": 64, "rescale": "lazy", "scheduler": "persistent", "load_warps": 1,
     "producer_regs": 40, "cluster": 2, "o_flush": 2, "o_copy": "smem", **_PRE},
    {"block_n": 128, "swizzle_v": 32, "q_operand": "regs", "order": "none", "rescale": "lazy", "pv_wait": "late",
     "load_warps": 1, "producer_regs": 56, "consumer_regs": 224, "o_flush": 2, "o_copy": "smem"},
]


@pytest.mark.skipif("mla_prefill_sm90_fp8" not in FP8_SPECS, reason=_NO_SM90_FP8)
@pytest.mark.parametrize("schedule", SM90_FP8_SCHEDULES, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()) or "default")
@pytest.mark.parametrize("causal", [True, False])
def test_sm90_fp8_schedules(schedule, causal):
    """Ragged sequences whose key starts are not 16-aligned (V^T's per-sequence columns), a
    length-1 and an empty sequence, a prefix, a sequence with no keys."""
    from mlagen import spec, variant

    v = variant.make(spec.load("mla_prefill_sm90_fp8"), {**schedule, "mask": "causal" if causal else "none"})
    shape = Shape("fp8", (5, 1, 0, 129, 300, 2), (5, 1, 0, 200, 300, 0) if causal else (5, 1, 3, 200, 300, 0), 16, causal)
    inputs = FAMILY.make_inputs(shape, "cuda", seed=21, dtype="fp8_e4m3")
    got = FAMILY.call(inputs, variant=v, check=True)
    torch.cuda.synchronize()
    check = FAMILY.compare(got, FAMILY.reference(shape, inputs, heads=None), dtype="fp8_e4m3")
    assert check.ok, f"{v.symbol}: {check.problem}"


@pytest.mark.skipif("mla_prefill_sm90_fp8" not in FP8_SPECS, reason=_NO_SM90_FP8)
@pytest.mark.parametrize("lengths", [(8192,), (5, 1, 0, 200, 77, 301), (16, 33, 0)])
def test_sm90_fp8_transpose_v_kernel_writes_the_torch_layout(lengths):
    """The pre-pass kernel's V^T, byte for byte, is tma.transpose_v's (the layout the CPU tests
    hold against the kernel's vt_column and pack_p), on a V whose heads are a strided slice."""
    import importlib

    from mlagen.families.mla_prefill import call as call_mod
    from mlagen.families.mla_prefill import entry

    tma = importlib.import_module("mlagen.families.mla_prefill.tma")
    total, heads = sum(lengths), 4
    cu = None if len(lengths) == 1 else torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()],
                                                     dtype=torch.int32, device="cuda")
    big = torch.randint(0, 120, (total, 2 * heads, 128), dtype=torch.uint8, device="cuda")
    v = big[:, 1::2].view(torch.float8_e4m3fn)  # finite e4m3 bit patterns, head stride 256 bytes
    q = torch.zeros(total, heads, 192, device="cuda").to(torch.float8_e4m3fn)
    k = torch.zeros(total, heads, 128, device="cuda").to(torch.float8_e4m3fn)
    kr = torch.zeros(total, 1, 64, device="cuda").to(torch.float8_e4m3fn)
    c = call_mod.prepare(call_mod.DenseArgs(q, k, v, k_rope=kr, cu_seqlens_q=cu, cu_seqlens_k=cu))
    from mlagen import spec, variant

    prepass = variant.make(spec.load("mla_prefill_sm90_fp8"), {"v_transpose": "prepass", "mask": "causal"})
    _, selection = entry.select(c, prepass)
    got = tma.launch_transpose_v(selection, c, torch.cuda.current_stream().cuda_stream)
    want = tma.transpose_v(v, cu, total, len(lengths))
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def _e4m3(x):
    """(e4m3 tensor, fp32 [1] descale) of float ``x``: its largest magnitude maps to 448."""
    d = (x.abs().amax().float().clamp_min(1e-12) / 448.0).reshape(1)
    return (x / d).clamp(-448, 448).to(torch.float8_e4m3fn), d


def _fp8_case(lq, lk, heads, rope="shared", strided=False, seed=0):
    """Packed FP8 inputs with per-tensor descales; like test_mla_prefill_gpu.make, views are
    taken after quantizing so that strided stays strided."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    tq, tk = sum(lq), sum(lk)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device="cuda")

    if strided:
        qb, qd = _e4m3(rnd(tq, heads + 1, 256))
        kvb, kd = _e4m3(rnd(tk, heads, 384))
        q, k, v, vd = qb[:, 1:, :192], kvb[:, :, :128], kvb[:, :, 256:384], kd
    else:
        (q, qd), (k, kd), (v, vd) = _e4m3(rnd(tq, heads, 192)), _e4m3(rnd(tk, heads, 128 + 64 * (rope == "folded"))), \
            _e4m3(rnd(tk, heads, 128))
    k_rope = None
    if rope in ("shared", "per_head"):
        k_rope = (rnd(tk, 1 if rope == "shared" else heads, 64) / kd).clamp(-448, 448).to(torch.float8_e4m3fn)
    cu = lambda ls: torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()], dtype=torch.int32, device="cuda")  # noqa: E731
    return dict(q=q, k=k, v=v, k_rope=k_rope, cu_seqlens_q=cu(lq), cu_seqlens_k=cu(lk), q_descale=qd, k_descale=kd,
                v_descale=vd)


def _check_fp8_call(a, causal=True, scale=None, out=None):
    from mlagen.families.mla_prefill.reference import reference as ref_fn
    from mlagen.families.mla_prefill.reference import FP8_REL_TOL, LSE_TOL

    got, lse = mlagen.mla_prefill(**a, causal=causal, softmax_scale=scale, out=out, kernel="mla_prefill_sm90_fp8")
    torch.cuda.synchronize()
    ref, ref_lse = ref_fn(**a, causal=causal, softmax_scale=scale)
    assert not torch.isnan(got.float()).any() and not torch.isnan(lse).any()
    rel = float((got.float() - ref).norm() / ref.norm())
    assert rel < FP8_REL_TOL, f"relative L2 error {rel:.3e}"
    # FAMILY.compare's bound (the H100 measured 9.3e-3 here at softmax_scale 0.3, 5e-4 on D1 at the default).
    assert float((lse - ref_lse).abs().max()) < LSE_TOL
    return got, lse


needs_sm90_fp8 = pytest.mark.skipif("mla_prefill_sm90_fp8" not in FP8_SPECS,
                                    reason=_NO_SM90_FP8)


@needs_sm90_fp8
@pytest.mark.parametrize("rope", ["shared", "per_head", "folded"])
@pytest.mark.parametrize("causal", [True, False])
def test_sm90_fp8_rope_layouts(rope, causal):
    _check_fp8_call(_fp8_case([100, 33], [150, 33], 16, rope=rope, seed=2), causal)


@needs_sm90_fp8
def test_sm90_fp8_strided_inputs_and_output_and_scale():
    a = _fp8_case([70, 190], [70, 250], 16, strided=True, seed=4)
    assert not a["q"].is_contiguous() and not a["v"].is_contiguous()
    out = torch.full((260, 16, 256), float("nan"), dtype=torch.bfloat16, device="cuda")[:, :, 64:192]
    got, _ = _check_fp8_call(a, causal=False, scale=0.3, out=out)
    assert got.data_ptr() == out.data_ptr()


@needs_sm90_fp8
def test_sm90_fp8_deterministic_and_graph_capture():
    a = _fp8_case([128, 64], [128, 96], 16, seed=8)
    out = torch.empty(192, 16, 128, dtype=torch.bfloat16, device="cuda")
    first, _ = _check_fp8_call(a, out=out)
    first = first.clone()
    graph = torch.cuda.CUDAGraph()
    out.fill_(float("nan"))
    with torch.cuda.graph(graph):
        mlagen.mla_prefill(**a, out=out, kernel="mla_prefill_sm90_fp8")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, first), "a graph replay differs from the eager call (or two runs differ: a race)"
    a["v"].copy_((torch.randn(a["v"].shape, device="cuda") / a["v_descale"]).clamp(-448, 448).to(torch.float8_e4m3fn))
    graph.replay()  # the captured kernel (and V^T pre-pass, if dispatched) reads the new V
    torch.cuda.synchronize()
    _check_fp8_call(a)  # eager on the new V
    assert torch.equal(out, mlagen.mla_prefill(**a, kernel="mla_prefill_sm90_fp8")[0])


@pytest.mark.skipif("mla_prefill_sm90_fp8" not in FP8_SPECS, reason=_NO_SM90_FP8)
@pytest.mark.parametrize("schedule", [{}, {**_C3, "producer_regs": 32, "rescale": "lazy", "pv_wait": "late",
                                           "epilogue": "direct", "diagonal": "half", "o_copy": "smem"},
                                      {"cluster": 2, "scheduler": "persistent", "block_n": 96, "swizzle_v": 32}],
                         ids=["default", "c3", "cluster"])
def test_sm90_fp8_v_transpose_in_kernel_equals_the_pre_pass(schedule):
    """V^T written by the kernel's transposing warps is the pre-pass's V^T tile for tile (the same
    keys in the same perm16 order, the same MMAs), so out and lse are bit for bit the same, on
    ragged sequences whose key starts are not 16-aligned, with poisoned outputs."""
    from mlagen import spec, variant

    sp = spec.load("mla_prefill_sm90_fp8")
    shape = Shape("fp8", (5, 1, 0, 129, 300, 2, 700), (5, 1, 0, 200, 300, 0, 900), 16, True)
    inputs = FAMILY.make_inputs(shape, "cuda", seed=5, dtype="fp8_e4m3")
    got = []
    for mode in ("kernel", "prepass"):
        v = variant.make(sp, {**schedule, "mask": "causal", "v_transpose": mode})
        out = torch.full((shape.total_q, 16, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((shape.total_q, 16), float("nan"), dtype=torch.float32, device="cuda")
        got.append(FAMILY.call(inputs, variant=v, outputs=(out, lse), check=True))
    torch.cuda.synchronize()
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    check = FAMILY.compare(got[0], FAMILY.reference(shape, inputs, heads=None), dtype="fp8_e4m3")
    assert check.ok, check.problem


def _biased_v_case(causal, variant=None):
    """V = 1 + 0.1 N(0, 1) on one 8192-key sequence, 2 heads: (least-squares ratio of out to the float32
    reference on the same e4m3 values, relative L2 error)."""
    torch.manual_seed(3)
    n, heads = 8192, 2
    e4 = torch.float8_e4m3fn
    q = torch.randn(n, heads, 192, device="cuda").to(e4)
    k = torch.randn(n, heads, 128, device="cuda").to(e4)
    k_rope = torch.randn(n, 1, 64, device="cuda").to(e4)
    v = (1.0 + 0.1 * torch.randn(n, heads, 128, device="cuda")).to(e4)
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    out = torch.full((n, heads, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    got, _ = mlagen.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=causal,
                                max_seqlen_q=n, max_seqlen_k=n, out=out,
                                kernel=variant if variant is not None else "mla_prefill_sm90_fp8")
    torch.cuda.synchronize()
    rows = torch.arange(0, n, 16, device="cuda")
    kk = torch.cat([k.float(), k_rope.float().expand(n, heads, 64)], -1)
    s = torch.einsum("rhd,nhd->hrn", q.float()[rows], kk) / 192 ** 0.5
    if causal:
        s = s.masked_fill(torch.arange(n, device="cuda")[None, None, :] > rows[None, :, None], float("-inf"))
    ref = torch.einsum("hrn,nhd->rhd", torch.softmax(s, -1), v.float())
    o = got.float()[rows]
    return float((o * ref).sum() / (ref * ref).sum()), float((o - ref).norm() / ref.norm())


_TWO_LEVEL = {
    "regs": {"block_n": 96, "swizzle_v": 32},
    "smem": {**_C3, "producer_regs": 32, "rescale": "lazy", "pv_wait": "late", "epilogue": "direct", "diagonal": "half",
             "o_copy": "smem"},
}


@needs_sm90_fp8
@pytest.mark.parametrize("o_flush", [1, 4])
@pytest.mark.parametrize("copy", ["regs", "smem"])
@pytest.mark.parametrize("causal", [False, True])
def test_sm90_fp8_two_level_accumulation_is_unbiased(causal, copy, o_flush):
    """With O added into an fp32 copy (registers, or shared memory) every o_flush key tiles, out has no
    bias from the FP8 wgmma accumulator on V with a channel mean; without it (o_flush 0) it has."""
    from mlagen import spec, variant

    def case(of):
        v = variant.make(spec.load("mla_prefill_sm90_fp8"),
                         {**_TWO_LEVEL[copy], "o_flush": of, "mask": "causal" if causal else "none",
                          **({"o_copy": "regs"} if of == 0 else {})})
        return _biased_v_case(causal, v)

    ratio, rel = case(o_flush)
    assert abs(ratio - 1.0) < 0.006 and rel < 0.01, f"out / reference {ratio:.4f}, relative L2 {rel:.4f}"
    ratio, rel = case(0)   # the test can fail: the single-level accumulator is biased on the same data
    assert ratio < 0.96, f"o_flush 0: out / reference {ratio:.4f}"


@needs_sm90_fp8
@pytest.mark.parametrize("causal", [False, True])
def test_sm90_fp8_out_unbiased_when_v_has_a_channel_mean(causal):
    """V = 1 + 0.1 N(0, 1) on one 8192-key sequence through dispatch (the shipped records, two-level
    accumulation every 4 tiles): out is the float32 reference on the same e4m3 values without bias. The
    random test data elsewhere draws zero-mean V, which hid the single-level accumulator's 0.85x
    (nineteenth session; this test was a strict xfail until the records changed)."""
    ratio, rel = _biased_v_case(causal)
    assert abs(ratio - 1.0) < 0.006 and rel < 0.01, f"out / reference {ratio:.4f}, relative L2 {rel:.4f}"
