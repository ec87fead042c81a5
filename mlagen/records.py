"""Tuning records as data: the key a record depends on, a trial, a winner, and their JSON form.

:mod:`mlagen.db` stores them in SQLite; this module holds what an export file says and how one is
read and checked (every field typed and bounded, every variant a real variant of its packaged spec),
so that a malformed export is refused with the record and field it names before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import re
import stat
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from . import paths
from .errors import DatabaseError

SCHEMA_VERSION = 2  # 2: the "nvrtc" column became "compiler" ("nvrtc 13.0", "clang 22.1.8", "hiprtc 6.4")
EXPORT_FORMAT = "mlagen-tuning"
OUTCOMES = ("ok", "pruned", "compile_error", "wrong_result", "crash", "hang", "launch_error")

_KEY_COLUMNS = ("family", "spec", "problem", "dtypes", "device", "sm_count", "driver", "compiler", "source_hash")


@dataclass(frozen=True)
class RecordKey:
    """Everything a tuning record depends on."""

    family: str
    spec: str
    problem: str      # bucketed shape class, e.g. "causal/h128/q8192/k8192"
    dtypes: str       # e.g. "bf16"
    device: str       # device name as the driver reports it
    sm_count: int
    driver: str
    compiler: str     # device compiler and its version, e.g. "nvrtc 13.0", "hiprtc 6.4", "clang 22.1.8"
    source_hash: str  # spec + template + headers

    def as_dict(self) -> dict:
        return asdict(self)


# What a trial measured, or why it failed: these fields of Trial, in its order. A tuner's result
# (mlagen.tune.config.TrialResult) is a Trial without its key: its variant and these fields.
MEASURED = ("outcome", "time_ms", "tflops", "max_error", "registers", "spills", "detail")


@dataclass(frozen=True)
class Trial:
    key: RecordKey
    variant: dict
    symbol: str
    outcome: str
    time_ms: float | None = None
    tflops: float | None = None
    max_error: float | None = None
    registers: int | None = None
    spills: int | None = None
    detail: str = ""
    run_id: str = ""
    created: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Best:
    key: RecordKey
    variant: dict
    symbol: str
    time_ms: float
    tflops: float | None
    run_id: str
    updated: float
    origin: str = "user"  # "user" (the database) or "shipped" (package defaults)


def _upgrade_record(d):
    """A version-1 export record (``"nvrtc": "13.0"``) in version-2 form (``"compiler": "nvrtc 13.0"``)."""
    if isinstance(d, dict) and "nvrtc" in d and "compiler" not in d:
        old = d["nvrtc"]
        d = {k: v for k, v in d.items() if k != "nvrtc"}
        d["compiler"] = f"nvrtc {old}" if isinstance(old, str) else old
    return d


def _key_from(d: dict) -> RecordKey:
    return RecordKey(**{c: d[c] for c in _KEY_COLUMNS})


def _best_from_row(d: dict) -> Best:
    return Best(_key_from(d), json.loads(d["variant"]), d["symbol"], d["time_ms"], d["tflops"], d["run_id"],
                d["updated"])


def _trial_from_row(d: dict) -> Trial:
    return Trial(_key_from(d), json.loads(d["variant"]), d["symbol"], d["outcome"], d["time_ms"], d["tflops"],
                 d["max_error"], d["registers"], d["spills"], d["detail"], d["run_id"], d["created"])


def _best_to_json(b: Best) -> dict:
    return {**b.key.as_dict(), "variant": b.variant, "symbol": b.symbol, "time_ms": b.time_ms, "tflops": b.tflops,
            "run_id": b.run_id, "updated": b.updated}


def _trial_to_json(t: Trial) -> dict:
    return {**t.key.as_dict(), **{f.name: getattr(t, f.name) for f in fields(Trial) if f.name != "key"}}


def _require(d, i, what, names, types):
    if not isinstance(d, dict):
        raise DatabaseError(f"{what}[{i}]: expected an object")
    for name, typ in zip(names, types):
        if name not in d:
            raise DatabaseError(f"{what}[{i}]: missing {name!r}")
        if not _is(d[name], typ):  # the columns are NOT NULL: null is not allowed either
            raise DatabaseError(f"{what}[{i}].{name}: expected {_type_name(typ)}, got {_got(d[name])}")


_INT64 = (-(1 << 63), (1 << 63) - 1)  # what an SQLite INTEGER holds
_MAX_FLOAT = 1.7976931348623157e308


def _is(value, typ) -> bool:
    """isinstance, except that a bool is not a number, an int must fit SQLite's 64 bits, and a
    number read as a float must be one (10**400 is not)."""
    if isinstance(value, bool):
        return bool in (typ if isinstance(typ, tuple) else (typ,))
    if isinstance(value, int) and not isinstance(value, bool):
        if not _INT64[0] <= value <= _INT64[1] and (float not in (typ if isinstance(typ, tuple) else (typ,))
                                                    or abs(value) > _MAX_FLOAT):
            return False
    return isinstance(value, typ)


def _got(value) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and not _INT64[0] <= value <= _INT64[1]:
        return f"{str(value)[:20]}{'...' if len(str(value)) > 20 else ''} (out of range)"
    return type(value).__name__


def _type_name(typ) -> str:
    return " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))


def _optional(d, i, what, names, types):
    for name, typ in zip(names, types):
        if d.get(name) is not None and not _is(d[name], typ):
            raise DatabaseError(f"{what}[{i}].{name}: expected {_type_name(typ)} or null, got {_got(d[name])}")


def _records(doc: dict, what: str) -> list:
    items = doc.get(what, [])
    if not isinstance(items, list):
        raise DatabaseError(f"{what}: expected a list, got {type(items).__name__}")
    return items


_KEY_TYPES = (str, str, str, str, str, int, str, str, str)
_NUM = (int, float)


def _positive(d, i, what, names, allow_zero=False):
    """Figures must be finite and positive (zero allowed for counts)."""
    import math

    for name in names:
        value = d.get(name)
        if value is None:
            continue
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise DatabaseError(f"{what}[{i}].{name}: {value!r} must be {'non-negative' if allow_zero else 'positive'}")


def printable(text: str) -> bool:
    """No control, format (bidi overrides, zero-width) or unassigned characters: a record's text
    is printed in tables and logs, and a NUL or an RTL override there misleads the reader."""
    import unicodedata

    return all(unicodedata.category(ch)[0] != "C" for ch in text)


def _check_key(d, i, what):
    if d["sm_count"] <= 0:
        raise DatabaseError(f"{what}[{i}].sm_count: {d['sm_count']!r} must be positive")
    for c in _KEY_COLUMNS + ("symbol", "run_id"):
        if not isinstance(d.get(c), str):
            continue
        if c != "run_id" and not d[c].strip():
            raise DatabaseError(f"{what}[{i}].{c}: must not be empty")
        if not printable(d[c]):
            raise DatabaseError(f"{what}[{i}].{c}: {d[c]!r} holds control or format characters")


def _check_variant(key: RecordKey, values: dict, where: str, specs: dict, symbol: str | None = None) -> None:
    """A record's variant must name tunables (and specialisations) of its packaged spec, each with
    one of its values, of the same type (a bool is not an int).

    A record of the spec's current source (``source_hash``: dispatch may use it) must name every
    tunable and its ``symbol`` must be the kernel that variant and its problem name: a partial
    variant would run the spec's defaults for the rest, labelled as the user's record. A record
    of another source is never used by dispatch; its variant is checked by name and value only,
    and its symbol where the variant is complete."""
    from . import spec as spec_mod

    if key.spec not in specs:
        known = {p.stem: p for p in spec_mod.available()}
        if key.spec not in known:
            raise DatabaseError(f"{where}.spec: {key.spec!r} is not a known spec; known: {', '.join(sorted(known))}")
        loaded = spec_mod.load(known[key.spec])
        specs[key.spec] = (loaded, source_hash(loaded))
    spec, current_hash = specs[key.spec]
    if key.family != spec.family:
        raise DatabaseError(f"{where}.family: {key.family!r}, but {spec.name} is of family {spec.family!r}")
    from . import families

    family = families.get(spec.family, spec.path)
    try:
        family.problem_specialization(key.problem)
        family.problem_distance(key.problem, key.problem)
    except (ValueError, KeyError, TypeError) as exc:
        raise DatabaseError(f"{where}.problem: {key.problem!r} is not a shape class of {spec.family} ({exc})") from None
    if not values and spec.tunables:
        # An empty variant would run the spec's default labelled as the user's record.
        raise DatabaseError(f"{where}.variant: empty; a record names the tunables it chose "
                            f"({', '.join(t.name for t in spec.tunables)})")
    allowed = {t.name: t.values for t in spec.tunables} | dict(spec.specialize)
    for name, value in values.items():
        if name not in allowed:
            raise DatabaseError(f"{where}.variant.{name}: not a tunable of {spec.name}; tunables: "
                                f"{', '.join(t.name for t in spec.tunables)}")
        if not any(value == a and type(value) is type(a) for a in allowed[name]):
            raise DatabaseError(f"{where}.variant.{name}: {value!r} is not one of {list(allowed[name])}")
    missing = [t for t in spec.tunables if t.name not in values]
    current = key.source_hash == current_hash
    if missing and current:
        first = missing[0]
        also = f" (also missing: {', '.join(t.name for t in missing[1:])})" if missing[1:] else ""
        raise DatabaseError(f"{where}.variant.{first.name}: missing; a record of {spec.name}'s current source "
                            f"({current_hash}) names every tunable{also}; {first.name} is one of {list(first.values)}")
    if symbol is not None and not missing:
        from . import variant as variant_mod
        from .errors import SpecError

        try:
            expected = variant_mod.make(spec, {**values, **family.problem_specialization(key.problem)}).symbol
        except SpecError as exc:
            raise DatabaseError(f"{where}.variant: {exc.message}") from None
        if symbol != expected:
            raise DatabaseError(f"{where}.symbol: {symbol!r} is not the kernel its variant names ({expected})")


_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def _included_headers(text: str, seen: set[Path]) -> None:
    """Every header under include/ that ``text`` includes, transitively (both sides of an #if; a
    name the template computes, ``sparse_kv_{{ ... }}.cuh``, stands for every header it can name)."""
    root = paths.include_dir()
    for name in _INCLUDE.findall(text):
        if "{{" in name:
            candidates = sorted(root.glob(re.sub(r"\{\{.*?\}\}", "*", name)))
        else:
            candidates = [root / name]
        for p in candidates:
            if p.is_file() and p not in seen:
                seen.add(p)
                _included_headers(p.read_text(), seen)


def source_hash(spec) -> str:
    """Hash of what a spec's kernels are built from: the spec, its template and the headers the
    template includes (transitively), so headers of other targets or families do not retire its
    tuning records."""
    h = hashlib.sha256()
    h.update(Path(spec.path).read_bytes())
    h.update(b"\0")
    from .spec import template_path

    template = template_path(spec.template, spec.path).read_text()
    h.update(template.encode())
    headers: set[Path] = set()
    _included_headers(template, headers)
    for p in sorted(headers):
        h.update(str(p.relative_to(paths.include_dir())).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _best_from_json(d, i) -> Best:
    d = _upgrade_record(d)
    _require(d, i, "best", _KEY_COLUMNS + ("variant", "symbol", "time_ms"), _KEY_TYPES + (dict, str, _NUM))
    _optional(d, i, "best", ("tflops", "run_id", "updated"), (_NUM, str, _NUM))
    _check_key(d, i, "best")
    _positive(d, i, "best", ("time_ms", "tflops", "updated"))
    return Best(_key_from(d), d["variant"], d["symbol"], float(d["time_ms"]), d.get("tflops"), str(d.get("run_id", "")),
                float(d.get("updated", time.time())))


def _trial_from_json(d, i) -> Trial:
    d = _upgrade_record(d)
    _require(d, i, "trials", _KEY_COLUMNS + ("variant", "symbol", "outcome"), _KEY_TYPES + (dict, str, str))
    _optional(d, i, "trials", ("time_ms", "tflops", "max_error", "registers", "spills", "detail", "run_id", "created"),
              (_NUM, _NUM, _NUM, int, int, str, str, _NUM))
    if d["outcome"] not in OUTCOMES:
        raise DatabaseError(f"trials[{i}].outcome: {d['outcome']!r} is not one of {OUTCOMES}")
    _check_key(d, i, "trials")
    _positive(d, i, "trials", ("time_ms", "tflops", "created"))
    _positive(d, i, "trials", ("max_error", "registers", "spills"), allow_zero=True)
    if d["outcome"] == "ok" and d.get("time_ms") is None:
        raise DatabaseError(f"trials[{i}].time_ms: an 'ok' trial needs its time")
    return Trial(_key_from(d), d["variant"], d["symbol"], d["outcome"], d.get("time_ms"), d.get("tflops"),
                 d.get("max_error"), d.get("registers"), d.get("spills"), d.get("detail", ""), d.get("run_id", ""),
                 float(d.get("created", time.time())))


MAX_EXPORT_BYTES = 1 << 30  # far above any real export (20k trials are about 12 MB)


def _read_export(path: Path) -> dict:
    try:
        st = path.stat()
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(st.st_mode):
            raise DatabaseError(f"{path}: not a regular file (a device or FIFO); give an export file")
        if st.st_size > MAX_EXPORT_BYTES:
            raise DatabaseError(f"{path}: {st.st_size} bytes; an export may have at most {MAX_EXPORT_BYTES}")
        text = path.read_bytes().decode("utf-8")
        doc = json.loads(text)
    except FileNotFoundError:
        raise DatabaseError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise DatabaseError(f"{path}: is a directory, not an export file") from None
    except OSError as exc:
        raise DatabaseError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise DatabaseError(f"{path}: not JSON (not UTF-8 text: byte {exc.start})") from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise DatabaseError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise DatabaseError(f"{path}: not an mlagen tuning export (expected \"format\": \"{EXPORT_FORMAT}\")")
    version = doc.get("version")
    if type(version) is not int or version not in (1, SCHEMA_VERSION):  # version 1 records are upgraded as read
        raise DatabaseError(f"{path}: export version {doc.get('version')!r}, this mlagen reads 1 to {SCHEMA_VERSION}")
    return doc
