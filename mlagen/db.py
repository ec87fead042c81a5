"""The tuning database: every trial of every tune, and the winner per kernel and shape class.

SQLite in WAL mode with a busy timeout, one transaction per write, so concurrent writers (several
tunes, worker processes) lose nothing. A record is keyed by family, spec, problem bucket, dtypes,
device name and SM count, driver and NVRTC versions, and a hash of the kernel's sources (spec,
template, headers), so a record made for a changed kernel is never used.

Lookups read the user's database and the records shipped with the package (``mlagen/tuned/*.json``)
together: the nearest shape class wins, the user's record wins a tie (see :func:`lookup`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sqlite3
import stat
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from . import knobs, paths
from .cache import atomic_write
from .errors import DatabaseError
from .records import (_KEY_COLUMNS, EXPORT_FORMAT, OUTCOMES, SCHEMA_VERSION, Best, RecordKey, Trial,  # noqa: F401
                      _best_from_json, _best_from_row, _best_to_json, _check_variant, _included_headers,
                      _read_export, _records, _trial_from_json, _trial_from_row, _trial_to_json, source_hash)

log = logging.getLogger("mlagen")



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


class TuningDB:
    """One SQLite file. Every method opens its own short connection.

    Reads never write and never wait on a writer: they open the file read-only (``mode=ro``, so
    no schema setup, no journal-mode switch, no directory or file created), find no records where
    there is no file, and read a WAL database while an import writes it (WAL readers see the last
    commit). A database on a read-only mount is opened ``immutable`` (SQLite then skips the
    ``-shm`` it cannot create). Only writes create the file, switch it to WAL and set up the
    schema, under ``BEGIN IMMEDIATE``. A SQLite file with tables but no mlagen ``meta`` table is
    another application's: reads find nothing mlagen could use in it and writes refuse it.
    """

    READ_TIMEOUT_S = 5.0    # a reader waits on a lock only in rare WAL recovery
    WRITE_TIMEOUT_S = 60.0  # writers queue behind each other (several tunes, an import)

    def __init__(self, path: Path | str | None = None):
        self.path = Path(path).expanduser() if path is not None else knobs.tuning_db()
        self._initialised = False

    def _check_regular(self) -> bool:
        """Whether the file exists; DatabaseError if it is not a regular file (/dev/null, a FIFO,
        a directory), which SQLite would misread or write journals next to."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return False
        except NotADirectoryError:
            return False
        except OSError as exc:
            raise DatabaseError(f"{self.path}: cannot open the tuning database: {exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):
            raise DatabaseError(f"{self.path}: not a regular file; the tuning database must be a file")
        return True

    @contextlib.contextmanager
    def _read(self) -> Iterator[tuple[sqlite3.Connection, dict] | tuple[None, None]]:
        """A read-only connection and the table expressions to read ``best`` and ``trials``
        through (a version-1 database is read as version 2 and upgraded by the next write), or
        ``(None, None)`` where there is no database (nothing to read)."""
        if not self._check_regular():
            yield None, None
            return
        conn = None
        uri = f"file:{urllib.parse.quote(str(self.path.absolute()))}"
        for mode in ("?mode=ro", "?mode=ro&immutable=1"):
            try:
                conn = sqlite3.connect(uri + mode, uri=True, timeout=self.READ_TIMEOUT_S, isolation_level=None)
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
                break
            except sqlite3.OperationalError as exc:
                if conn is not None:
                    conn.close()
                    conn = None
                # A WAL file on a read-only mount: its -shm cannot be made, and nobody can write
                # there, so it is read as immutable (what SQLite recommends for read-only media).
                if "unable to open" not in str(exc) or not os.access(self.path, os.R_OK) or mode != "?mode=ro":
                    raise DatabaseError(f"{self.path}: cannot open the tuning database: {exc}") from None
            except sqlite3.DatabaseError as exc:
                raise DatabaseError(f"{self.path}: {exc}") from None
        try:
            conn.row_factory = sqlite3.Row
            version = self._schema_version(conn)
            if version is None:
                yield None, None
                return
            if version == 1:
                yield conn, {t: f"(SELECT *, 'nvrtc ' || nvrtc AS compiler FROM {t})" for t in ("best", "trials")}
            else:
                yield conn, {"best": "best", "trials": "trials"}
        except sqlite3.DatabaseError as exc:
            raise DatabaseError(f"{self.path}: {exc}") from None
        finally:
            conn.close()

    def _schema_version(self, conn: sqlite3.Connection) -> int | None:
        """The schema version of an mlagen database this mlagen reads (1 or SCHEMA_VERSION); None
        for one with no tables yet, or another application's; DatabaseError for another version."""
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            if tables:
                log.warning("%s: not an mlagen tuning database (tables %s); no records read from it",
                            self.path, ", ".join(sorted(tables)))
            return None
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None or not {"best", "trials"} <= tables:
            return None
        if row[0] not in ("1", str(SCHEMA_VERSION)):
            raise DatabaseError(f"{self.path}: schema version {row[0]}, this mlagen reads {SCHEMA_VERSION}; "
                                "export it with the mlagen that wrote it, or use a new MLAGEN_TUNING_DB")
        return int(row[0])

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A read-write connection; creates the file and its schema if needed (writes only)."""
        self._check_regular()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatabaseError(f"{self.path}: cannot create its directory: {exc.strerror or exc}") from None
        try:
            conn = sqlite3.connect(self.path, timeout=self.WRITE_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise DatabaseError(f"{self.path}: cannot open the tuning database: {exc}") from None
        try:
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {int(self.WRITE_TIMEOUT_S * 1000)}")
            if not self._initialised:
                self._init(conn)
            yield conn
        except sqlite3.DatabaseError as exc:
            raise DatabaseError(f"{self.path}: {exc}") from None
        finally:
            conn.close()

    def _init(self, conn: sqlite3.Connection) -> None:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and "meta" not in tables:
            raise DatabaseError(f"{self.path}: not an mlagen tuning database (it holds tables "
                                f"{', '.join(sorted(tables))}); give another --db / MLAGEN_TUNING_DB")
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
            elif row[0] != str(SCHEMA_VERSION):
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
        with self._read() as (conn, tables):
            if conn is None:
                return []
            rows = conn.execute(f"SELECT * FROM {tables['best']}{clauses} ORDER BY family, spec, problem",
                                args).fetchall()
        return [_best_from_row(dict(r)) for r in rows]

    def trials(self, run_id: str | None = None, **where) -> list[Trial]:
        if run_id is not None:
            where["run_id"] = run_id
        clauses, args = _where(where)
        with self._read() as (conn, tables):
            if conn is None:
                return []
            rows = conn.execute(f"SELECT * FROM {tables['trials']}{clauses} ORDER BY id", args).fetchall()
        return [_trial_from_row(dict(r)) for r in rows]

    def runs(self) -> list[dict]:
        with self._read() as (conn, tables):
            if conn is None:
                return []
            rows = conn.execute(
                "SELECT run_id, MIN(created) AS started, family, spec, problem, device, COUNT(*) AS trials,"
                f" SUM(outcome = 'ok') AS ok FROM {tables['trials']} GROUP BY run_id, family, spec, problem, device"
                " ORDER BY started"
            ).fetchall()
        return [dict(r) for r in rows]

    # --- export / import ---

    def export(self, path: Path | str | None = None, best_only: bool = False, overwrite: bool = False) -> dict:
        """The database as an export document; written to ``path`` (atomically) if given. An
        existing file is refused unless ``overwrite``: an export replaces it whole."""
        if path is not None and Path(path).exists() and not overwrite:
            raise DatabaseError(f"{path}: already exists; export refuses to overwrite it (--force to replace it)")
        doc = {
            "format": EXPORT_FORMAT,
            "version": SCHEMA_VERSION,
            "best": [_best_to_json(b) for b in self.bests()],
            "trials": [] if best_only else [_trial_to_json(t) for t in self.trials()],
        }
        if path is not None:
            atomic_write(Path(path), (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
        return doc

    def import_(self, source: Path | str | dict, replace: bool = False) -> "ImportReport":
        """Merge an export into the database and say what happened.

        Trials are keyed by record key, run, variant, outcome and time of creation: one already
        in the database (a re-import) is skipped. A winner is added where the database has none
        for its key, and replaces the database's only if it is faster (or with ``replace``);
        otherwise the database's is kept and the imported one rejected. Every record is
        validated first (types, positive figures, tunables and values the packaged spec knows),
        and everything is written in one transaction, so a bad file changes nothing.
        """
        where = "<document>" if isinstance(source, dict) else str(source)
        doc = source if isinstance(source, dict) else _read_export(Path(source))
        try:
            bests = [_best_from_json(b, i) for i, b in enumerate(_records(doc, "best"))]
            trials = [_trial_from_json(t, i) for i, t in enumerate(_records(doc, "trials"))]
            specs: dict = {}
            for i, b in enumerate(bests):
                _check_variant(b.key, b.variant, f"best[{i}]", specs, b.symbol)
            for i, t in enumerate(trials):
                _check_variant(t.key, t.variant, f"trials[{i}]", specs, t.symbol)
        except DatabaseError as exc:
            raise DatabaseError(f"{where}: {exc}") from None
        report = ImportReport()
        with self._transaction() as conn:
            # The trials present, read once per record key (one indexed query each), so an import
            # is linear in its trials; a trial repeated within the file is skipped the same way.
            present: dict[tuple, set] = {}
            fresh = []
            for t in trials:
                k = _key_tuple(t.key)
                if k not in present:
                    present[k] = _trial_identities(conn, k)
                ident = _trial_identity(t)
                if ident in present[k]:
                    report.trials_skipped += 1
                else:
                    present[k].add(ident)
                    fresh.append(t)
            _insert_trials(conn, fresh)
            report.trials_added = len(fresh)
            for b in bests:
                row = conn.execute(f"SELECT symbol, time_ms FROM best WHERE {' AND '.join(f'{c} = ?' for c in _KEY_COLUMNS)}",
                                   _key_tuple(b.key)).fetchone()
                if row is None:
                    report.added.append(b)
                elif replace or b.time_ms < row["time_ms"]:
                    report.replaced.append((row["symbol"], row["time_ms"], b))
                else:
                    report.kept.append((row["symbol"], row["time_ms"], b))
                    continue
                _upsert_best(conn, b)
        return report


@dataclass
class ImportReport:
    """What an import did: trials added and skipped (already present); winners added, replaced
    (``(old symbol, old ms, new)``) and kept (``(kept symbol, kept ms, rejected new)``)."""

    trials_added: int = 0
    trials_skipped: int = 0
    added: list = field(default_factory=list)
    replaced: list = field(default_factory=list)
    kept: list = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"trials: {self.trials_added} added, {self.trials_skipped} already present",
               f"winners: {len(self.added)} added, {len(self.replaced)} replaced, {len(self.kept)} kept"]
        for old, old_ms, new in self.replaced:
            out.append(f"  replaced {old} ({old_ms:.3f} ms) by {new.symbol} ({new.time_ms:.3f} ms) "
                       f"for {new.key.spec} {new.key.problem}")
        for old, old_ms, new in self.kept:
            out.append(f"  kept {old} ({old_ms:.3f} ms), rejected {new.symbol} ({new.time_ms:.3f} ms) "
                       f"for {new.key.spec} {new.key.problem}")
        return out


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


#: How much farther a record of another device of the same architecture and SM count counts than
#: one of the key's own device, in the distance's units (doublings): measured on the H200, the
#: H100's records are the best choice for the classes they were tuned on, and a class's kernel
#: depends more on its sizes than on which of the two devices ran the tune.
OTHER_DEVICE_COST = 1.0


def lookup(key: RecordKey, distance, db: TuningDB | None = None, include_shipped: bool = True,
           same_arch=None) -> Best | None:
    """The record to use for ``key``: the first of :func:`candidates`, or None."""
    ranked = candidates(key, distance, db, include_shipped, same_arch)
    return ranked[0] if ranked else None


def candidates(key: RecordKey, distance, db: TuningDB | None = None, include_shipped: bool = True,
               same_arch=None) -> list[Best]:
    """The records usable for ``key``, best first, over the user's database and the shipped
    records together (dispatch tries them in order before the spec's default).

    A record must match family, spec, dtypes and source hash exactly. Records of the key's own
    device (name and SM count) and, if ``same_arch(record_key)`` says a record's device is of the
    same architecture, records of other devices with the same SM count are ranked together by
    distance (``distance(a, b)`` between bucket strings, in doublings of a class's sizes; inf means
    unusable), another device's counting :data:`OTHER_DEVICE_COST` farther; records of the same
    architecture with another SM count come after all of those. At equal cost the key's own device
    wins, then the user's database over the shipped records, then an exact driver and compiler
    match, then the newest. So an exact shipped record beats a near user record, a user record
    beats a shipped one at the same distance, and a device's own record of a class one doubling
    away beats another device's exact one, but not of a class two doublings away (an H200's
    chunked-prefill record at 16 heads does not serve its 128-head prefill while the H100's exact
    record exists).

    A record's ``origin`` is "user" or "shipped:<file>", followed by " (other device: <name>)"
    for a record made on another device.
    """
    strict = {k: getattr(key, k) for k in ("family", "spec", "dtypes", "source_hash")}
    sources: list[tuple[int, list[Best]]] = []
    if db is not None:
        try:
            sources.append((0, db.bests(**strict)))
        except DatabaseError as exc:
            log.warning("tuning database unreadable, using shipped records and defaults: %s", exc)
    if include_shipped:
        sources.append((1, [b for b in shipped_records() if all(getattr(b.key, k) == v for k, v in strict.items())]))
    scored = []
    for rank, candidates in sources:
        for b in candidates:
            tier = _device_tier(key, b.key, same_arch)
            if tier is None:
                continue
            try:
                d = distance(key.problem, b.key.problem)
            except ValueError as exc:  # a malformed record (hand-edited import) is unusable, not fatal
                log.warning("ignoring tuning record %s (%s): %s", b.symbol, b.origin, exc)
                continue
            if d == float("inf"):
                continue
            toolchain_miss = (b.key.driver != key.driver) + (b.key.compiler != key.compiler)
            cost = d + (OTHER_DEVICE_COST if tier == 1 else 0.0)
            scored.append(((tier == 2, cost, tier, rank, toolchain_miss, -b.updated), b))
    scored.sort(key=lambda s: s[0])
    return [_with_origin(b, f"{b.origin} (other device: {b.key.device})") if tier else b
            for (_, _, tier, *_), b in scored]


def _device_tier(key: RecordKey, record: RecordKey, same_arch) -> int | None:
    """0: the key's device; 1: same architecture and SM count; 2: same architecture; None: unusable."""
    if record.device == key.device and record.sm_count == key.sm_count:
        return 0
    if same_arch is None or not same_arch(record):
        return None
    return 1 if record.sm_count == key.sm_count else 2


# --- row and JSON conversion ----------------------------------------------------------------


_INSERT_TRIAL = (f"INSERT INTO trials (run_id, created, {', '.join(_KEY_COLUMNS)}, variant, symbol, outcome,"
                 " time_ms, tflops, max_error, registers, spills, detail)"
                 f" VALUES (?, ?, {', '.join('?' * len(_KEY_COLUMNS))}, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def _trial_row(t: Trial) -> tuple:
    return (t.run_id, t.created, *_key_tuple(t.key), json.dumps(t.variant, sort_keys=True), t.symbol,
            t.outcome, t.time_ms, t.tflops, t.max_error, t.registers, t.spills, t.detail)


def _insert_trial(conn: sqlite3.Connection, t: Trial) -> None:
    conn.execute(_INSERT_TRIAL, _trial_row(t))


def _insert_trials(conn: sqlite3.Connection, trials: list[Trial]) -> None:
    conn.executemany(_INSERT_TRIAL, (_trial_row(t) for t in trials))


def _trial_identity(t: Trial) -> tuple:
    """What makes a trial the same one (a re-import): within its key, the run, variant, outcome
    and time of creation."""
    return (t.run_id, json.dumps(t.variant, sort_keys=True), t.outcome, float(t.created))


def _trial_identities(conn: sqlite3.Connection, key: tuple) -> set:
    rows = conn.execute(f"SELECT run_id, variant, outcome, created FROM trials WHERE "
                        f"{' AND '.join(f'{c} = ?' for c in _KEY_COLUMNS)}", key)
    return {(r[0], r[1], r[2], float(r[3])) for r in rows}


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

