"""``MLAGEN_RECORD_SHAPES=FILE``: count the shape classes a process calls kernels with.

Each call adds one to a counter of its (family, shape class), a dictionary increment with no
device synchronisation; the first call of a class also keeps a description of it (the family's
shape text, e.g. ``b=4,q=4096,k=4096,h=16,causal``). The counts are merged into FILE at exit and
every ``FLUSH_EVERY`` calls, under a lock and atomically, adding to the counts already there, so
several processes (or runs) of a service add up. ``mlagen tune --workload FILE`` reads it:

    # written by MLAGEN_RECORD_SHAPES
    family: mla_prefill
    shapes:
      - {shape: "b=4,q=4096,k=4096,h=16,causal", weight: 120}   # weight = number of calls

One file holds one family; a file written for another family is left alone (with a warning).
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
from pathlib import Path
from typing import Callable

from . import knobs
from .cache import atomic_write, file_lock

log = logging.getLogger("mlagen")

FLUSH_EVERY = 1000
HEADER = "# written by MLAGEN_RECORD_SHAPES"

_lock = threading.Lock()
_path: Path | None = None
_resolved = False
_counts: dict[tuple[str, str], int] = {}     # (family, shape class) -> calls
_flushed: dict[tuple[str, str], int] = {}    # how many of those are already in the file
_described: dict[tuple[str, str], str] = {}  # (family, shape class) -> description of its first call
_pending = 0


def _target() -> Path | None:
    global _path, _resolved
    if not _resolved:
        raw = knobs.record_shapes()
        _path = Path(raw) if raw else None
        _resolved = True
        if _path is not None:
            atexit.register(flush)
    return _path


def enabled() -> bool:
    """Whether this process records shapes (``MLAGEN_RECORD_SHAPES`` was set when first asked)."""
    return _target() is not None


def note(family: str, shape_class: str, describe: Callable[[], str]) -> None:
    """Count one call of ``shape_class``; ``describe()`` is called on the first call of a class only."""
    global _pending
    if _target() is None:
        return
    key = (family, shape_class)
    with _lock:
        if key not in _described:
            _described[key] = describe()
        _counts[key] = _counts.get(key, 0) + 1
        _pending += 1
        due = _pending >= FLUSH_EVERY
    if due:
        flush()


def read(path: Path | str) -> tuple[str | None, list[dict]]:
    """(family, [{"shape": text, "weight": calls}, ...]) of a recorded file; ValueError if malformed."""
    import yaml

    text = Path(path).read_text()
    doc = yaml.safe_load(text) or {}
    if not isinstance(doc, dict) or not isinstance(doc.get("shapes", []), list):
        raise ValueError(f"{path}: expected a mapping with 'family' and a list 'shapes'")
    shapes = []
    for i, item in enumerate(doc.get("shapes") or []):
        if (not isinstance(item, dict) or not isinstance(item.get("shape"), str)
                or isinstance(item.get("weight"), bool) or not isinstance(item.get("weight"), int)):
            raise ValueError(f"{path}: shapes[{i}]: expected {{shape: <text>, weight: <calls>}}, got {item!r}")
        shapes.append({"shape": item["shape"], "weight": item["weight"]})
    return doc.get("family"), shapes


def format_file(family: str, shapes: list[dict]) -> str:
    lines = [HEADER, f"family: {family}", "shapes:"]
    for s in shapes:
        lines.append(f"  - {{shape: {json.dumps(s['shape'])}, weight: {s['weight']}}}")
    if not shapes:
        lines[-1] = "shapes: []"
    return "\n".join(lines) + "\n"


def flush() -> None:
    """Merge the calls counted since the last flush into the file (atomically, under a lock)."""
    global _pending
    path = _target()
    if path is None:
        return
    with _lock:
        delta = {k: n - _flushed.get(k, 0) for k, n in _counts.items() if n > _flushed.get(k, 0)}
        described = dict(_described)
        _pending = 0
    if not delta:
        return
    by_family: dict[str, dict[str, int]] = {}
    for (family, cls), n in delta.items():
        by_family.setdefault(family, {})[described[(family, cls)]] = n
    try:
        with file_lock(path.with_name(path.name + ".lock")):
            family_there, shapes = read(path) if path.exists() else (None, [])
            if len(by_family) > 1 or (family_there is not None and family_there not in by_family):
                log.warning("MLAGEN_RECORD_SHAPES=%s holds %s shapes; not mixing in %s (one family per file)",
                            path, family_there, ", ".join(sorted(set(by_family) - {family_there})))
                return
            [(family, add)] = by_family.items()
            merged = {s["shape"]: s["weight"] for s in shapes}
            for text, n in add.items():
                merged[text] = merged.get(text, 0) + n
            out = [{"shape": t, "weight": w} for t, w in sorted(merged.items(), key=lambda x: -x[1])]
            atomic_write(path, format_file(family, out).encode())
    except (OSError, ValueError) as exc:
        log.warning("MLAGEN_RECORD_SHAPES=%s: not written: %s", path, exc)
        return
    with _lock:
        for k, n in delta.items():
            _flushed[k] = _flushed.get(k, 0) + n


def reset() -> None:
    """Forget the counts and re-read the knob (for tests)."""
    global _resolved, _path, _pending
    with _lock:
        _counts.clear()
        _flushed.clear()
        _described.clear()
        _resolved, _path, _pending = False, None, 0
