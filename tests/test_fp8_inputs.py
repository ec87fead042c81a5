"""FP8 (e4m3) inputs of dense MLA prefill, without a GPU: argument checking (TypeError for dtype
mixes, ValueError for descale shapes), the fake implementation's outputs, the reference's
dequantization, random fp8 inputs, the dtype in dispatch keys and spec filtering, and the one-line
error on a device with no FP8 kernel. tests/gpu runs the FP8 kernels on an AMD device."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import mlagen  # noqa: E402
from mlagen import arch, dispatch, runtime  # noqa: E402
from mlagen.errors import ArgumentError, ArgumentTypeError, LaunchError  # noqa: E402
import importlib  # noqa: E402

from mlagen.families.mla_prefill import entry  # noqa: E402
from mlagen.families.mla_prefill.call import Call, DenseArgs, check_descales  # noqa: E402
from mlagen.families.mla_prefill.problem import Shape  # noqa: E402

# The package re-exports functions named like these modules, so import the modules by path.
ref_mod = importlib.import_module("mlagen.families.mla_prefill.reference")
dense_compile = importlib.import_module("mlagen.families.mla_prefill.compile")

E4M3 = torch.float8_e4m3fn
FNUZ = torch.float8_e4m3fnuz


def fake_fp8(dtype=E4M3, tq=10, tk=12, h=4):
    q = torch.empty(tq, h, 192, dtype=dtype, device="cuda")
    k = torch.empty(tk, h, 128, dtype=dtype, device="cuda")
    kr = torch.empty(tk, 1, 64, dtype=dtype, device="cuda")
    v = torch.empty(tk, h, 128, dtype=dtype, device="cuda")
    return q, k, kr, v


@pytest.mark.parametrize("dtype", [E4M3, FNUZ])
def test_fp8_inputs_give_bf16_out_and_fp32_lse(dtype):
    with FakeTensorMode():
        q, k, kr, v = fake_fp8(dtype)
        d = torch.empty(4, device="cuda")
        out, lse = mlagen.mla_prefill(q, k, v, k_rope=kr, q_descale=d, k_descale=torch.empty(1, device="cuda"),
                                      v_descale=d)
        assert (tuple(out.shape), out.dtype) == ((10, 4, 128), torch.bfloat16)
        assert (tuple(lse.shape), lse.dtype) == ((10, 4), torch.float32)


@pytest.mark.parametrize("change, error, match", [
    (lambda a: {**a, "k": a["k"].to(torch.bfloat16)}, TypeError,
     "k: dtype must be torch.float8_e4m3fn like q .* got torch.bfloat16"),
    (lambda a: {**a, "v": a["v"].to(FNUZ)}, TypeError, "v: dtype must be torch.float8_e4m3fn like q"),
    (lambda a: {**a, "k_rope": a["k_rope"].to(torch.bfloat16)}, TypeError, "k_rope: dtype must be"),
    (lambda a: {**a, "q_descale": torch.empty(3, device="cuda")}, ValueError,
     r"q_descale: expected shape \[1\] \(per tensor\) or \[4\] \(per head\), got \(3,\)"),
    (lambda a: {**a, "k_descale": torch.empty(1, 1, device="cuda")}, ValueError, "k_descale: expected shape"),
    (lambda a: {**a, "v_descale": torch.empty(1, dtype=torch.bfloat16, device="cuda")}, TypeError,
     "v_descale: dtype must be torch.float32"),
    (lambda a: {**a, "v_descale": 2.0}, TypeError, "v_descale: expected a torch.Tensor"),
])
def test_fp8_argument_errors(change, error, match):
    with FakeTensorMode():
        q, k, kr, v = fake_fp8()
        args = change({"q": q, "k": k, "v": v, "k_rope": kr})
        with pytest.raises(error, match=match) as info:
            mlagen.mla_prefill(**args)
        assert isinstance(info.value, LaunchError)


def test_descales_are_for_fp8_inputs_only():
    q = torch.zeros(4, 2, 192, dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match="q_descale: descale factors apply to fp8 inputs only; q is torch.bfloat16"):
        check_descales(torch, DenseArgs(q, None, None, q_descale=torch.ones(1)))
    with pytest.raises(ArgumentTypeError, match="q: dtype must be one of torch.bfloat16, torch.float8_e4m3fn, "
                                                "torch.float8_e4m3fnuz, got torch.float16"):
        check_descales(torch, DenseArgs(q.half(), None, None))
    assert check_descales(torch, DenseArgs(q.to(FNUZ), None, None, q_descale=torch.ones(2))) == "fp8_e4m3fnuz"
    assert check_descales(torch, DenseArgs(q.to(E4M3), None, None)) == "fp8_e4m3"


def test_reference_dequantizes_per_tensor_and_per_head():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(7, 3, 192, generator=g).to(E4M3)
    k = torch.randn(9, 3, 128, generator=g).to(E4M3)
    kr = torch.randn(9, 1, 64, generator=g).to(E4M3)
    v = torch.randn(9, 3, 128, generator=g).to(E4M3)
    qd, kd, vd = torch.tensor([0.5, 2.0, 0.25]), torch.tensor([0.125]), torch.tensor([1.0, 3.0, 0.5])
    got = ref_mod.reference(q, k, v, k_rope=kr, q_descale=qd, k_descale=kd, v_descale=vd)
    real = (q.double() * qd.double().view(1, 3, 1), k.double() * 0.125, kr.double() * 0.125,
            v.double() * vd.double().view(1, 3, 1))
    want = ref_mod.reference(real[0], real[1], real[3], k_rope=real[2])
    assert torch.allclose(got[0], want[0]) and torch.allclose(got[1], want[1])
    # The descales matter: without them the result differs.
    plain = ref_mod.reference(q, k, v, k_rope=kr)
    assert not torch.allclose(plain[0], want[0], atol=1e-3)


@pytest.mark.parametrize("dtype, torch_dtype, limit", [("fp8_e4m3", E4M3, 448.0), ("fp8_e4m3fnuz", FNUZ, 240.0)])
def test_fp8_inputs_of_a_shape(dtype, torch_dtype, limit):
    shape = Shape("t", (5, 9), (7, 9), 3, True)
    inputs = mlagen.families.get("mla_prefill").make_inputs(shape, "cpu", seed=3, dtype=dtype)
    for name in ("q", "k", "k_rope", "v"):
        assert inputs[name].dtype == torch_dtype and bool(torch.isfinite(inputs[name].float()).all())
    assert inputs["q_descale"].shape == (3,) and inputs["v_descale"].shape == (3,)
    assert inputs["k_descale"].shape == (1,)
    # Each head's (the tensor's) largest magnitude lands on the format's largest value.
    assert float(inputs["q"].float().abs().amax()) == limit
    deq = inputs["q"].float() * inputs["q_descale"].view(1, 3, 1)
    assert 0.5 < float(deq.std()) < 2.0  # standard-normal values survive the round trip
    out, lse = mlagen.families.get("mla_prefill").reference(shape, inputs, heads=None)
    assert out.shape == (14, 3, 128) and bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
    with pytest.raises(ValueError, match="dtype 'fp16'"):
        ref_mod.make_inputs(shape, "cpu", dtype="fp16")


def test_fp8_comparison_uses_its_tolerance():
    family = mlagen.families.get("mla_prefill")
    ref = torch.randn(6, 2, 128, dtype=torch.float64), torch.zeros(6, 2, dtype=torch.float64)
    got = ((ref[0] * (1 + 0.03)).to(torch.bfloat16), ref[1].float())  # 3% relative error
    assert not family.compare(got, ref).ok
    assert family.compare(got, ref, dtype="fp8_e4m3").ok
    assert ref_mod.REL_TOL < ref_mod.FP8_REL_TOL


def test_record_keys_and_spec_filter_by_dtype(monkeypatch):
    # The compiler part of a key needs an AMD compiler on this machine; what is tested is the dtype.
    monkeypatch.setattr(dispatch, "_compiler_id", lambda target: "test-compiler 1.0")
    specs = {s.name: s for s in dispatch.family_specs("mla_prefill")}
    gfx950 = arch.target("gfx950")
    key = dispatch.record_key(specs["mla_prefill_gfx950_fp8"], "causal/h16/q1024/k1024", device="MI355X",
                              sm_count=256, driver="6.4", target=gfx950)
    assert key.dtypes == "fp8_e4m3"
    assert dispatch.record_key(specs["mla_prefill_gfx950"], "causal/h16/q1024/k1024", device="MI355X",
                               sm_count=256, driver="6.4", target=gfx950).dtypes == "bf16"
    assert dense_compile.spec_dtype(specs["mla_prefill_gfx942_fp8"]) == "fp8_e4m3fnuz"
    call = Call(*[None] * 10, heads=1, batch=1, scale=1.0, rope="shared", args=DenseArgs(None, None, None), dtype="fp8_e4m3")
    assert dense_compile.accepts(specs["mla_prefill_gfx950_fp8"], call)
    assert not dense_compile.accepts(specs["mla_prefill_gfx950"], call)
    assert not dense_compile.accepts(specs["mla_prefill_gfx942_fp8"], call)
    assert dense_compile.spec_dtype(specs["mla_prefill_sm90_fp8"]) == "fp8_e4m3"
    assert entry.dtype_targets("fp8_e4m3") == {"gfx950": ["mla_prefill_gfx950_fp8"], "sm_90a": ["mla_prefill_sm90_fp8"]}
    assert entry.dtype_targets("fp8_e4m3fnuz") == {"gfx942": ["mla_prefill_gfx942_fp8"]}


@pytest.mark.parametrize("device, arch_name, dtype, match", [
    ("NVIDIA H100 80GB HBM3", "", "fp8_e4m3fnuz",
     r"^mla_prefill: q: fp8_e4m3fnuz inputs \(torch.float8_e4m3fnuz\) have no kernel for sm_90a; fp8 kernels: "
     r"float8_e4m3fn on gfx950, sm_90a; float8_e4m3fnuz on gfx942$"),
    ("AMD Instinct MI300X", "gfx942", "fp8_e4m3", "fp8_e4m3 inputs .* have no kernel for gfx942"),
    ("AMD Instinct MI355X", "gfx950", "fp8_e4m3fnuz", "fp8_e4m3fnuz inputs .* have no kernel for gfx950"),
])
def test_no_fp8_kernel_is_one_clear_line(monkeypatch, device, arch_name, dtype, match):
    info = runtime.DeviceInfo(0, device, (9, 0) if not arch_name else (9, 4), 132, "13.0", 232448, 50 << 20,
                              arch_name)
    monkeypatch.setattr(runtime, "device_info", lambda index=0: info)
    call = Call(*[None] * 10, heads=1, batch=1, scale=1.0, rope="shared", args=DenseArgs(None, None, None), dtype=dtype)
    with pytest.raises(ArgumentTypeError, match=match) as exc:
        entry.check_dtype_supported(call, 0)
    assert "\n" not in str(exc.value)
    entry.check_dtype_supported(Call(*[None] * 10, heads=1, batch=1, scale=1.0, rope="shared",
                                     args=DenseArgs(None, None, None)), 0)

