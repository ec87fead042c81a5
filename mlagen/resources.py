"""The resource model: what a variant will use, computed before anything is compiled.

The spec gives threads, shared memory and an estimate of registers per thread as expressions;
this module evaluates them for a target and prunes what cannot run, with a reason that says
which budget broke and by how much.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import arch, expr, families

if TYPE_CHECKING:  # variants are built above this layer (variant.py searches with check())
    from .variant import Variant


@dataclass(frozen=True)
class Resources:
    threads: int
    smem_bytes: int
    registers: int  # estimate per thread, before compiling

    @property
    def smem_kb(self) -> float:
        return self.smem_bytes / 1024


@dataclass(frozen=True)
class Verdict:
    variant: Variant
    target: arch.Target
    resources: Resources | None
    reasons: tuple[str, ...]  # why it was pruned; empty if it may be compiled

    @property
    def ok(self) -> bool:
        return not self.reasons


def estimate(variant: Variant) -> Resources:
    env = variant.env()
    values = {key: e(env) for key, e in variant.spec.resources}
    return Resources(int(values["threads"]), int(values["smem_bytes"]), int(values["registers"]))


def check(variant: Variant, target: arch.Target) -> Verdict:
    """Evaluate constraints and budgets; every broken rule becomes one reason. A verdict is a
    function of the variant (its spec included) and the target, so it is kept: the tuner's
    search and guesses ask for the same neighbours many times."""
    return _check(variant, target)


@functools.lru_cache(maxsize=1 << 16)
def _check(variant: Variant, target: arch.Target) -> Verdict:
    spec = variant.spec
    reasons: list[str] = []
    if target.name not in spec.targets:
        reasons.append(f"{spec.name} does not target {target.name} (targets: {', '.join(spec.targets)})")
    env = variant.env()
    for c in spec.constraints:
        try:
            ok = c.require(env)
        except expr.ExprError as exc:
            reasons.append(f"constraint {c.require.text!r} failed to evaluate: {exc}")
            continue
        if not ok:
            reasons.append(f"{c.message} (requires {c.require.text})")
    try:
        res = estimate(variant)
    except expr.ExprError as exc:
        return Verdict(variant, target, None, tuple(reasons + [f"resource model failed: {exc}"]))

    wave = target.wave_size
    if res.threads % wave or not wave <= res.threads <= target.max_threads_per_block:
        reasons.append(
            f"{res.threads} threads per block: must be a multiple of {wave} up to {target.max_threads_per_block}"
        )
    if res.smem_bytes > target.smem_per_block:
        over = res.smem_bytes - target.smem_per_block
        reasons.append(
            f"needs {res.smem_kb:.1f} KB of shared memory, {target.name} allows "
            f"{target.smem_per_block / 1024:.1f} KB per block ({over / 1024:.1f} KB over): "
            "lower block sizes or stages"
        )
    if res.registers > target.max_regs_per_thread:
        reasons.append(
            f"estimated {res.registers} registers per thread, the limit is {target.max_regs_per_thread}"
        )
    elif res.registers * res.threads > target.regs_per_sm:
        reasons.append(
            f"estimated {res.registers} registers x {res.threads} threads = {res.registers * res.threads} "
            f"exceeds the {target.regs_per_sm} registers of {'a CU' if target.vendor == 'hip' else 'an SM'}"
        )
    reasons.extend(families.get(spec.family).check_variant(variant, target, res))
    return Verdict(variant, target, res, tuple(reasons))
