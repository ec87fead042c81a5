"""The compile-time side of dense MLA prefill: spec checks, variant pruning, render values, and
which specs a call's tensors can take."""

from __future__ import annotations

from ... import resources
from .. import kit
from ...errors import SpecError
from . import schedule
from .call import FP8_DTYPES, INPUT_DTYPES, Call
from .params import ABIS, FP8_ABIS, TMA_ABIS, VT_PARAMS
from .problem import D_NOPE, D_ROPE, D_V, MASKS


def validate_spec(spec) -> None:
    """The problem parameters, the launcher, the specialisation axes, the Hopper schedule, and
    that the default variant meets the spec's own constraints."""
    problem = dict(spec.problem)
    expected = {"d_nope": D_NOPE, "d_rope": D_ROPE, "d_v": D_V}
    for key, value in expected.items():
        if problem.get(key) != value:
            raise SpecError(spec.path, f"problem.{key}",
                            f"{problem.get(key)!r}: this family implements {key} = {value!r}")
    dtype = problem.get("dtype")
    if dtype not in INPUT_DTYPES:
        raise SpecError(spec.path, "problem.dtype", f"{dtype!r}: the input types are {', '.join(INPUT_DTYPES)}")
    if spec.abi not in ABIS:
        raise SpecError(spec.path, "abi", f"{spec.abi!r} is not one of {sorted(ABIS)}")
    if (spec.abi in FP8_ABIS) != (dtype in FP8_DTYPES):
        raise SpecError(spec.path, "abi", f"{spec.abi!r} with problem.dtype {dtype!r}: fp8 inputs take the "
                                          f"simt_fp8 or tma_fp8 launcher, bf16 inputs simt or tma")
    axes = dict(spec.specialize)
    if set(axes) != {"mask"} or not set(axes["mask"]) <= set(MASKS):
        raise SpecError(spec.path, "specialize", f"this family specialises on mask only, values from {list(MASKS)}")
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
        ctx["schedule"] = schedule.render_schedule(v)
        ctx["elem_bytes"] = schedule.element_bytes(v.spec)
        if ctx["elem_bytes"] == 1:
            ctx["vt_params_decl"] = VT_PARAMS.c_declaration()
    return ctx


def spec_dtype(spec) -> str:
    """The input dtype name a spec's kernels take (its ``problem.dtype``)."""
    return dict(spec.problem).get("dtype", "bf16")


def accepts(spec, call: Call) -> bool:
    """Whether ``spec``'s kernels can take this call's tensors (their dtype, and TMA's alignment)."""
    if spec_dtype(spec) != call.dtype:
        return False
    return spec.abi not in TMA_ABIS or call.tma_compatible() is None
