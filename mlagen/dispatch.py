"""Pick, build and cache the kernel for a call.

The spec is the highest-priority one of the family that targets the device and accepts the
inputs (the TMA kernel needs 16-byte aligned strides); the variant is the nearest tuning record
for the device and shape class over the tuning database and the shipped records, else one made
on another device of the same architecture, else the spec's default. Families are found by name
(``mlagen.families.get``); nothing here names one. The choice is memoised per (device, spec, shape class), so after the first call
of a shape class, dispatch is a dictionary lookup.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass, field

from . import arch, db, families, knobs, resources
from . import spec as spec_mod
from . import variant as variant_mod
from .build import compile_source
from .compiler import Binary, for_target, spill_reason
from .errors import ArgumentError, MlagenError, NoDeviceError, SpecError, VariantError
from .render import render
from .runtime import DeviceInfo, Kernel, device_info, runtime

log = logging.getLogger("mlagen")


@dataclass(frozen=True)
class Selection:
    spec: spec_mod.KernelSpec
    variant: variant_mod.Variant
    binary: Binary
    kernel: Kernel
    resources: resources.Resources
    origin: str  # "default", "explicit", "user" or "shipped:<file>", + " (other device: <name>)"
    env: dict    # variant.env(), computed once: launches read block sizes from it
    # What a launcher derives from the variant once (schedule, boxes, grid rule) and reads on
    # every call, keyed by the launcher; filled on first launch. Not part of equality.
    plan: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


@functools.lru_cache(maxsize=None)
def family_specs(family: str) -> tuple[spec_mod.KernelSpec, ...]:
    """Every packaged spec of ``family``, highest priority first."""
    specs = [spec_mod.load(p) for p in spec_mod.available()]
    return tuple(sorted((s for s in specs if s.family == family), key=lambda s: -s.priority))


def kernel_choice(family: str, text: str) -> "str | variant_mod.Variant":
    """What ``kernel=`` gets for a name a user typed: a spec name of ``family`` as is, or a kernel
    symbol of one of its specs (``mla_prefill_sm90_causal_c2_n128_...``, as tuner tables and records
    print it) as that Variant. ArgumentError (a ValueError) naming the family's specs otherwise."""
    specs = family_specs(family)
    if any(s.name == text for s in specs):
        return text
    # The longest spec name that begins the symbol (mla_prefill_sm90_fp8_... also begins with
    # mla_prefill_sm90_).
    owners = sorted((s for s in specs if text.startswith(s.name + "_")), key=lambda s: -len(s.name))
    if owners:
        try:
            return variant_mod.from_symbol(owners[0], text)
        except SpecError as exc:
            raise ArgumentError(f"kernel: {exc.message}") from None
    raise ArgumentError(f"kernel: {text!r} is neither a spec of {family} ({', '.join(s.name for s in specs)}) "
                        "nor a kernel symbol of one")


@functools.lru_cache(maxsize=None)
def cached_source_hash(spec: spec_mod.KernelSpec) -> str:
    return db.source_hash(spec)


@functools.lru_cache(maxsize=None)
def _compiler_id(target: str) -> str:
    """The compiler that builds for ``target``, with its version ("nvrtc 13.0", "hiprtc 6.4")."""
    c = for_target(target)
    return f"{c.name} {c.version()}"


def record_key(spec: spec_mod.KernelSpec, problem: str, *, device: str, sm_count: int, driver: str,
               target: arch.Target, dtypes: str | None = None) -> db.RecordKey:
    """The tuning-database key of ``spec`` on a device; the tuner writes and dispatch reads with it.
    ``dtypes`` defaults to the spec's input type (``problem.dtype``: "bf16", "fp8_e4m3", ...)."""
    if dtypes is None:
        dtypes = str(dict(spec.problem).get("dtype", "bf16"))
    return db.RecordKey(
        family=spec.family, spec=spec.name, problem=problem, dtypes=dtypes, device=device, sm_count=sm_count,
        driver=driver, compiler=_compiler_id(target.name), source_hash=cached_source_hash(spec),
    )


