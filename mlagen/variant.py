"""Variants: one concrete choice of every specialisation and tunable of a spec.

A variant's kernel symbol, artifact names and database key are pure functions of its fields, so
they are readable (``mla_prefill_sm80_causal_m128_n64_w8_s2_swxor_qr1``) and stable.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from .errors import SpecError
from .spec import KernelSpec


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value).replace("-", "_").replace(".", "p")


@dataclass(frozen=True)
class Variant:
    spec: KernelSpec
    values: tuple[tuple[str, Any], ...]  # in spec.axes order

    def __getitem__(self, name: str) -> Any:
        for key, value in self.values:
            if key == name:
                return value
        raise KeyError(name)

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    @property
    def tunables(self) -> dict[str, Any]:
        names = {t.name for t in self.spec.tunables}
        return {k: v for k, v in self.values if k in names}

    @property
    def specialization(self) -> dict[str, Any]:
        names = {k for k, _ in self.spec.specialize}
        return {k: v for k, v in self.values if k in names}

    def env(self) -> dict[str, Any]:
        """Every name a spec expression or template may use: problem, values, derived."""
        env = self.spec.base_env()
        env.update(self.values)
        for key, e in self.spec.derived:
            env[key] = e(env)
        return env

    @property
    def symbol(self) -> str:
        """The kernel's entry-point name; also the stem of its artifact files."""
        parts = [self.spec.name]
        parts += [_fmt(v) for v in self.specialization.values()]
        parts += [f"{self.spec.tunable(k).abbr}{_fmt(v)}" for k, v in self.tunables.items()]
        return "_".join(parts)

    def describe(self) -> str:
        return " ".join(f"{k}={_fmt(v) if isinstance(v, bool) else v}" for k, v in self.values)

    def with_values(self, **changes: Any) -> "Variant":
        return make(self.spec, {**dict(self.values), **changes})


def _coerce(spec: KernelSpec, key: str, where: str, allowed: tuple, value: Any) -> Any:
    """Accept ``value`` if it equals an allowed value; strings from the CLI are converted."""
    for candidate in allowed:
        if value == candidate and type(value) is type(candidate):
            return candidate
        if isinstance(value, str) and _fmt(candidate) == value.lower().replace("-", "_"):
            return candidate
        if isinstance(value, str) and isinstance(candidate, bool) and value.lower() in ("true", "false"):
            if candidate == (value.lower() == "true"):
                return candidate
    raise SpecError(spec.path, where, f"{value!r} is not one of {list(allowed)}")


def make(spec: KernelSpec, values: Mapping[str, Any]) -> Variant:
    """Build a variant from a full or partial mapping; missing tunables take their defaults.

    Specialisations without a value take their first value. Unknown names and values outside the
    search space raise SpecError naming the key (``tune.block_n: 96 is not one of [...]``).
    """
    spec_axes = dict(spec.specialize)
    tunables = {t.name: t for t in spec.tunables}
    for key in values:
        if key not in spec_axes and key not in tunables:
            raise SpecError(spec.path, f"tune.{key}", f"unknown tunable; known: {', '.join(spec.axes)}")
    out = []
    for key, allowed in spec.specialize:
        value = values.get(key, allowed[0])
        out.append((key, _coerce(spec, key, f"specialize.{key}", allowed, value)))
    for t in spec.tunables:
        value = values.get(t.name, t.default)
        out.append((t.name, _coerce(spec, t.name, f"tune.{t.name}", t.values, value)))
    return Variant(spec, tuple(out))


def from_symbol(spec: KernelSpec, symbol: str) -> Variant:
    """The variant whose :attr:`Variant.symbol` is ``symbol`` (as the tuner's tables, the logs and the
    tuning records print it); SpecError if ``symbol`` is not one of ``spec``'s."""
    head = spec.name + "_"
    if not symbol.startswith(head):
        raise SpecError(spec.path, "name", f"{symbol!r} is not a kernel of {spec.name}")
    axes = [(key, allowed, "") for key, allowed in spec.specialize]
    axes += [(t.name, t.values, t.abbr) for t in spec.tunables]

    def match(rest: list[str], i: int) -> list[tuple[str, Any]] | None:
        # Tokens are joined by "_", and a value may hold "_" too (fp8_v32): try every allowed value.
        if i == len(axes):
            return [] if not rest else None
        key, allowed, abbr = axes[i]
        for value in allowed:
            token = (abbr + _fmt(value)).split("_")
            if rest[:len(token)] == token:
                tail = match(rest[len(token):], i + 1)
                if tail is not None:
                    return [(key, value)] + tail
        return None

    values = match(symbol[len(head):].split("_"), 0)
    if values is None:
        raise SpecError(spec.path, "name", f"{symbol!r} names no variant of {spec.name} (a value outside its "
                                           "search space, or a symbol from another version of the spec)")
    return Variant(spec, tuple(values))


