"""The tuning database's open / read / write discipline (issue 42, points 1, 2, 3, 5 and 13's
dispatch case): readers never wait on a writer and never change what they read, an import is
linear in its trials, a read-only database serves reads."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time

import pytest
from click.testing import CliRunner

from mlagen import db
from mlagen.cli import cli
from mlagen.errors import DatabaseError
from test_db import best, distance, key, trial


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _in_thread(fn, timeout_s: float):
    """``fn()``'s result, or a failure if it has not returned within ``timeout_s``."""
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("value", fn()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the read still waits after {timeout_s} s"
    return out["value"]


def test_reads_do_not_wait_on_a_writer(tmp_path):
    """Point 1: a write transaction in progress (an import) does not block ls / show / export or
    dispatch's lookup, and they see the user's committed record."""
    path = tmp_path / "tuning.sqlite"
    tdb = db.TuningDB(path)
    tdb.set_best(best(symbol="users"))
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO meta VALUES ('busy', 'yes')")
    try:
        reader = db.TuningDB(path)
        start = time.monotonic()
        bests = _in_thread(reader.bests, 2.0)
        ranked = _in_thread(lambda: db.candidates(key(), distance, db.TuningDB(path), include_shipped=False), 2.0)
        _in_thread(lambda: reader.export(tmp_path / "out.json"), 2.0)
        assert time.monotonic() - start < 2.0
        assert [b.symbol for b in bests] == ["users"] and ranked[0].origin == "user"
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def _import_doc(n: int) -> dict:
    return {"format": db.EXPORT_FORMAT, "version": db.SCHEMA_VERSION, "best": [],
            "trials": [db._trial_to_json(trial(i)) | {"created": 1000.0 + i, "tflops": 100.0} for i in range(n)]}


def test_import_work_is_linear_in_the_trials_of_one_key(tmp_path, monkeypatch):
    """Point 2: SQLite's own work (virtual-machine steps, counted by its progress handler, so the
    machine's load does not matter) for an import and a re-import grows linearly with the trials
    of one key: 4x the trials, about 4x the steps (a lookup per trial that scans the key's trials
    made it 16x)."""
    steps = {"n": 0}
    connect = db.TuningDB._connect

    def counting(self):
        cm = connect(self)
        conn = cm.__enter__()
        conn.set_progress_handler(lambda: steps.__setitem__("n", steps["n"] + 1) or 0, 100)
        return _Wrapped(cm, conn)

    monkeypatch.setattr(db.TuningDB, "_connect", counting)
    work = {}
    for n in (1000, 4000):
        steps["n"] = 0
        tdb = db.TuningDB(tmp_path / f"{n}.sqlite")
        doc = _import_doc(n)
        assert tdb.import_(doc).trials_added == n
        assert tdb.import_(doc).trials_skipped == n
        work[n] = steps["n"]
    assert work[4000] < 6 * work[1000], work


class _Wrapped:
    def __init__(self, cm, conn):
        self.cm, self.conn = cm, conn

    def __enter__(self):
        return self.conn

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def test_import_of_20k_trials_takes_seconds(tmp_path):
    """Point 2's bar: 20k trials of one key, imported then re-imported, in a few CPU seconds."""
    n = 20000
    doc = _import_doc(n)
    tdb = db.TuningDB(tmp_path / "tuning.sqlite")
    start = time.process_time()
    assert tdb.import_(doc).trials_added == n
    again = tdb.import_(doc)
    seconds = time.process_time() - start
    assert again.trials_added == 0 and again.trials_skipped == n
    assert seconds < 10.0, f"two imports of {n} trials took {seconds:.1f} CPU s"


def test_a_read_leaves_a_foreign_sqlite_file_byte_identical(tmp_path):
    """Point 5: `db ls` on another application's SQLite file adds no table and no WAL."""
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('hello')")
    conn.commit()
    conn.close()
    before = _digest(path)
    result = CliRunner().invoke(cli, ["db", "--db", str(path), "ls"])
    assert result.exit_code == 0, result.output
    assert _digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.sqlite"]
    with pytest.raises(DatabaseError, match="not an mlagen tuning database"):
        db.TuningDB(path).add_trial(trial())
    assert _digest(path) == before


def test_reads_create_nothing(tmp_path, monkeypatch):
    """Point 5: reading a database that does not exist creates neither it nor its directory."""
    monkeypatch.setenv("MLAGEN_OUT_DIR", str(tmp_path / "out"))
    monkeypatch.delenv("MLAGEN_TUNING_DB", raising=False)
    runner = CliRunner()
    for args in (["db", "ls"], ["db", "show"], ["db", "export", str(tmp_path / "x.json")]):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, result.output
    assert not (tmp_path / "out").exists()


def test_a_device_node_is_refused_and_no_journal_is_made(tmp_path):
    """Point 5: --db /dev/null is not a database; no /dev/null-journal appears (one left by another
    program beforehand is not ours: then it must be untouched)."""
    import os

    before = os.stat("/dev/null-journal").st_mtime_ns if os.path.exists("/dev/null-journal") else None
    result = CliRunner().invoke(cli, ["db", "--db", "/dev/null", "ls"])
    assert result.exit_code == 1 and "not a regular file" in result.output
    result = CliRunner().invoke(cli, ["db", "--db", "/dev/null", "import", str(tmp_path / "none.json")])
    assert result.exit_code == 1
    after = os.stat("/dev/null-journal").st_mtime_ns if os.path.exists("/dev/null-journal") else None
    assert after == before


def test_a_read_only_wal_database_serves_reads(tmp_path):
    """Point 3: a WAL database whose -shm cannot be made (as on a read-only mount) is read."""
    path = tmp_path / "tuning.sqlite"
    db.TuningDB(path).set_best(best(symbol="users"))
    db.TuningDB(path).add_trial(trial())
    for extra in ("-wal", "-shm"):
        (tmp_path / f"tuning.sqlite{extra}").unlink(missing_ok=True)
    (tmp_path / "tuning.sqlite-shm").mkdir()  # what cannot be created on a read-only mount
    before = _digest(path)
    tdb = db.TuningDB(path)
    assert [b.symbol for b in tdb.bests()] == ["users"] and len(tdb.trials()) == 1
    ranked = db.candidates(key(), distance, tdb, include_shipped=False)
    assert ranked and ranked[0].origin == "user"
    result = CliRunner().invoke(cli, ["db", "--db", str(path), "ls"])
    assert result.exit_code == 0 and "users" in result.output
    assert _digest(path) == before


def test_dispatch_falls_back_when_the_database_directory_is_a_file(tmp_path):
    """Point 13: a database whose parent is a file reads as empty (no FileExistsError)."""
    (tmp_path / "file").write_text("")
    tdb = db.TuningDB(tmp_path / "file" / "tuning.sqlite")
    assert tdb.bests() == []
    assert db.candidates(key(), distance, tdb, include_shipped=False) == []
    with pytest.raises(DatabaseError, match="cannot create its directory"):
        tdb.add_trial(trial())


def _shipped_doc():
    """One valid export: a shipped record (its variant names every tunable) as the user's."""
    record = db._best_to_json(db.shipped_records()[0])
    return {"format": db.EXPORT_FORMAT, "version": db.SCHEMA_VERSION, "best": [record], "trials": []}


def _set(path, value):
    def fn(doc):
        doc["best"][0][path] = value
        return doc
    return fn


BAD_RECORDS = [
    ("malformed problem", _set("problem", "causal/h128/q8192"), "best[0].problem: 'causal/h128/q8192' is not a shape"),
    ("symbol of another variant", _set("symbol", "mla_prefill_sm80_causal_m64_n32_w4_s2_swpad_qr0"),
     "best[0].symbol: 'mla_prefill_sm80_causal_m64_n32_w4_s2_swpad_qr0' is not the kernel"),
    ("empty symbol", _set("symbol", ""), "best[0].symbol: must not be empty"),
    ("empty variant", _set("variant", {}), "best[0].variant: empty"),
    ("NUL in the device", _set("device", "NVIDIA\x00H100"), "holds control or format characters"),
    ("RTL override", _set("run_id", "abc\u202edef"), "best[0].run_id: 'abc\\u202edef' holds control"),
    ("SM count past 64 bits", _set("sm_count", 2 ** 63), "best[0].sm_count: expected int, got 9223372036854775808"),
    ("time of 10^400", _set("time_ms", 10 ** 400), "best[0].time_ms: expected int or float, got 1000000"),
    ("float SM count", _set("sm_count", 1e30), "best[0].sm_count: expected int, got float"),
]


@pytest.mark.parametrize("mutate, match", [c[1:] for c in BAD_RECORDS], ids=[c[0] for c in BAD_RECORDS])
def test_import_refuses_records_dispatch_would_misuse(tmp_path, mutate, match):
    """Point 4: each is one DatabaseError naming the record and field (no OverflowError)."""
    tdb = db.TuningDB(tmp_path / "t.sqlite")
    assert tdb.import_(_shipped_doc()).added  # the unmutated record is valid
    with pytest.raises(DatabaseError) as info:
        db.TuningDB(tmp_path / "u.sqlite").import_(mutate(_shipped_doc()))
    assert match in str(info.value), str(info.value)


def test_import_refuses_a_boolean_version(tmp_path):
    path = tmp_path / "e.json"
    import json

    path.write_text(json.dumps(_shipped_doc() | {"version": True}))
    with pytest.raises(DatabaseError, match="export version True"):
        db.TuningDB(tmp_path / "t.sqlite").import_(path)


def test_ls_escapes_control_characters(tmp_path):
    """Point 4: a record written before these checks (or by hand) prints NUL and RTL as escapes."""
    path = tmp_path / "t.sqlite"
    db.TuningDB(path).set_best(best(symbol="evil\x00\u202ename"))
    result = CliRunner().invoke(cli, ["db", "--db", str(path), "ls"])
    assert result.exit_code == 0
    assert "evil\\x00\\u202ename" in result.output and "\x00" not in result.output


def _without(*names):
    def fn(doc):
        doc["best"][0]["variant"] = {k: v for k, v in doc["best"][0]["variant"].items() if k not in names}
        return doc
    return fn


def _as_trial(doc):
    """The shipped record as a trial of the current source instead of a winner."""
    record = doc["best"].pop()
    doc["trials"] = [{k: v for k, v in record.items() if k != "updated"} | {"outcome": "ok", "created": 1.0}]
    return doc


def test_a_record_of_the_current_source_names_every_tunable(tmp_path):
    """Point 4: a partial variant of the current source would run the spec's defaults for the rest,
    labelled 'user', ahead of the shipped exact record; it is refused naming the key and its values."""
    record = _shipped_doc()["best"][0]
    first, *rest = list(record["variant"])
    with pytest.raises(DatabaseError) as info:
        db.TuningDB(tmp_path / "t.sqlite").import_(_without(first)(_shipped_doc()))
    message = str(info.value)
    assert f"best[0].variant.{first}: missing; a record of {record['spec']}'s current source" in message, message
    assert "is one of [" in message and "\n" not in message
    with pytest.raises(DatabaseError, match=rf"best\[0\]\.variant\.{rest[0]}: missing.*also missing: "):
        db.TuningDB(tmp_path / "t.sqlite").import_(_without(*rest)(_shipped_doc()))
    with pytest.raises(DatabaseError, match=rf"trials\[0\]\.variant\.{first}: missing"):
        db.TuningDB(tmp_path / "t.sqlite").import_(_as_trial(_without(first)(_shipped_doc())))
    assert not (tmp_path / "t.sqlite").exists()  # nothing written


def test_a_partial_record_never_beats_the_shipped_exact_record(tmp_path, monkeypatch):
    """Point 4 end to end: after `db import` of a partial variant, dispatch's first candidate for the
    record's key is still the shipped exact record (the import is refused with one line)."""
    import json

    shipped = db.shipped_records()[0]
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(_without(next(iter(shipped.variant)))(_shipped_doc())))
    result = CliRunner().invoke(cli, ["db", "--db", str(tmp_path / "t.sqlite"), "import", str(path)])
    assert result.exit_code == 1 and "missing; a record of" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    first = db.candidates(shipped.key, distance, db.TuningDB(tmp_path / "t.sqlite"))[0]
    assert first.origin.startswith("shipped") and first.symbol == shipped.symbol