def record_target(spec: spec_mod.KernelSpec, device_name: str) -> str | None:
    """The target a record of ``spec`` made on ``device_name`` ran: the spec's only target if it
    has one (a record is tuned on a device the spec targets), else the device name's target."""
    if len(spec.targets) == 1:
        return spec.targets[0]
    return arch.target_of_device_name(device_name)


def candidate_variants(spec: spec_mod.KernelSpec, problem: str, specialization: dict, info: DeviceInfo,
                       database: db.TuningDB | None = None):
    """The variants of ``spec`` for a shape class on a device, best first, each with its origin:
    the tuning records in :func:`mlagen.db.candidates` order (the nearest shape class over the
    user's database and the shipped records, then records of other devices of the same target),
    then the spec's default (or the nearest variant to it that fits the target). A record whose
    variant is no longer valid is skipped with a warning, one that does not fit silently."""
    if not knobs.no_tuned():
        key = record_key(spec, problem, device=info.name, sm_count=info.sm_count, driver=info.driver_version,
                         target=info.target)
        for tuned, best in recorded_variants(spec, key, specialization, info.target, database):
            yield tuned, best.origin
    chosen = resources.feasible_default(spec, info.target, specialization)
    if chosen is None:
        raise SpecError(spec.path, "tune", f"no variant of {spec.name} fits {info.target.name}")
    yield chosen, "default"


def recorded_variants(spec: spec_mod.KernelSpec, key: db.RecordKey, specialization: dict, target: arch.Target,
                      database: db.TuningDB | None = None):
    """(variant, record) for each tuning record usable for ``key``, in the order dispatch tries them
    (:func:`mlagen.db.candidates`, the shipped records unless ``MLAGEN_NO_SHIPPED``), with
    ``specialization`` applied; records whose variant is no longer valid are skipped with a warning,
    those that do not fit ``target`` silently. Dispatch and the tuner (the record a tune competes
    with) read the records through this one function."""
    family = families.get(spec.family, spec.path)
    ranked = db.candidates(key, family.problem_distance, database if database is not None else db.TuningDB(),
                           include_shipped=not knobs.no_shipped(),
                           same_arch=lambda rk: record_target(spec, rk.device) == target.name)
    for best in ranked:
        try:
            tuned = variant_mod.make(spec, {**best.variant, **specialization})
        except SpecError as exc:
            log.warning("ignoring tuning record %s for %s: %s", best.symbol, key.problem, exc)
            continue
        if resources.check(tuned, target).ok:
            yield tuned, best


def choose_variant(spec: spec_mod.KernelSpec, problem: str, specialization: dict, info: DeviceInfo,
                   database: db.TuningDB | None = None) -> tuple[variant_mod.Variant, str]:
    """The first of :func:`candidate_variants`: the variant dispatch builds, and where it came from."""
    return next(candidate_variants(spec, problem, specialization, info, database))


def build(variant: variant_mod.Variant, target: arch.Target, allow_spills: bool = False) -> Binary:
    """Check the resource model, render and compile (through the cache); a kernel that spills
    under the local compiler is rejected (VariantError) unless ``allow_spills``."""
    verdict = resources.check(variant, target)
    if not verdict.ok:
        raise SpecError(variant.spec.path, "tune", f"variant {variant.symbol} cannot run on {target.name}: "
                        + "; ".join(verdict.reasons))
    binary = compile_source(render(variant), target.name)
    spilled = spill_reason(binary)
    if spilled and not allow_spills:
        raise VariantError(f"{variant.symbol} {spilled}")
    return binary


