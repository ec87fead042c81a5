"""The resource model: what a variant will use, computed before anything is compiled.

The spec gives threads, shared memory and an estimate of registers per thread as expressions;
this module evaluates them for a target and prunes what cannot run, with a reason that says
which budget broke and by how much. It also finds the variants nearest to one that does not fit
which do (:func:`feasible_default`, :func:`nearest_feasible`, :func:`feasible_neighbours`).
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from . import arch, expr, families
from .spec import KernelSpec
from .variant import Variant, make


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
    return _estimate(variant.spec, variant.env())


def _estimate(spec: KernelSpec, env: Mapping[str, Any]) -> Resources:
    values = {key: e(env) for key, e in spec.resources}
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

    reasons.extend(_budget_reasons(res, target))
    reasons.extend(families.get(spec.family).check_variant(variant, target, res))
    return Verdict(variant, target, res, tuple(reasons))


def _budget_reasons(res: Resources, target: arch.Target) -> list[str]:
    """Every budget of ``target`` that ``res`` breaks, as a reason."""
    out: list[str] = []
    wave = target.wave_size
    if res.threads % wave or not wave <= res.threads <= target.max_threads_per_block:
        out.append(
            f"{res.threads} threads per block: must be a multiple of {wave} up to {target.max_threads_per_block}"
        )
    if res.smem_bytes > target.smem_per_block:
        over = res.smem_bytes - target.smem_per_block
        out.append(
            f"needs {res.smem_kb:.1f} KB of shared memory, {target.name} allows "
            f"{target.smem_per_block / 1024:.1f} KB per block ({over / 1024:.1f} KB over): "
            "lower block sizes or stages"
        )
    if res.registers > target.max_regs_per_thread:
        out.append(
            f"estimated {res.registers} registers per thread, the limit is {target.max_regs_per_thread}"
        )
    elif res.registers * res.threads > target.regs_per_sm:
        out.append(
            f"estimated {res.registers} registers x {res.threads} threads = {res.registers * res.threads} "
            f"exceeds the {target.regs_per_sm} registers of {'a CU' if target.vendor == 'hip' else 'an SM'}"
        )
    return out


# --- the nearest variants that fit ------------------------------------------------------------


def feasible_default(spec: KernelSpec, target: arch.Target, specialization: Mapping[str, Any] | None = None,
                     limit: int = 100_000) -> Variant | None:
    """The spec's default if it fits ``target``, else the variant closest to it that does.

    Closest means fewest tunables changed, then the earliest values in each tunable's list (specs
    list preferred values first). Searches at most ``limit`` candidates; None if none fits.
    """
    return nearest_feasible(make(spec, dict(specialization or {})), target, limit=limit)


def nearest_feasible(base: Variant, target: arch.Target, keep: Iterable[str] = (), max_changes: int | None = None,
                     limit: int = 100_000) -> Variant | None:
    """``base`` if it fits ``target``, else the closest variant that does without touching the
    tunables named in ``keep``: fewest tunables changed (at most ``max_changes``), then the
    earliest values in each tunable's list. Searches at most ``limit`` candidates; None if none
    fits."""
    return next(iter(feasible_neighbours(base, target, keep, max_changes, limit)), None)


@dataclass(frozen=True)
class _Rules:
    """Which search axes each constraint and the resource model read (through derived names)."""

    constraints: tuple[tuple[frozenset[str], expr.Expr], ...]
    resource_axes: frozenset[str]


@functools.lru_cache(maxsize=64)
def _rules(spec: KernelSpec) -> _Rules:
    axes = set(spec.axes)
    reads: dict[str, frozenset[str]] = {}

    def axes_of(e: expr.Expr) -> frozenset[str]:
        return frozenset(n for n in e.names if n in axes).union(*(reads[n] for n in e.names if n in reads))

    for key, e in spec.derived:   # in order: a derived name reads only names defined before it
        reads[key] = axes_of(e)
    return _Rules(tuple((axes_of(c.require), c.require) for c in spec.constraints),
                  frozenset().union(*(axes_of(e) for _, e in spec.resources)))


def feasible_neighbours(base: Variant, target: arch.Target, keep: Iterable[str] = (),
                        max_changes: int | None = None, limit: int = 100_000) -> list[Variant]:
    """``[base]`` if it fits ``target``; else every fitting variant at the smallest number of
    changed tunables (at most ``max_changes``, never those in ``keep``), nearest first: in the
    order of the changed tunables and of their value lists. Checks at most ``limit`` candidates.

    The candidates of one set of changed tunables are walked depth first in that order, and a
    constraint (or the resource budgets) is tested as soon as every axis it reads has its value:
    one that fails there fails every candidate below, which are skipped and counted as checked
    (so ``limit`` cuts where a check of each would). A specialisation that nothing fits costs
    the constraints it breaks, not the whole space (82,944 candidates for each FP8 cache format
    of ``mla_sparse_prefill_sm90_h16`` at d_qk 512: 90 s of a cached ``mlagen check``)."""
    if check(base, target).ok:
        return [base]
    spec = base.spec
    if target.name not in spec.targets:
        return []   # every candidate fails on this alone
    kept = set(keep)
    free = [t for t in spec.tunables if len(t.values) > 1 and t.name not in kept]
    most = len(free) if max_changes is None else min(max_changes, len(free))
    rules = _rules(spec)
    family = families.get(spec.family)
    names = [k for k, _ in base.values]
    base_values = dict(base.values)
    tried = 0

    class _Limit(Exception):
        pass

    def walk(axes: tuple, choices: list[list], depth: int, values: dict, tests: list[list], found: list) -> None:
        nonlocal tried
        candidate = Variant(spec, tuple((k, values[k]) for k in names))
        if not _passes(candidate, tests[depth], depth == len(axes)):
            skipped = math.prod(len(c) for c in choices[depth:])
            tried += skipped
            if tried >= limit:
                raise _Limit
            return
        if depth == len(axes):
            try:
                res = _estimate(spec, candidate.env())
            except expr.ExprError:   # tested above with the budgets, so not reached
                res = None
            if res is not None and not family.check_variant(candidate, target, res):
                found.append(candidate)
            tried += 1
            if tried >= limit:
                raise _Limit
            return
        name = axes[depth].name
        for value in choices[depth]:
            values[name] = value
            walk(axes, choices, depth + 1, values, tests, found)
        values[name] = base_values[name]

    def _passes(candidate: Variant, tests: list, leaf: bool) -> bool:
        if not tests:
            return True
        try:
            env = candidate.env()
        except expr.ExprError:
            if leaf:
                raise   # as check() would
            return True   # a partial point only: decided below
        for test in tests:
            if test is None:   # the resource budgets
                try:
                    if _budget_reasons(_estimate(spec, env), target):
                        return False
                except expr.ExprError:
                    return False
                continue
            try:
                if not test(env):
                    return False
            except expr.ExprError:
                return False
        return True

    for changed in range(1, most + 1):
        found: list[Variant] = []
        try:
            for axes in itertools.combinations(free, changed):
                position = {t.name: i + 1 for i, t in enumerate(axes)}

                def depth_of(reads: frozenset[str]) -> int:
                    return max((position.get(n, 0) for n in reads), default=0)

                # What can be tested once the first d changed axes have values: tests[d].
                tests: list[list] = [[] for _ in range(changed + 1)]
                for reads, require in rules.constraints:
                    tests[depth_of(reads)].append(require)
                tests[depth_of(rules.resource_axes)].append(None)
                choices = [[v for v in t.values if v != base[t.name]] for t in axes]
                walk(axes, choices, 0, dict(base_values), tests, found)
        except _Limit:
            return found
        if found:
            return found
    return []
