"""AMD GPU path (ROCm torch, hip-python): hipRTC compile, load, launch, correctness.

Skipped with the reason anywhere without an AMD GPU and ROCm. The dense correctness suite in
test_mla_prefill_gpu.py also runs on an AMD GPU (its specs are those targeting the device), so
this file only checks what is HIP-specific: the compiler chosen, the code object, the target.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.amd]

torch = pytest.importorskip("torch")

from mlagen import render  # noqa: E402
from mlagen import spec as spec_mod  # noqa: E402
from mlagen import variant as variant_mod  # noqa: E402
from mlagen.backends import hip  # noqa: E402
from mlagen.backends.hip import HiprtcCompiler  # noqa: E402
from mlagen.runtime import device_info, runtime  # noqa: E402


def test_device_is_a_known_amd_target():
    info = device_info(torch.cuda.current_device())
    assert info.target is not None and info.target.vendor == "hip", info


def test_hiprtc_compiles_and_loads_the_default_variant():
    target = device_info(torch.cuda.current_device()).target
    spec = spec_mod.load(f"mla_prefill_{target.name}")
    v = variant_mod.make(spec, {})
    binary = HiprtcCompiler().compile(render.render(v), target.name, use_cache=False)
    assert binary.compiler.startswith("hiprtc ")
    assert not hip.check_code_object(binary.data, binary.symbol, target.name, ("v_mfma",))
    kernel = runtime().load(binary)
    assert kernel.binary is binary


def test_one_call_matches_the_reference():
    from mlagen import api
    from mlagen.families.mla_prefill.reference import reference

    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(300, 16, 192, generator=g, device="cuda").to(torch.bfloat16)
    k = torch.randn(310, 16, 128, generator=g, device="cuda").to(torch.bfloat16)
    v = torch.randn(310, 16, 128, generator=g, device="cuda").to(torch.bfloat16)
    kr = torch.randn(310, 1, 64, generator=g, device="cuda").to(torch.bfloat16)
    out, lse = api.mla_prefill(q, k, v, k_rope=kr, causal=True)
    ref, ref_lse = reference(q, k, v, k_rope=kr, causal=True)
    torch.cuda.synchronize()
    assert (out.float() - ref).norm() / ref.norm() < 1e-2
    assert (lse - ref_lse).abs().max() < 2e-3
