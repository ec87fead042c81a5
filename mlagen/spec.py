"""Kernel specs: YAML files in ``specs/`` loaded into frozen dataclasses and validated.

A spec names a kernel family, its template, the targets it compiles for, the fixed problem
parameters, the values it is specialised on at run time (e.g. the mask), the tunables with their
search space, constraints between them, and a resource model (threads, shared memory, registers)
written as expressions of all of these. Every error names the file, the key path and what is
allowed, e.g. ``specs/mla_prefill_sm80.yaml: tune.block_n.default: 96 is not one of [32, 64]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from . import arch, expr, families, paths
from .errors import SpecError

_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")
_ABBR = re.compile(r"^[a-z][a-z0-9]*$")
_RESOURCE_KEYS = ("threads", "smem_bytes", "registers")
_TOP_KEYS = (
    "name", "family", "abi", "priority", "description", "template", "targets", "problem", "derived",
    "specialize", "tune", "constraints", "resources", "schedule",
)
MAX_SPEC_BYTES = 1 << 20
_REQUIRED_TOP = ("name", "family", "abi", "template", "targets", "problem", "tune", "resources")


@dataclass(frozen=True)
class Tunable:
    """One searchable parameter: its allowed values, default, and abbreviation in names."""

    name: str
    values: tuple
    default: Any
    abbr: str
    doc: str = ""


@dataclass(frozen=True)
class Constraint:
    require: expr.Expr
    message: str


@dataclass(frozen=True)
class KernelSpec:
    """A validated spec. Identity is its file content; names derive from ``name``."""

    path: str
    name: str
    family: str
    abi: str             # which launcher of the family drives it (e.g. "simt", "tma")
    priority: int        # dispatch prefers the highest priority spec that targets the device
    description: str
    template: str
    targets: tuple[str, ...]
    problem: tuple[tuple[str, Any], ...]
    derived: tuple[tuple[str, expr.Expr], ...]
    specialize: tuple[tuple[str, tuple], ...]
    tunables: tuple[Tunable, ...]
    constraints: tuple[Constraint, ...]
    resources: tuple[tuple[str, expr.Expr], ...]
    schedule: Any = field(default=None, compare=False)  # family-specific, validated by its family
    text_hash: str = ""

    def tunable(self, name: str) -> Tunable:
        for t in self.tunables:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def axes(self) -> tuple[str, ...]:
        """Names that identify a variant, in order: specialisations first, then tunables."""
        return tuple(k for k, _ in self.specialize) + tuple(t.name for t in self.tunables)

    def base_env(self) -> dict[str, Any]:
        return dict(self.problem)


def template_path(template: str, spec_path: str | Path) -> Path | None:
    """A spec's template: under the packaged templates/, or else beside the spec file (for
    specs kept outside the package, e.g. in a project or a test). A name that resolves outside
    those directories (an absolute path, ``../``, a symlink out) is never a template."""
    if Path(template).is_absolute():
        return None
    for base in (paths.templates_dir(), Path(spec_path).parent):
        candidate = base / template
        try:
            inside = candidate.resolve().is_relative_to(base.resolve())
        except (OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
            continue
        if inside and candidate.is_file():
            return candidate
    return None


def _dupe_checking_loader():
    from .fsutil import plain_yaml_loader

    class Loader(plain_yaml_loader()):  # no anchors or aliases: no expansion bombs
        pass

    def construct_mapping(loader, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return yaml.SafeLoader.construct_mapping(loader, node, deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, construct_mapping)
    return Loader


_LOADER = _dupe_checking_loader()


def resolve(name_or_path: str | Path) -> Path:
    """A spec given by path, or by name (``mla_prefill_sm80``) from the packaged specs."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise SpecError(p, "", "no such spec file")
        if not p.is_file():
            raise SpecError(p, "", "is a directory, not a spec file (a .yaml file or a spec name)")
        return p
    candidate = paths.specs_dir() / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    known = ", ".join(s.stem for s in available())
    raise SpecError(name_or_path, "", f"no spec of that name; known: {known}")


def available() -> list[Path]:
    return sorted(paths.specs_dir().glob("*.yaml"))