def default(spec: KernelSpec, **specialization: Any) -> Variant:
    return make(spec, specialization)


def sample_space(spec: KernelSpec, count: int, fixed: Mapping[str, Any] | None = None,
                 seed: int = 0) -> list[Variant]:
    """Up to ``count`` distinct variants drawn uniformly from the space (without enumerating it;
    the whole space when it is that small). The spec default comes first."""
    import random

    fixed = dict(fixed or {})
    total = space_size(spec, fixed)
    if total <= count:
        return list(enumerate_space(spec, fixed))
    rng = random.Random(seed)
    first = make(spec, fixed)
    out, seen = [first], {first}
    held = dict(first.values)
    axes = [(k, vals) for k, vals in spec.specialize] + [(t.name, t.values) for t in spec.tunables]
    while len(out) < count:
        v = Variant(spec, tuple((k, held[k] if k in fixed else rng.choice(vals)) for k, vals in axes))
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def parse_assignments(spec: KernelSpec, items: list[str]) -> dict[str, Any]:
    """``["block_n=64", "stages=3"]`` from the command line into a mapping (values checked by make).
    A kernel symbol of ``spec`` (as tune tables and records print it) stands for all its tunables;
    a later ``name=value`` overrides one of them (``<symbol>,stages=3``). A name given twice
    otherwise (``block_n=64,block_n=128``, a symbol after a name, two symbols) is refused: which
    value was meant is not for mlagen to guess."""
    out: dict[str, Any] = {}
    given: dict[str, tuple[str, bool]] = {}  # name -> (the item that set it, whether a symbol)

    def put(key: str, value: Any, item: str, by_symbol: bool = False) -> None:
        if key in given and (by_symbol or not given[key][1]):
            raise SpecError(spec.path, f"tune.{key}", f"given twice ({given[key][0]!r} and {item!r}); give each "
                            "name once (a name=value after a kernel symbol overrides it)")
        given[key] = (item, by_symbol)
        out[key] = value

    for item in items:
        for part in item.split(","):
            part = part.strip()
            if not part:
                continue
            if "=" not in part and part.startswith(spec.name + "_"):
                for key, value in from_symbol(spec, part).tunables.items():
                    put(key, value, part, by_symbol=True)
                continue
            if "=" not in part:
                raise SpecError(spec.path, "tune", f"{part!r}: expected name=value or a kernel symbol of {spec.name}")
            key, value = part.split("=", 1)
            key = key.strip()
            value = value.strip()
            # Converted through the key's allowed values, so "q_in_regs=1" (as in the symbol
            # "..._qr1") means True; an unknown key is left for make() to report.
            allowed = dict(spec.specialize).get(key)
            where = f"specialize.{key}"
            if allowed is None and key in {t.name for t in spec.tunables}:
                allowed, where = spec.tunable(key).values, f"tune.{key}"
            put(key, _coerce(spec, key, where, allowed, value) if allowed is not None else value, part)
    return out


def space_size(spec: KernelSpec, fixed: Mapping[str, Any] | None = None) -> int:
    """How many variants ``enumerate_space(spec, fixed)`` yields, without enumerating them."""
    fixed = dict(fixed or {})
    make(spec, fixed)
    counts = [len(vals) for k, vals in spec.specialize if k not in fixed]
    counts += [len(t.values) for t in spec.tunables if t.name not in fixed]
    return math.prod(counts)


def enumerate_space(spec: KernelSpec, fixed: Mapping[str, Any] | None = None) -> Iterator[Variant]:
    """Every variant of the search space (specialisations x tunables), ``fixed`` held constant."""
    fixed = dict(fixed or {})
    held = dict(make(spec, fixed).values)  # validates the names and values in ``fixed``
    axes = [(k, vals) for k, vals in spec.specialize] + [(t.name, t.values) for t in spec.tunables]
    names = tuple(k for k, _ in axes)
    choices = [[held[k]] if k in fixed else list(vals) for k, vals in axes]
    # Every combination is of allowed values already, so it skips make()'s checks: the sm90 space
    # has over a million variants.
    for combo in itertools.product(*choices):
        yield Variant(spec, tuple(zip(names, combo)))
