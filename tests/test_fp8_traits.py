"""The FP8 dense kernel's mask and score traits without a GPU (MLA.md section 1b): the
mla_prefill_sm90_fp8 spec specialises on the masks and scores of the bf16 kernel and on the d_v 128
geometries (128 / 64 / 128, 128 / 0 / 128), every specialisation renders its traits and the new
ones compile for sm_90a without spills (NVRTC), clusters stay refused for a band with a lower
bound, dispatch accepts FP8 calls with window_size / chunk_size / softcap / attn_sink and still
names the argument for a geometry the FP8 kernel lacks (GLM-5's). tests/gpu/test_fp8_traits_gpu.py
runs the kernels."""

from __future__ import annotations

import itertools
import types

import pytest

from mlagen import arch, render, resources, variant
from mlagen import spec as spec_mod
from mlagen.errors import ArgumentError
from mlagen.families.mla_prefill import problem

FP8 = spec_mod.load("mla_prefill_sm90_fp8")
SM90A = arch.target("sm_90a")
AXES = dict(FP8.specialize)


def test_the_fp8_spec_has_the_masks_and_scores_of_the_family_and_the_d_v_128_geometries():
    assert AXES["mask"] == problem.MASKS
    assert AXES["score"] == problem.SCORES
    assert AXES["geometry"] == ("n128r64v128", "n128r0v128")   # not GLM-5's 192 / 64 / 256
    assert AXES["geometry"][0] == problem.DEFAULT_GEOMETRY
    for geometry in AXES["geometry"]:
        env = variant.make(FP8, {"geometry": geometry}).env()
        assert (env["d_nope"], env["d_rope"], env["d_v"]) == problem.GEOMETRIES[geometry]


def test_the_old_fp8_kernels_render_the_same_config():
    """The default specialisation is the kernel of before (its symbol gains the geometry and the
    score: _n128r64v128_plain_)."""
    old = variant.make(FP8, {"mask": "causal"})
    assert old.specialization == {"mask": "causal", "geometry": "n128r64v128", "score": "plain"}
    assert old.symbol.startswith("mla_prefill_sm90_fp8_causal_n128r64v128_plain_c2_")
    text = render.render(old).text
    assert "kMask = mlagen::MaskKind::kCausal" in text and "kSoftcap = false" in text and "kSink = false" in text
    assert "kElemBytes = 1" in text


@pytest.mark.parametrize("mask,geometry,score", list(itertools.product(AXES["mask"], AXES["geometry"], AXES["score"])))
def test_every_fp8_specialisation_renders_its_traits(mask, geometry, score):
    v = resources.feasible_default(FP8, SM90A, {"mask": mask, "geometry": geometry, "score": score})
    assert v is not None and resources.check(v, SM90A).ok
    text = render.render(v).text
    assert f"kMask = mlagen::MaskKind::k{mask.capitalize()};" in text
    assert f"kSoftcap = {'true' if 'softcap' in score else 'false'};" in text
    assert f"kSink = {'true' if 'sink' in score else 'false'};" in text
    assert "kElemBytes = 1;" in text
    d_nope, d_rope, d_v = problem.GEOMETRIES[geometry]
    assert f"kDNope = {d_nope};" in text and f"kDRope = {d_rope};" in text and f"kDV = {d_v};" in text
    assert v.symbol.startswith(f"mla_prefill_sm90_fp8_{mask}_{geometry}_{score}_")
    assert variant.from_symbol(FP8, v.symbol) == v


def test_window_and_chunked_refuse_clusters_with_fp8_too():
    for mask in ("window", "chunked"):
        v = variant.make(FP8, {"mask": mask, "cluster": 2, "scheduler": "static"})
        assert any("lower bound" in r for r in resources.check(v, SM90A).reasons), mask
    assert resources.check(variant.make(FP8, {"mask": "causal", "cluster": 2, "scheduler": "static"}), SM90A).ok


# Each new mask with the plain score and each new score on the window mask (the defaults), the
# geometry without a rope part, and the schedules that move the code the traits touch: the H100
# FP8 records' (three consumers, the O copy in shared memory, lazy rescale, half diagonal), the V^T
# pre-pass, Q in registers.
_RECORD = {"consumers": 3, "order": "none", "consumer_regs": 160, "rescale": "lazy", "pv_wait": "late",
           "load_warps": 1, "o_copy": "smem", "diagonal": "half"}
COMPILED = ([({"mask": m}, "default") for m in ("window", "chunked")]
            + [({"mask": "window", "score": s}, "default") for s in ("softcap", "sink", "softcap_sink")]
            + [({**_RECORD, "mask": "window", "score": "softcap_sink"}, "record"),
               ({**_RECORD, "mask": "chunked", "score": "sink"}, "record"),
               ({"mask": "chunked", "score": "softcap", "v_transpose": "prepass", "scheduler": "persistent"}, "prepass"),
               ({"mask": "window", "score": "softcap_sink", "q_operand": "regs", "block_n": 64},
                "q-regs"),
               ({"mask": "causal", "geometry": "n128r0v128"}, "default"),
               ({"mask": "window", "geometry": "n128r0v128", "score": "softcap_sink"}, "default"),
               ({**_RECORD, "mask": "causal", "geometry": "n128r0v128"}, "record"),
               ({"mask": "chunked", "geometry": "n128r0v128", "score": "sink", "q_operand": "regs", "block_n": 96},
                "q-regs")])


@pytest.fixture(scope="module")
def nvrtc(tmp_path_factory):
    from mlagen.backends import cuda

    tmp = tmp_path_factory.mktemp("fp8traits")
    return cuda.NvrtcCompiler(cache_dir=tmp / "cache", source_dir=tmp / "src")


