"""The tuning database: every trial of every tune, and the winner per kernel and shape class.

SQLite in WAL mode with a busy timeout, one transaction per write, so concurrent writers (several
tunes, worker processes) lose nothing. A record is keyed by family, spec, problem bucket, dtypes,
device name and SM count, driver and NVRTC versions, and a hash of the kernel's sources (spec,
template, headers), so a record made for a changed kernel is never used.

Lookups also read the records shipped with the package (``mlagen/tuned/*.json``); the user's
own database wins over them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import re
import sqlite3
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterator

from . import knobs, paths
from .cache import atomic_write
from .errors import DatabaseError

log = logging.getLogger("mlagen")

SCHEMA_VERSION = 2  # 2: the "nvrtc" column became "compiler" ("nvrtc 13.0", "clang 22.1.8", "hiprtc 6.4")
EXPORT_FORMAT = "mlagen-tuning"
OUTCOMES = ("ok", "pruned", "compile_error", "wrong_result", "crash", "hang", "launch_error")

_KEY_COLUMNS = ("family", "spec", "problem", "dtypes", "device", "sm_count", "driver", "compiler", "source_hash")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    created REAL NOT NULL,
    family TEXT NOT NULL, spec TEXT NOT NULL, problem TEXT NOT NULL, dtypes TEXT NOT NULL,
    device TEXT NOT NULL, sm_count INTEGER NOT NULL, driver TEXT NOT NULL, compiler TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    variant TEXT NOT NULL,
    symbol TEXT NOT NULL,
    outcome TEXT NOT NULL CHECK (outcome IN ({", ".join(repr(o) for o in OUTCOMES)})),
    time_ms REAL,
    tflops REAL,
    max_error REAL,
    registers INTEGER,
    spills INTEGER,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS trials_key ON trials ({", ".join(_KEY_COLUMNS)});
CREATE TABLE IF NOT EXISTS best (
    family TEXT NOT NULL, spec TEXT NOT NULL, problem TEXT NOT NULL, dtypes TEXT NOT NULL,
    device TEXT NOT NULL, sm_count INTEGER NOT NULL, driver TEXT NOT NULL, compiler TEXT NOT NULL,
    source_hash TEXT NOT NULL,
    variant TEXT NOT NULL,
    symbol TEXT NOT NULL,
    time_ms REAL NOT NULL,
    tflops REAL,
    run_id TEXT NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY ({", ".join(_KEY_COLUMNS)})
);
"""


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


_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def _included_headers(text: str, seen: set[Path]) -> None:
    """Every header under include/ that ``text`` includes, transitively (both sides of an #if)."""
    for name in _INCLUDE.findall(text):
        p = paths.include_dir() / name
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