def test_the_symbol_of_a_current_record_is_always_checked(tmp_path):
    """Point 4: the symbol is the kernel of the (complete) variant, for winners and trials alike."""
    other = "mla_prefill_sm80_causal_m64_n32_w4_s2_swpad_qr0"
    with pytest.raises(DatabaseError, match=r"trials\[0\]\.symbol: .* is not the kernel"):
        db.TuningDB(tmp_path / "t.sqlite").import_(_as_trial(_set("symbol", other)(_shipped_doc())))
    doc = _without("stages")(_shipped_doc())
    doc["best"][0]["symbol"] = "mla_prefill_sm80_not_a_kernel"
    with pytest.raises(DatabaseError, match=r"best\[0\]\.variant\.stages: missing"):
        db.TuningDB(tmp_path / "t.sqlite").import_(doc)


def test_a_record_of_another_source_keeps_todays_rule(tmp_path):
    """Records of an older source (dispatch never uses them) are checked by name and value, a
    partial variant allowed; an unknown tunable or value is still refused."""
    doc = _without("stages")(_shipped_doc())
    doc["best"][0]["source_hash"] = "0123456789abcdef"
    tdb = db.TuningDB(tmp_path / "t.sqlite")
    assert tdb.import_(doc).added
    current = db.shipped_records()[0].key
    assert all(b.origin.startswith("shipped") for b in db.candidates(current, distance, tdb))
    doc["best"][0]["variant"]["bogus"] = 1
    with pytest.raises(DatabaseError, match=r"best\[0\]\.variant\.bogus: not a tunable"):
        db.TuningDB(tmp_path / "u.sqlite").import_(doc)
