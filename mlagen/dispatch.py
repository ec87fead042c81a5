"""Pick, build and cache the kernel for a call.

The spec is the highest-priority one of the family that targets the device and accepts the
inputs (the TMA kernel needs 16-byte aligned strides); the variant is the tuned winner for the
device and shape class when the tuning database (or the shipped records) has one, else the
spec's default. The choice is memoised per (device, spec, shape class), so after the first call
of a shape class, dispatch is a dictionary lookup.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass

from . import arch, db, knobs, resources
from . import spec as spec_mod
from . import variant as variant_mod
from .compiler import Binary, for_target
from .errors import MlagenError, NoDeviceError, SpecError
from .render import render
from .runtime import CudaKernel, DeviceInfo, device_info, runtime

log = logging.getLogger("mlagen")


@dataclass(frozen=True)
class Selection:
    spec: spec_mod.KernelSpec
    variant: variant_mod.Variant
    binary: Binary
    kernel: CudaKernel
    resources: resources.Resources
    origin: str  # "default", "user" or "shipped:<file>"
    env: dict    # variant.env(), computed once: launches read block sizes from it


@functools.lru_cache(maxsize=None)
def family_specs(family: str) -> tuple[spec_mod.KernelSpec, ...]:
    """Every packaged spec of ``family``, highest priority first."""
    specs = [spec_mod.load(p) for p in spec_mod.available()]
    return tuple(sorted((s for s in specs if s.family == family), key=lambda s: -s.priority))


@functools.lru_cache(maxsize=None)
def cached_source_hash(spec: spec_mod.KernelSpec) -> str:
    return db.source_hash(spec)


@functools.lru_cache(maxsize=None)
def _compiler_id(target: str) -> str:
    """The compiler that builds for ``target``, with its version ("nvrtc 13.0", "hiprtc 6.4")."""
    c = for_target(target)
    return f"{c.name} {c.version()}"


def record_key(spec: spec_mod.KernelSpec, problem: str, *, device: str, sm_count: int, driver: str,
               target: arch.Target, dtypes: str = "bf16") -> db.RecordKey:
    """The tuning-database key of ``spec`` on a device; the tuner writes and dispatch reads with it."""
    return db.RecordKey(
        family=spec.family, spec=spec.name, problem=problem, dtypes=dtypes, device=device, sm_count=sm_count,
        driver=driver, compiler=_compiler_id(target.name), source_hash=cached_source_hash(spec),
    )


def build(variant: variant_mod.Variant, target: arch.Target) -> Binary:
    """Check the resource model, render and compile (through the cache)."""
    verdict = resources.check(variant, target)
    if not verdict.ok:
        raise SpecError(variant.spec.path, "tune", f"variant {variant.symbol} cannot run on {target.name}: "
                        + "; ".join(verdict.reasons))
    return for_target(target.name).compile(render(variant), target.name)


class Dispatcher:
    def __init__(self):
        self._memo: dict[tuple, Selection] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self._memo.clear()

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
        from .families.mla_prefill import ProblemKey

        chosen = variant_mod.feasible_default(spec, info.target, specialization)
        if chosen is None:
            raise SpecError(spec.path, "tune", f"no variant of {spec.name} fits {info.target.name}")
        origin = "default"
        if not knobs.no_tuned():
            key = record_key(spec, problem, device=info.name, sm_count=info.sm_count, driver=info.driver_version,
                             target=info.target)

            def distance(a: str, b: str) -> float:
                return ProblemKey.parse(a).distance(ProblemKey.parse(b))

            best = db.lookup(key, distance, db.TuningDB(), include_shipped=not knobs.no_shipped())
            if best is not None:
                try:
                    tuned = variant_mod.make(spec, {**best.variant, **specialization})
                    if resources.check(tuned, info.target).ok:
                        chosen, origin = tuned, best.origin
                except SpecError as exc:
                    log.warning("ignoring tuning record %s for %s: %s", best.symbol, problem, exc)
        log.info("%s on %s: %s (%s)", problem, info.name, chosen.symbol, origin)
        return self._materialise(chosen, info.target, device, origin)

    def _materialise(self, variant, target: arch.Target, device: int, origin: str) -> Selection:
        binary = build(variant, target)
        kernel = runtime().load(binary, device)
        return Selection(variant.spec, variant, binary, kernel, resources.estimate(variant), origin, variant.env())


@functools.lru_cache(maxsize=None)
def dispatcher() -> Dispatcher:
    return Dispatcher()


__all__ = ["Dispatcher", "Selection", "build", "dispatcher", "family_specs", "record_key", "MlagenError"]