class TuningDB:
    """One SQLite file. Every method opens its own short transaction."""

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path) if path is not None else knobs.tuning_db()
        self._initialised = False

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None)
        except sqlite3.Error as exc:
            raise DatabaseError(f"{self.path}: cannot open the tuning database: {exc}") from None
        try:
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA busy_timeout = 60000")
            if not self._initialised:
                self._init(conn)
            yield conn
        except sqlite3.DatabaseError as exc:
            raise DatabaseError(f"{self.path}: {exc}") from None
        finally:
            conn.close()

    def _init(self, conn: sqlite3.Connection) -> None:
        self._use_wal(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            _migrate(conn)
            # One statement at a time: executescript() would commit the open transaction first.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise DatabaseError(
                    f"{self.path}: schema version {row[0]}, this mlagen reads {SCHEMA_VERSION}; "
                    "export it with the mlagen that wrote it, or use a new MLAGEN_TUNING_DB"
                )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._initialised = True

    @staticmethod
    def _use_wal(conn: sqlite3.Connection, timeout_s: float = 60.0) -> None:
        """Switch the file to write-ahead logging once. Several processes opening a new database
        race on the switch, and SQLite answers the loser "locked" without waiting on the busy
        timeout, so the switch alone is retried (the mode persists in the file)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE): all of it lands or none."""
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    # --- writes ---

    def add_trials(self, trials: list[Trial]) -> None:
        for t in trials:
            if t.outcome not in OUTCOMES:
                raise DatabaseError(f"outcome {t.outcome!r} is not one of {OUTCOMES}")
        with self._transaction() as conn:
            for t in trials:
                _insert_trial(conn, t)

    def add_trial(self, trial: Trial) -> None:
        self.add_trials([trial])

    def set_best(self, best: Best) -> None:
        """Record the winner for its key (a newer tune of the same key replaces the old winner)."""
        with self._transaction() as conn:
            _upsert_best(conn, best)

    # --- reads ---

    def bests(self, **where) -> list[Best]:
        clauses, args = _where(where)
        with self._connect() as conn:
            rows = conn.execute(f"SELECT * FROM best{clauses} ORDER BY family, spec, problem", args).fetchall()
        return [_best_from_row(dict(r)) for r in rows]

    def trials(self, run_id: str | None = None, **where) -> list[Trial]:
        if run_id is not None:
            where["run_id"] = run_id
        clauses, args = _where(where)
        with self._connect() as conn:
            rows = conn.execute(f"SELECT * FROM trials{clauses} ORDER BY id", args).fetchall()
        return [_trial_from_row(dict(r)) for r in rows]

    def runs(self) -> list[dict]:
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT run_id, MIN(created) AS started, family, spec, problem, device, COUNT(*) AS trials,"
                " SUM(outcome = 'ok') AS ok FROM trials GROUP BY run_id, family, spec, problem, device"
                " ORDER BY started"
            ).fetchall()
        return [dict(r) for r in rows]

    # --- export / import ---

    def export(self, path: Path | str | None = None, best_only: bool = False) -> dict:
        doc = {
            "format": EXPORT_FORMAT,
            "version": SCHEMA_VERSION,
            "best": [_best_to_json(b) for b in self.bests()],
            "trials": [] if best_only else [_trial_to_json(t) for t in self.trials()],
        }
        if path is not None:
            atomic_write(Path(path), (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
        return doc

    def import_(self, source: Path | str | dict) -> tuple[int, int]:
        """Merge an export (trials appended, winners upserted). Returns (trials, bests) imported.

        The whole document is validated before anything is written, and written in one
        transaction, so a bad file changes nothing.
        """
        doc = source if isinstance(source, dict) else _read_export(Path(source))
        bests = [_best_from_json(b, i) for i, b in enumerate(_records(doc, "best"))]
        trials = [_trial_from_json(t, i) for i, t in enumerate(_records(doc, "trials"))]
        with self._transaction() as conn:
            for t in trials:
                _insert_trial(conn, t)
            for b in bests:
                _upsert_best(conn, b)
        return len(trials), len(bests)


# --- lookup across the user's database and the shipped records -----------------------------


@functools.lru_cache(maxsize=None)
def shipped_records() -> tuple[Best, ...]:
    """Winners shipped with the package, from every ``mlagen/tuned/*.json`` export."""
    out: list[Best] = []
    directory = paths.tuned_dir()
    if directory.is_dir():
        for p in sorted(directory.glob("*.json")):
            doc = _read_export(p)
            out.extend(_with_origin(_best_from_json(b, i), f"shipped:{p.name}")
                       for i, b in enumerate(_records(doc, "best")))
    return tuple(out)


def _with_origin(best: Best, origin: str) -> Best:
    return Best(best.key, best.variant, best.symbol, best.time_ms, best.tflops, best.run_id, best.updated, origin)


def lookup(key: RecordKey, distance, db: TuningDB | None = None, include_shipped: bool = True) -> Best | None:
    """The record to use for ``key``: the user's database first, then the shipped records.

    Within a source, a record must match family, spec, dtypes, device, SM count and source hash
    exactly. Among those, the problem bucket closest to ``key.problem`` wins (``distance(a, b)``
    between bucket strings; inf means unusable), and an exact driver and compiler match breaks ties.
    """
    strict = ("family", "spec", "dtypes", "device", "sm_count", "source_hash")
    sources: list[list[Best]] = []
    if db is not None:
        try:
            sources.append(db.bests(**{k: getattr(key, k) for k in strict}))
        except DatabaseError as exc:
            log.warning("tuning database unreadable, using shipped records and defaults: %s", exc)
            sources.append([])
    if include_shipped:
        sources.append([b for b in shipped_records() if all(getattr(b.key, k) == getattr(key, k) for k in strict)])
    for candidates in sources:
        scored = []
        for b in candidates:
            try:
                d = distance(key.problem, b.key.problem)
            except ValueError as exc:  # a malformed record (hand-edited import) is unusable, not fatal
                log.warning("ignoring tuning record %s (%s): %s", b.symbol, b.origin, exc)
                continue
            if d == float("inf"):
                continue
            toolchain_miss = (b.key.driver != key.driver) + (b.key.compiler != key.compiler)
            scored.append((d, toolchain_miss, -b.updated, b))
        if scored:
            scored.sort(key=lambda s: s[:3])
            return scored[0][3]
    return None


# --- row and JSON conversion ----------------------------------------------------------------


def _insert_trial(conn: sqlite3.Connection, t: Trial) -> None:
    conn.execute(
        f"INSERT INTO trials (run_id, created, {', '.join(_KEY_COLUMNS)}, variant, symbol, outcome,"
        " time_ms, tflops, max_error, registers, spills, detail)"
        f" VALUES (?, ?, {', '.join('?' * len(_KEY_COLUMNS))}, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (t.run_id, t.created, *_key_tuple(t.key), json.dumps(t.variant, sort_keys=True), t.symbol,
         t.outcome, t.time_ms, t.tflops, t.max_error, t.registers, t.spills, t.detail),
    )


def _upsert_best(conn: sqlite3.Connection, b: Best) -> None:
    conn.execute(
        f"INSERT OR REPLACE INTO best ({', '.join(_KEY_COLUMNS)}, variant, symbol, time_ms, tflops, run_id,"
        f" updated) VALUES ({', '.join('?' * len(_KEY_COLUMNS))}, ?, ?, ?, ?, ?, ?)",
        (*_key_tuple(b.key), json.dumps(b.variant, sort_keys=True), b.symbol, b.time_ms, b.tflops,
         b.run_id, b.updated),
    )


def _key_tuple(key: RecordKey) -> tuple:
    return tuple(getattr(key, c) for c in _KEY_COLUMNS)


def _where(where: dict) -> tuple[str, list]:
    for k in where:
        if k not in _KEY_COLUMNS and k != "run_id" and k != "outcome":
            raise DatabaseError(f"cannot filter on {k!r}; filters: {', '.join(_KEY_COLUMNS)}, run_id, outcome")
    if not where:
        return "", []
    return " WHERE " + " AND ".join(f"{k} = ?" for k in where), list(where.values())


def _migrate(conn: sqlite3.Connection) -> None:
    """Bring an older database to SCHEMA_VERSION in place (inside the caller's transaction).

    Version 1 named the compiler column ``nvrtc`` and held NVRTC's bare version; version 2 names
    the compiler generically, so its values become ``"nvrtc <version>"``."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
        return
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
    if row is None or int(row[0]) != 1:
        return
    for table in ("trials", "best"):
        conn.execute(f"ALTER TABLE {table} RENAME COLUMN nvrtc TO compiler")
        conn.execute(f"UPDATE {table} SET compiler = 'nvrtc ' || compiler")
    conn.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))


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
        if not isinstance(d[name], typ):  # the columns are NOT NULL: null is not allowed either
            raise DatabaseError(f"{what}[{i}].{name}: expected {_type_name(typ)}, got {type(d[name]).__name__}")


def _type_name(typ) -> str:
    return " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))


def _optional(d, i, what, names, types):
    for name, typ in zip(names, types):
        if d.get(name) is not None and not isinstance(d[name], typ):
            raise DatabaseError(f"{what}[{i}].{name}: expected {_type_name(typ)} or null, got {type(d[name]).__name__}")


def _records(doc: dict, what: str) -> list:
    items = doc.get(what, [])
    if not isinstance(items, list):
        raise DatabaseError(f"{what}: expected a list, got {type(items).__name__}")
    return items


_KEY_TYPES = (str, str, str, str, str, int, str, str, str)
_NUM = (int, float)


def _best_from_json(d, i) -> Best:
    d = _upgrade_record(d)
    _require(d, i, "best", _KEY_COLUMNS + ("variant", "symbol", "time_ms"), _KEY_TYPES + (dict, str, _NUM))
    _optional(d, i, "best", ("tflops", "run_id", "updated"), (_NUM, str, _NUM))
    return Best(_key_from(d), d["variant"], d["symbol"], float(d["time_ms"]), d.get("tflops"), str(d.get("run_id", "")),
                float(d.get("updated", time.time())))


def _trial_from_json(d, i) -> Trial:
    d = _upgrade_record(d)
    _require(d, i, "trials", _KEY_COLUMNS + ("variant", "symbol", "outcome"), _KEY_TYPES + (dict, str, str))
    _optional(d, i, "trials", ("time_ms", "tflops", "max_error", "registers", "spills", "detail", "run_id", "created"),
              (_NUM, _NUM, _NUM, int, int, str, str, _NUM))
    if d["outcome"] not in OUTCOMES:
        raise DatabaseError(f"trials[{i}].outcome: {d['outcome']!r} is not one of {OUTCOMES}")
    return Trial(_key_from(d), d["variant"], d["symbol"], d["outcome"], d.get("time_ms"), d.get("tflops"),
                 d.get("max_error"), d.get("registers"), d.get("spills"), d.get("detail", ""), d.get("run_id", ""),
                 float(d.get("created", time.time())))


def _read_export(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise DatabaseError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise DatabaseError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
        raise DatabaseError(f"{path}: not an mlagen tuning export (expected \"format\": \"{EXPORT_FORMAT}\")")
    if doc.get("version") not in (1, SCHEMA_VERSION):  # version 1 records are upgraded as they are read
        raise DatabaseError(f"{path}: export version {doc.get('version')!r}, this mlagen reads 1 to {SCHEMA_VERSION}")
    return doc
