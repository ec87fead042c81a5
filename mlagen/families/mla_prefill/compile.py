"""The compile-time side of dense MLA prefill: spec checks, variant pruning, render values, and
which specs a call's tensors can take."""

from __future__ import annotations

from ... import resources
from .. import kit
from ...errors import SpecError
from . import schedule
from .call import FP8_DTYPES, INPUT_DTYPES, Call
from .params import ABIS, FP8_ABIS, TMA_ABIS, VT_PARAMS
from .problem import DEFAULT_GEOMETRY, GEOMETRIES, MASKS, SCORES, geometry_dims


def validate_spec(spec) -> None:
    """The problem parameters, the launcher, the specialisation axes, the Hopper schedule, and
    that the default variant meets the spec's own constraints."""
    from ... import variant

    problem = dict(spec.problem)
    axes = dict(spec.specialize)
    allowed = {"mask": MASKS, "geometry": tuple(GEOMETRIES), "score": SCORES}
    for key, values in axes.items():
        if key not in allowed or not set(values) <= set(allowed[key]):
            raise SpecError(spec.path, "specialize", f"{key}: this family specialises on mask (values from "
                            f"{list(MASKS)}), geometry ({list(GEOMETRIES)}) and score ({list(SCORES)})")
    if "mask" not in axes:
        raise SpecError(spec.path, "specialize.mask", "required: the masks the kernels implement")
    # The widths of each geometry: problem data, or derived from the geometry axis.
    for geometry in axes.get("geometry", (DEFAULT_GEOMETRY,)):
        if "geometry" not in axes and geometry not in GEOMETRIES:
            continue
        env = variant.make(spec, {"geometry": geometry} if "geometry" in axes else {}).env()
        for key, value in zip(("d_nope", "d_rope", "d_v"), geometry_dims(geometry)):
            if env.get(key) != value:
                where = f"problem.{key}" if key in problem else f"derived.{key}"
                raise SpecError(spec.path, where, f"{env.get(key)!r}: this family implements {key} = {value!r} for "
                                f"geometry {geometry} (a geometry axis names the others)")
    dtype = problem.get("dtype")
    if dtype not in INPUT_DTYPES:
        raise SpecError(spec.path, "problem.dtype", f"{dtype!r}: the input types are {', '.join(INPUT_DTYPES)}")
    if spec.abi not in ABIS:
        raise SpecError(spec.path, "abi", f"{spec.abi!r} is not one of {sorted(ABIS)}")
    if (spec.abi in FP8_ABIS) != (dtype in FP8_DTYPES):
        raise SpecError(spec.path, "abi", f"{spec.abi!r} with problem.dtype {dtype!r}: fp8 inputs take the "
                                          f"simt_fp8 or tma_fp8 launcher, bf16 inputs simt or tma")
    if spec.abi in TMA_ABIS:
        schedule.validate_spec(spec)
    kit.check_default_constraints(spec)


def check_variant(v, target, res) -> list[str]:
    if v.spec.abi in TMA_ABIS:
        return schedule.check_variant(v, target, res)
    return []


def render_context(v) -> dict:
    ctx = {"params_decl": ABIS[v.spec.abi].c_declaration(), "smem_bytes": resources.estimate(v).smem_bytes}
    if v.spec.abi in TMA_ABIS:
        score = v.get("score", "plain")
        ctx["traits"] = {"mask": v["mask"], "softcap": "softcap" in score, "sink": "sink" in score}
        ctx["schedule"] = schedule.render_schedule(v)
        ctx["elem_bytes"] = schedule.element_bytes(v.spec)
        if ctx["elem_bytes"] == 1:
            ctx["vt_params_decl"] = VT_PARAMS.c_declaration()
    return ctx


def spec_dtype(spec) -> str:
    """The input dtype name a spec's kernels take (its ``problem.dtype``)."""
    return dict(spec.problem).get("dtype", "bf16")


def accepts(spec, call: Call) -> bool:
    """Whether ``spec``'s kernels can take this call's tensors (their dtype, and TMA's alignment)
    and traits (a spec without a geometry or score axis implements only the default)."""
    if spec_dtype(spec) != call.dtype:
        return False
    axes = dict(spec.specialize)
    if any(value not in axes.get(name, ()) for name, value in call.traits.specialization().items()):
        return False
    return spec.abi not in TMA_ABIS or call.tma_compatible() is None