_IDS = [f"{v['mask']}-{v.get('geometry', 'n128r64v128')}-{v.get('score', 'plain')}-{w}" for v, w in COMPILED]


@pytest.mark.parametrize("values,what", COMPILED, ids=_IDS)
def test_fp8_traits_compile_for_sm90a_without_spills(nvrtc, values, what):
    v = resources.feasible_default(FP8, SM90A, values) if what == "default" else variant.make(FP8, values)
    assert resources.check(v, SM90A).ok, resources.check(v, SM90A).reasons
    assert v.specialization == {"mask": values["mask"], "geometry": values.get("geometry", "n128r64v128"),
                                "score": values.get("score", "plain")}
    b = nvrtc.compile(render.render(v), "sm_90a")
    assert b.data[:4] == b"\x7fELF" and v.symbol.encode() in b.data
    r = b.resources
    assert not r.spills and r.stack_bytes == 0, (v.symbol, r)


def test_a_glm5_fp8_variant_fails_the_geometry_assert(nvrtc):
    """The template's static_assert holds the FP8 kernel to d_v 128: rendered with GLM-5's widths
    it does not compile (what keeps 192 / 64 / 256 out of the FP8 spec's geometry axis)."""
    v = variant.make(FP8, {})
    text = render.render(v).text
    assert "the FP8 kernel implements the 128 / 64 / 128 and 128 / 0 / 128 geometries" in text
    glm = text.replace("kDNope = 128;", "kDNope = 192;").replace("kDV = 128;", "kDV = 256;")
    assert glm != text
    from dataclasses import replace

    from mlagen.errors import CompileError

    with pytest.raises(CompileError, match="the FP8 kernel implements the 128 / 64 / 128 and 128 / 0 / 128"):
        nvrtc.compile(replace(render.render(v), text=glm), "sm_90a")


# --- dispatch --------------------------------------------------------------------------------------


def _call(dtype, **traits):
    from mlagen.families.mla_prefill.traits import Traits

    return types.SimpleNamespace(dtype=dtype, traits=Traits(**traits), tma_compatible=lambda: None)


@pytest.mark.parametrize("traits", [dict(mask="window", window=(100, 0)), dict(mask="chunked", chunk=100),
                                    dict(softcap=30.0), dict(attn_sink=object()),
                                    dict(mask="window", window=(5, 3), softcap=2.0, attn_sink=object()),
                                    dict(geometry="n128r0v128"), dict(geometry="n128r0v128", softcap=3.0)],
                         ids=["window", "chunked", "softcap", "sink", "all", "no-rope", "no-rope-softcap"])
def test_fp8_calls_with_traits_pick_the_fp8_spec(monkeypatch, traits):
    from mlagen.families.mla_prefill import entry
    from mlagen.families.mla_prefill.compile import accepts

    call = _call("fp8_e4m3", **traits)
    assert accepts(FP8, call)
    assert not accepts(spec_mod.load("mla_prefill_sm90"), call)   # dtype
    monkeypatch.setattr(entry.runtime, "device_info", lambda device: types.SimpleNamespace(target=SM90A))
    entry.check_traits_supported(call, 0)   # no refusal any more


def test_an_fp8_geometry_without_a_kernel_names_the_argument(monkeypatch):
    from mlagen.families.mla_prefill import entry
    from mlagen.families.mla_prefill.compile import accepts

    call = _call("fp8_e4m3", geometry="n192r64v256")
    assert not accepts(FP8, call)
    monkeypatch.setattr(entry.runtime, "device_info", lambda device: types.SimpleNamespace(target=SM90A))
    with pytest.raises(ArgumentError, match="mla_prefill: q: mask causal, geometry n192r64v256 has fp8_e4m3 kernels "
                                            "for no target"):
        entry.check_traits_supported(call, 0)


def test_fp8_problem_keys_and_tuner_specialisation_carry_the_traits():
    """The tuner holds a class's specialisation fixed (FAMILY.specialization) for FP8 like bf16."""
    from mlagen.families import get as get_family

    fam = get_family("mla_prefill")
    shape = problem.parse_shape("b=2,q=1000,h=16,window=127/0,softcap=30,sink")
    spec = fam.specialization(shape)
    assert spec == {"mask": "window", "score": "softcap_sink"}
    v = resources.feasible_default(FP8, SM90A, spec)
    assert v.specialization == {**spec, "geometry": "n128r64v128"}
    key = problem.shape_key(shape)
    assert str(key).startswith("window+softcap_sink/h16/")
    assert fam.problem_specialization(str(key)) == spec
    from mlagen.tune.loop import class_fixed

    fixed = class_fixed(FP8, shape, types.SimpleNamespace(fixed={}))
    assert (fixed["mask"], fixed["score"]) == ("window", "softcap_sink")


def test_fp8_inputs_and_reference_without_a_rope_part():
    """make_inputs quantizes 128 / 0 / 128 operands (k's descale from k alone) and the reference runs
    on them; the GPU tests compare the kernel with it."""
    import torch

    from mlagen.families.mla_prefill import reference as ref

    shape = problem.Shape("t", (5, 1), (7, 0), 2, True, "n128r0v128", (2, 0), 0, 3.0, True)
    inputs = ref.make_inputs(shape, "cpu", 0, "fp8_e4m3")
    assert inputs["k_rope"] is None and inputs["k"].dtype == torch.float8_e4m3fn and inputs["k"].shape[2] == 128
    assert inputs["k_descale"].shape == (1,) and inputs["q_descale"].shape == (2,)
    out, lse = ref.reference_heads(shape, inputs, heads=None)
    assert out.shape == (6, 2, 128) and bool(torch.isfinite(out).all())
    assert bool(torch.isinf(lse[5]).all())   # the second sequence has no keys