class Dispatcher:
    def __init__(self):
        self._memo: dict[tuple, Selection] = {}
        self._lock = threading.Lock()
        # Bumped by clear(): memos in front of this one (a family's per-call cache of its
        # selections) compare it and start over when it moved.
        self.generation = 0

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()
            self.generation += 1

    def candidates(self, family: str, target: arch.Target, accepts, only: str | None = None) -> list[spec_mod.KernelSpec]:
        forced = only or knobs.forced_family()
        specs = [s for s in family_specs(family) if target.name in s.targets]
        if forced:
            specs = [s for s in specs if s.name == forced]
            if not specs:
                raise SpecError(forced, "", f"names no spec of {family} targeting {target.name}; known: "
                                + ", ".join(s.name for s in family_specs(family)))
        return [s for s in specs if accepts(s)]

    def select(self, family: str, problem: str, specialization: dict, device: int, accepts,
               variant: variant_mod.Variant | None = None, only: str | None = None) -> Selection:
        """The kernel for one call. ``accepts(spec)`` filters specs the inputs cannot use;
        ``variant`` pins one variant, ``only`` one spec (by name)."""
        info = device_info(device)
        target = info.target
        if target is None:
            raise NoDeviceError(f"{info.name} (compute {info.compute[0]}.{info.compute[1]}) is not a known target")
        if variant is not None:
            memo_key = (device, variant)
        else:
            specs = self.candidates(family, target, accepts, only)
            if not specs:
                raise NoDeviceError(f"no {family} kernel targets {target.name} and accepts these inputs")
            memo_key = (device, specs[0].name, problem, tuple(sorted(specialization.items())))
        hit = self._memo.get(memo_key)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._memo.get(memo_key)
            if hit is None:
                if variant is not None:
                    hit = self._materialise(variant, target, device, "explicit")
                else:
                    hit = self._choose(specs[0], problem, specialization, info, device)
                self._memo[memo_key] = hit
        return hit

    def _choose(self, spec, problem: str, specialization: dict, info: DeviceInfo, device: int) -> Selection:
        # Nearest record first (candidate_variants' order); one whose kernel spills under the local
        # compiler (the record was measured with another NVRTC) gives way to the next, then to the default.
        fallback = None
        for chosen, origin in candidate_variants(spec, problem, specialization, info):
            try:
                selection = self._materialise(chosen, info.target, device, origin)
            except VariantError as exc:
                what = "the default variant" if origin == "default" else "tuning record"
                log.warning("%s on %s: skipping %s %s (%s): %s; trying the next record or the default",
                            problem, info.name, what, chosen.symbol, origin, exc)
                fallback = (chosen, origin)
                continue
            log.info("%s on %s: %s (%s)", problem, info.name, chosen.symbol, origin)
            return selection
        # Every candidate spills, the default too (the last one tried): it runs anyway, slower but correct.
        chosen, origin = fallback
        log.warning("%s on %s: the default variant %s spills; launching it anyway", problem, info.name, chosen.symbol)
        return self._materialise(chosen, info.target, device, origin, allow_spills=True)

    def _materialise(self, variant, target: arch.Target, device: int, origin: str,
                     allow_spills: bool = False) -> Selection:
        binary = build(variant, target, allow_spills)
        kernel = runtime().load(binary, device)
        return Selection(variant.spec, variant, binary, kernel, resources.estimate(variant), origin, variant.env())


@functools.lru_cache(maxsize=None)
def dispatcher() -> Dispatcher:
    return Dispatcher()


class SelectionMemo:
    """A family's per-call cache in front of the dispatcher: what its ``select`` answered for a
    class of calls (the key: device, the call's class, the kernel argument, knobs), so a repeated
    call skips the problem key and the dispatcher's spec filter. Entries carry the dispatcher's
    generation, so ``dispatcher().clear()`` invalidates them; bounded (cleared when full).
    Lock-free: two threads racing on a new class both compute the same answer."""

    def __init__(self, limit: int = 4096):
        self._entries: dict[tuple, object] = {}
        self._limit = limit

    def get(self, key: tuple, compute):
        key = (dispatcher().generation, *key)
        hit = self._entries.get(key)
        if hit is None:
            hit = compute()
            if len(self._entries) >= self._limit:
                self._entries.clear()
            self._entries[key] = hit
        return hit

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["Dispatcher", "Selection", "SelectionMemo", "build", "candidate_variants", "choose_variant", "dispatcher", "family_specs", "record_key",
           "record_target", "MlagenError"]
