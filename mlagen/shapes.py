"""Shapes by text, for any family: resolving ids and descriptions, and weighted workload files.

A shape is the family's own object (``mlagen/families/base.py``): each family parses its ids
(``D1`` ... ``D7`` of BENCHMARKS.md are dense MLA prefill's, ``S1`` ... ``S6`` sparse MLA
prefill's) and its description grammar. This module names no family: :func:`parse_shape` asks the
family it is given (a family, its name, or a spec), or else every family, and takes the one
answer.

A workload file (YAML) is a weighted list of shapes, e.g. what ``MLAGEN_RECORD_SHAPES`` wrote::

    family: mla_prefill
    shapes:
      - {shape: "b=4,q=4096,k=4096,h=16,causal", weight: 120}
      - {shape: D4, weight: 3}

``family`` is optional: without it each shape is read by whichever family reads it.

Importing this module imports neither torch nor a GPU library.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from . import families
from .errors import ShapeError


def family_for(family) -> families.Family:
    """The family named by ``family``: a Family, a family name, or a spec (its ``family:``).

    Raises:
        ShapeError (a ValueError): for a name that is no family, listing the known ones.
    """
    if isinstance(family, families.Family):
        return family
    if isinstance(family, str):
        if family not in families.names():
            raise ShapeError(f"family: {family!r}; allowed: {', '.join(families.names())}")
        return families.get(family)
    if hasattr(family, "family") and hasattr(family, "path"):
        return families.get(family.family, family.path)
    raise ShapeError(f"family: expected a family, its name or a spec, got {type(family).__name__}")


def _all_families() -> list[families.Family]:
    return [families.get(name) for name in families.names()]


def parse_shape(text: str, family=None) -> Any:
    """The shape an id (``D1``, ``S3``, any case) or a description stands for.

    With ``family`` (a Family, its name, or a spec), that family reads ``text``; without, every
    family is asked and exactly one must read it.

    Raises:
        ShapeError (a ValueError): one line naming the text and what is allowed (every family's
        reason when none reads it), or the families when more than one does.
    """
    if not isinstance(text, str):
        raise ShapeError(f"shape: expected a string, got {type(text).__name__}")
    _check_numbers(text)
    if family is not None:
        fam = family_for(family)
        try:
            return fam.parse_shape(text)
        except ShapeError:
            raise
        except ValueError as exc:
            raise ShapeError(str(exc)) from None
    found, reasons = [], []
    for fam in _all_families():
        try:
            found.append((fam, fam.parse_shape(text)))
        except ValueError as exc:
            reasons.append(f"{exc} ({fam.name})")
    if len(found) == 1:
        return found[0][1]
    if found:
        raise ShapeError(f"shape {text.strip()!r} is ambiguous: {', '.join(f.name for f, _ in found)} all read it; "
                         "name the family (a spec, or 'family:' in a workload file)")
    raise ShapeError(" | ".join(r.replace("\n", " ") for r in reasons))


MAX_SHAPE_NUMBER = 1 << 24  # 16M: more tokens, sequences or heads than any kernel call has
_NUMBER = re.compile(r"\d+")


def _check_numbers(text: str) -> None:
    """Every number in a description is at most MAX_SHAPE_NUMBER: a batch of 2e9 would make the
    families' per-sequence tuples take gigabytes before any check of theirs could refuse it."""
    for m in _NUMBER.finditer(text):
        if len(m.group()) > 9 or int(m.group()) > MAX_SHAPE_NUMBER:
            raise ShapeError(f"shape {text.strip()[:80]!r}: {m.group()[:20]} is too large (every length, batch and "
                             f"head count is at most {MAX_SHAPE_NUMBER})")


def parse_shapes(text: str | Iterable[str], family=None) -> list:
    """Shapes from one description, a comma-separated list of ids (``"D1,D3"``; ``"all"``: every
    named shape of ``family``), or an iterable of ids and descriptions; in order, each once.

    Raises:
        ShapeError (a ValueError): naming the first text no family reads, as :func:`parse_shape`.
    """
    if isinstance(text, str):
        if "=" in text or ("," not in text and text.strip().lower() != "all"):
            return [parse_shape(text, family)]  # one description (or one id), not a list of ids
        items = [i.strip() for i in text.split(",") if i.strip()]
    else:
        items = [i.strip() for i in text if i.strip()]
    if not items:
        raise ShapeError("no shape given; give an id (such as D1) or a description")
    out = []
    for item in items:
        if item.lower() == "all":
            if family is None:
                raise ShapeError("shape 'all': name the family (a spec) whose shapes to take")
            out += list(family_for(family).shapes().values())
        else:
            out.append(parse_shape(item, family))
    return list({s.id: s for s in out}.values())


# --- workloads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadItem:
    """One entry of a workload: a family's shape and its weight (e.g. its share of calls)."""

    shape: Any
    weight: float


def parse_workload(doc, source: str = "<workload>", family=None) -> list[WorkloadItem]:
    """A workload document (parsed YAML) into weighted shapes, in file order.

    ``family`` (a Family, its name, or a spec) is the family the caller needs (the tuned spec's):
    the file's ``family:`` must be it, and it reads the shapes.

    Raises:
        ShapeError (a ValueError): naming the file, the entry and what is allowed.
    """
    if not isinstance(doc, dict):
        raise ShapeError(f"{source}: expected a mapping with 'family' and 'shapes'")
    unknown = set(doc) - {"family", "shapes"}
    if unknown:
        raise ShapeError(f"{source}: unknown key {sorted(unknown)[0]!r}; allowed: family, shapes")
    wanted = family_for(family) if family is not None else None
    fam = wanted
    if "family" in doc:
        name = doc["family"]
        if wanted is not None and name != wanted.name:
            raise ShapeError(f"{source}: family: {name!r}; the spec's family is {wanted.name!r}")
        try:
            fam = family_for(name)
        except ShapeError as exc:
            raise ShapeError(f"{source}: {exc}") from None
    entries = doc.get("shapes")
    if not isinstance(entries, list) or not entries:
        raise ShapeError(f"{source}: shapes: expected a non-empty list of {{shape: ..., weight: ...}}")
    items = []
    for i, entry in enumerate(entries):
        where = f"{source}: shapes[{i}]"
        if isinstance(entry, str):
            entry = {"shape": entry}
        if not isinstance(entry, dict) or "shape" not in entry:
            raise ShapeError(f"{where}: expected {{shape: <id or description>, weight: <number>}}")
        extra = set(entry) - {"shape", "weight"}
        if extra:
            raise ShapeError(f"{where}: unknown key {sorted(extra)[0]!r}; allowed: shape, weight")
        weight = entry.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
            raise ShapeError(f"{where}.weight: expected a positive number (finite), got {weight!r}")
        try:
            shape = parse_shape(str(entry["shape"]), fam)
        except ShapeError as exc:
            raise ShapeError(f"{where}.shape: {exc}") from None
        items.append(WorkloadItem(shape, float(weight)))
    return items


def load_workload(path: str | Path, family=None) -> list[WorkloadItem]:
    """Read a workload YAML file (format in the module docstring; ``family`` as :func:`parse_workload`)."""
    from .fsutil import InputError, read_yaml

    p = Path(path).expanduser()
    try:
        doc = read_yaml(p, "workload file")
    except InputError as exc:
        raise ShapeError(str(exc)) from None
    return parse_workload(doc, str(p), family)