def load(name_or_path: str | Path) -> KernelSpec:
    """Load and validate a spec; raise SpecError naming file, key path and what is allowed."""
    path = resolve(name_or_path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(path, "", f"cannot read it ({exc.strerror or exc})") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(path, "", f"{len(raw)} bytes; a spec may have at most {MAX_SPEC_BYTES}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(path, "", f"not UTF-8 text (byte {exc.start}: {raw[exc.start:exc.start + 1]!r})") from None
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(path, where, f"invalid YAML: {problem}") from None
    except RecursionError:
        raise SpecError(path, "", "invalid YAML: nested too deeply") from None
    spec = from_dict(data, path, text)
    if spec.name != path.stem:
        raise SpecError(path, "name", f"{spec.name!r} does not match the file name: a spec named {spec.name!r} "
                        f"lives in {spec.name}.yaml (rename the file or the spec)")
    return spec


def from_dict(data: Any, path: str | Path, text: str = "") -> KernelSpec:
    """Validate an already-parsed spec document."""
    import hashlib

    v = _Validator(path)
    v.mapping(data, "", required=_REQUIRED_TOP, allowed=_TOP_KEYS)

    name = v.ident(data["name"], "name")
    family = v.ident(data["family"], "family")
    abi = v.ident(data["abi"], "abi")
    priority = data.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise SpecError(path, "priority", f"expected an integer, got {priority!r}")
    description = v.string(data.get("description", ""), "description", allow_empty=True)
    template = v.string(data["template"], "template")
    if template_path(template, path) is None:
        raise SpecError(path, "template", f"{template!r} is not a file under templates/ or beside the spec "
                        "(a relative path that stays inside one of them)")

    targets = v.sequence(data["targets"], "targets", nonempty=True)
    for i, t in enumerate(targets):
        if not isinstance(t, str) or t not in arch.TARGETS:
            raise SpecError(path, f"targets[{i}]", f"{t!r} is not one of {list(arch.TARGETS)}")

    problem = v.mapping(data["problem"], "problem")
    for key, value in problem.items():
        v.ident(key, f"problem.{key}")
        if not isinstance(value, (int, float, str, bool)):
            raise SpecError(path, f"problem.{key}", f"expected a scalar, got {type(value).__name__}")
    env_names = set(problem)

    derived = []
    for key, text_expr in v.mapping(data.get("derived", {}) or {}, "derived").items():
        v.ident(key, f"derived.{key}")
        if key in env_names:
            raise SpecError(path, f"derived.{key}", "name already defined")
        derived.append((key, v.expression(text_expr, f"derived.{key}")))
        env_names.add(key)

    specialize = []
    for key, values in v.mapping(data.get("specialize", {}) or {}, "specialize").items():
        v.ident(key, f"specialize.{key}")
        if key in env_names:
            raise SpecError(path, f"specialize.{key}", "name already defined")
        values = v.sequence(values, f"specialize.{key}", nonempty=True, unique=True, scalars=True)
        specialize.append((key, tuple(values)))
        env_names.add(key)

    tunables = []
    abbrs = {}
    for key, body in v.mapping(data["tune"], "tune").items():
        where = f"tune.{key}"
        v.ident(key, where)
        if key in env_names:
            raise SpecError(path, where, "name already defined")
        v.mapping(body, where, required=("values", "default"), allowed=("values", "default", "abbr", "doc"))
        values = tuple(v.sequence(body["values"], f"{where}.values", nonempty=True, unique=True, scalars=True))
        default = body["default"]
        if default not in values or type(default) is not type(values[values.index(default)]):
            raise SpecError(path, f"{where}.default", f"{default!r} is not one of {list(values)}")
        abbr = body.get("abbr", key)
        if not isinstance(abbr, str) or not _ABBR.match(abbr):
            raise SpecError(path, f"{where}.abbr", f"{abbr!r} must be lowercase letters and digits")
        if abbr in abbrs:
            raise SpecError(path, f"{where}.abbr", f"{abbr!r} is already used by tune.{abbrs[abbr]}")
        abbrs[abbr] = key
        tunables.append(Tunable(key, values, default, abbr, str(body.get("doc", ""))))
        env_names.add(key)

    constraints = []
    for i, body in enumerate(v.sequence(data.get("constraints", []) or [], "constraints")):
        where = f"constraints[{i}]"
        v.mapping(body, where, required=("require", "message"), allowed=("require", "message"))
        e = v.expression(body["require"], f"{where}.require")
        unknown = e.names - env_names
        if unknown:
            raise SpecError(path, f"{where}.require", f"unknown name(s) {sorted(unknown)}; defined: {sorted(env_names)}")
        constraints.append(Constraint(e, v.string(body["message"], f"{where}.message")))

    resources = []
    res = v.mapping(data["resources"], "resources", required=_RESOURCE_KEYS, allowed=_RESOURCE_KEYS)
    for key in _RESOURCE_KEYS:
        e = v.expression(res[key], f"resources.{key}")
        unknown = e.names - env_names
        if unknown:
            raise SpecError(path, f"resources.{key}", f"unknown name(s) {sorted(unknown)}; defined: {sorted(env_names)}")
        resources.append((key, e))

    for key, e in derived:
        unknown = e.names - env_names
        if unknown:
            raise SpecError(path, f"derived.{key}", f"unknown name(s) {sorted(unknown)}; defined: {sorted(env_names)}")

    spec = KernelSpec(
        path=str(path),
        name=name,
        family=family,
        abi=abi,
        priority=priority,
        description=description,
        template=template,
        targets=tuple(targets),
        problem=tuple(problem.items()),
        derived=tuple(derived),
        specialize=tuple(specialize),
        tunables=tuple(tunables),
        constraints=tuple(constraints),
        resources=tuple(resources),
        schedule=data.get("schedule"),
        text_hash=hashlib.sha256(text.encode()).hexdigest()[:16] if text else "",
    )
    _evaluate_defaults(spec, path)
    # The family validates its own parts (e.g. the Hopper schedule) and that its default variant
    # is legal, so a broken spec fails when loaded rather than when first launched.
    families.get(family, path).validate_spec(spec)
    return spec


def _evaluate_defaults(spec: KernelSpec, path) -> None:
    """Evaluate every expression on the default variant of each specialisation, so one that
    cannot be evaluated (an expression bomb past expr's bounds, a division by zero) is a
    SpecError naming the file and its key when the spec loads, not a "failed to evaluate" reason
    on every variant later."""
    import itertools

    defaults = {t.name: t.default for t in spec.tunables}
    axes = [k for k, _ in spec.specialize]
    for combo in itertools.product(*(values for _, values in spec.specialize)):
        env = {**spec.base_env(), **dict(zip(axes, combo)), **defaults}
        at = ", ".join(f"{k}={v}" for k, v in zip(axes, combo))
        named = [(f"derived.{k}", e) for k, e in spec.derived]
        named += [(f"constraints[{i}].require", c.require) for i, c in enumerate(spec.constraints)]
        named += [(f"resources.{k}", e) for k, e in spec.resources]
        for key, e in named:
            try:
                value = e(env)
            except expr.ExprError as exc:
                raise SpecError(path, key, f"cannot be evaluated on the default variant"
                                f"{f' ({at})' if at else ''}: {exc}") from None
            if key.startswith("derived."):
                env[key.split(".", 1)[1]] = value


class _Validator:
    def __init__(self, path):
        self.path = path

    def fail(self, key, message):
        raise SpecError(self.path, key, message)

    def mapping(self, value, key, required=(), allowed=None) -> Mapping:
        if not isinstance(value, dict):
            self.fail(key or "(top level)", f"expected a mapping, got {type(value).__name__}")
        for r in required:
            if r not in value:
                self.fail(f"{key}.{r}" if key else r, "required key is missing")
        if allowed is not None:
            for k in value:
                if k not in allowed:
                    self.fail(f"{key}.{k}" if key else str(k), f"unknown key; allowed: {', '.join(allowed)}")
        return value

    def sequence(self, value, key, nonempty=False, unique=False, scalars=False) -> list:
        if not isinstance(value, list):
            self.fail(key, f"expected a list, got {type(value).__name__}")
        if nonempty and not value:
            self.fail(key, "must not be empty")
        if scalars:
            for i, item in enumerate(value):
                if not isinstance(item, (int, str, bool)) or isinstance(item, float):
                    self.fail(f"{key}[{i}]", f"expected an int, string or bool, got {item!r}")
            # One type per list, strictly: a bool among ints (true == 1 in Python) is an error.
            for i, item in enumerate(value):
                if type(item) is not type(value[0]):
                    self.fail(f"{key}[{i}]", f"{item!r} is a {type(item).__name__}, the list's first value "
                              f"{value[0]!r} a {type(value[0]).__name__}: all values must have one type")
        if unique and len(set(map(repr, value))) != len(value):
            self.fail(key, "values must be unique")
        return value

    def string(self, value, key, allow_empty=False) -> str:
        if not isinstance(value, str) or (not allow_empty and not value.strip()):
            self.fail(key, f"expected a non-empty string, got {value!r}")
        return value

    def ident(self, value, key) -> str:
        if not isinstance(value, str) or not _IDENT.match(value):
            self.fail(key, f"{value!r} must be a lowercase identifier ([a-z][a-z0-9_]*)")
        return value

    def expression(self, value, key) -> expr.Expr:
        try:
            return expr.parse(value)
        except expr.ExprError as exc:
            self.fail(key, str(exc))
