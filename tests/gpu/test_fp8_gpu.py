"""FP8 (e4m3) inputs of dense MLA prefill on the GPU.

On a device with an FP8 kernel (gfx950: OCP e4m3; gfx942: FNUZ e4m3) every FP8 spec targeting
it runs ragged, causal and non-causal batches with per-head and per-tensor descales against the
float32 reference on the dequantized inputs (``FP8_REL_TOL``; the emulated error is ~2.4%, see
tests/test_hip_mfma_layout.py). On any other device (the H100 today) an FP8 call must fail with
one clear line naming the dtype and the targets that have FP8 kernels.
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
FP8_SPECS = {s.name: dict(s.problem)["dtype"] for s in family_specs("mla_prefill")
             if TARGET in s.targets and dict(s.problem)["dtype"].startswith("fp8")}
needs_fp8_kernel = pytest.mark.skipif(not FP8_SPECS, reason=f"no FP8 kernel targets {TARGET} (gfx942/gfx950 only)")


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


@pytest.mark.skipif(TARGET is None or bool(FP8_SPECS), reason="needs a GPU without FP8 kernels (e.g. the H100)")
def test_fp8_inputs_without_a_kernel_fail_in_one_line():
    q = torch.zeros(8, 2, 192, device="cuda").to(torch.float8_e4m3fn)
    k = torch.zeros(8, 2, 128, device="cuda").to(torch.float8_e4m3fn)
    kr = torch.zeros(8, 1, 64, device="cuda").to(torch.float8_e4m3fn)
    with pytest.raises(TypeError, match=rf"fp8_e4m3 inputs \(torch.float8_e4m3fn\) have no kernel for {TARGET}; "
                                        r"fp8 kernels: float8_e4m3fn on gfx950; float8_e4m3fnuz on gfx942") as exc:
        mlagen.mla_prefill(q, k, k, k_rope=kr)
    assert "\n" not in str(exc.value)
