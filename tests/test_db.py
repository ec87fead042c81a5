"""mlagen.db: the tuning database (trials and winners), export/import, concurrent writers, and
the lookup that dispatch uses (user database over shipped records, nearest shape class)."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import sqlite3

import pytest

from mlagen import db, paths
from mlagen import spec as spec_mod
from mlagen.errors import DatabaseError
from mlagen.families.mla_prefill.problem import ProblemKey

KEY = db.RecordKey(family="mla_prefill", spec="mla_prefill_sm90", problem="causal/h128/q8192/k8192", dtypes="bf16",
                   device="NVIDIA H100 80GB HBM3", sm_count=132, driver="13.0", compiler="nvrtc 13.0",
                   source_hash="0123456789abcdef")


N_VALUES = (128, 112, 96, 80, 64, 144, 160, 176)  # the sm90 spec's block_n values


def key(**changes) -> db.RecordKey:
    return dataclasses.replace(KEY, **changes)


def trial(i=0, outcome="ok", run_id="run1", **changes) -> db.Trial:
    return db.Trial(key=key(**changes), variant={"block_n": N_VALUES[i % 8], "mask": "causal"}, symbol=f"sym_{i}",
                    outcome=outcome, time_ms=1.0 + i if outcome == "ok" else None, tflops=500.0 - i,
                    max_error=1e-3, registers=168, spills=0, detail="" if outcome == "ok" else "why", run_id=run_id,
                    created=1000.0 + i)


def best(symbol="win", time_ms=1.0, updated=2000.0, **changes) -> db.Best:
    return db.Best(key=key(**changes), variant={"block_n": 128}, symbol=symbol, time_ms=time_ms, tflops=600.0,
                   run_id="run1", updated=updated)


def distance(a: str, b: str) -> float:
    return ProblemKey.parse(a).distance(ProblemKey.parse(b))


@pytest.fixture
def tdb(tmp_path):
    return db.TuningDB(tmp_path / "tuning.sqlite")


@pytest.fixture
def no_shipped(monkeypatch, tmp_path):
    """An empty shipped-records directory (the package may ship some)."""
    empty = tmp_path / "shipped"
    empty.mkdir()
    monkeypatch.setattr(paths, "tuned_dir", lambda: empty)
    db.shipped_records.cache_clear()
    yield empty
    db.shipped_records.cache_clear()


# --- trials and winners ---------------------------------------------------------------------


def test_trials_round_trip(tdb):
    trials = [trial(0), trial(1, outcome="compile_error"), trial(2, outcome="hang", run_id="run2")]
    tdb.add_trials(trials[:2])
    tdb.add_trial(trials[2])
    assert tdb.trials() == trials
    assert tdb.trials(run_id="run2") == [trials[2]]
    assert tdb.trials(outcome="compile_error") == [trials[1]]
    assert tdb.trials(spec="other") == []


def test_every_outcome_is_storable(tdb):
    tdb.add_trials([trial(i, outcome=o) for i, o in enumerate(db.OUTCOMES)])
    assert [t.outcome for t in tdb.trials()] == list(db.OUTCOMES)


def test_unknown_outcome_writes_nothing(tdb):
    with pytest.raises(DatabaseError, match="outcome 'slow' is not one of"):
        tdb.add_trials([trial(0), trial(1, outcome="slow")])
    assert tdb.trials() == []


def test_filters_are_checked(tdb):
    with pytest.raises(DatabaseError, match="cannot filter on 'symbol'"):
        tdb.trials(symbol="x")


def test_bests_round_trip_and_replace(tdb):
    b = best()
    tdb.set_best(b)
    assert tdb.bests() == [b]
    newer = best(symbol="newer", time_ms=0.5, updated=3000.0)
    tdb.set_best(newer)
    assert tdb.bests() == [newer]  # one winner per key
    other = best(symbol="other", problem="none/h16/q4096/k4096")
    tdb.set_best(other)
    assert len(tdb.bests()) == 2
    assert tdb.bests(problem="none/h16/q4096/k4096") == [other]
    assert all(b.origin == "user" for b in tdb.bests())


def test_runs(tdb):
    tdb.add_trials([trial(0), trial(1, outcome="crash"), trial(2, run_id="run2")])
    runs = {r["run_id"]: r for r in tdb.runs()}
    assert (runs["run1"]["trials"], runs["run1"]["ok"]) == (2, 1)
    assert (runs["run2"]["trials"], runs["run2"]["ok"]) == (1, 1)


def test_default_location_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("MLAGEN_TUNING_DB", str(tmp_path / "env.sqlite"))
    d = db.TuningDB()
    d.add_trial(trial())
    assert d.path == tmp_path / "env.sqlite" and d.path.exists()


# --- export / import ------------------------------------------------------------------------


def test_export_import_is_identical(tdb, tmp_path):
    tdb.add_trials([trial(0), trial(1, outcome="wrong_result"), trial(2, run_id="run2")])
    tdb.set_best(best())
    tdb.set_best(best(symbol="b2", problem="none/h16/q4096/k4096"))
    path = tmp_path / "export.json"
    doc = tdb.export(path)
    assert json.loads(path.read_text()) == doc
    assert doc["format"] == "mlagen-tuning" and doc["version"] == db.SCHEMA_VERSION
    fresh = db.TuningDB(tmp_path / "fresh.sqlite")
    report = fresh.import_(path)
    assert (report.trials_added, report.trials_skipped, len(report.added), report.replaced, report.kept) == (
        3, 0, 2, [], [])
    assert fresh.trials() == tdb.trials()
    assert fresh.bests() == tdb.bests()
    assert fresh.export() == doc


def test_export_best_only(tdb):
    tdb.add_trials([trial(0)])
    tdb.set_best(best())
    doc = tdb.export(best_only=True)
    assert doc["trials"] == [] and len(doc["best"]) == 1


def _doc(bests=(), trials=()):
    return {"format": "mlagen-tuning", "version": db.SCHEMA_VERSION,
            "best": [db._best_to_json(b) for b in bests], "trials": [db._trial_to_json(t) for t in trials]}


def test_import_merges(tdb):
    tdb.add_trials([trial(0)])
    tdb.set_best(best(symbol="old", time_ms=2.0))
    report = tdb.import_(_doc([best(symbol="new", time_ms=1.5)], [trial(5)]))
    assert [t.symbol for t in tdb.trials()] == ["sym_0", "sym_5"]
    assert [b.symbol for b in tdb.bests()] == ["new"]  # faster: replaces
    assert [(old, ms, new.symbol) for old, ms, new in report.replaced] == [("old", 2.0, "new")]


def test_import_never_replaces_a_faster_winner(tdb):
    # The reported case: a 99 ms record must not replace the 4.1 ms winner of the same key.
    tdb.set_best(best(symbol="d1_winner", time_ms=4.1))
    report = tdb.import_(_doc([best(symbol="slow", time_ms=99.0), best(symbol="other", problem="none/h16/q1/k1")]))
    assert {b.key.problem: b.symbol for b in tdb.bests()} == {KEY.problem: "d1_winner", "none/h16/q1/k1": "other"}
    assert [(old, ms, new.symbol) for old, ms, new in report.kept] == [("d1_winner", 4.1, "slow")]
    assert [b.symbol for b in report.added] == ["other"] and report.replaced == []
    assert "kept d1_winner (4.100 ms), rejected slow (99.000 ms)" in "\n".join(report.lines())
    # An equal time keeps the database's; --replace takes the import's.
    assert tdb.import_(_doc([best(symbol="same", time_ms=4.1)])).kept
    assert len(tdb.import_(_doc([best(symbol="slow", time_ms=99.0)]), replace=True).replaced) == 1
    assert {b.symbol for b in tdb.bests()} == {"slow", "other"}


def test_reimport_adds_nothing(tdb, tmp_path):
    src = db.TuningDB(tmp_path / "src.sqlite")
    src.add_trials([trial(i) for i in range(20)])
    src.set_best(best())
    path = tmp_path / "export.json"
    src.export(path)
    first = tdb.import_(path)
    assert (first.trials_added, len(first.added)) == (20, 1)
    for _ in range(3):
        again = tdb.import_(path)
        assert (again.trials_added, again.trials_skipped, len(again.added), len(again.replaced)) == (0, 20, 0, 0)
    assert tdb.trials() == src.trials() and tdb.bests() == src.bests()
    doubled = json.loads(path.read_text())
    doubled["trials"] += doubled["trials"]  # duplicates inside one file count once
    assert db.TuningDB(tmp_path / "d.sqlite").import_(doubled).trials_added == 20


def test_export_refuses_to_overwrite(tdb, tmp_path):
    path = tmp_path / "h100.json"
    path.write_text("precious")
    with pytest.raises(DatabaseError, match="already exists; export refuses to overwrite it"):
        tdb.export(path)
    assert path.read_text() == "precious"
    tdb.export(path, overwrite=True)
    assert json.loads(path.read_text())["format"] == "mlagen-tuning"


def _good_doc():
    return {"format": "mlagen-tuning", "version": db.SCHEMA_VERSION,
            "best": [db._best_to_json(best())], "trials": [db._trial_to_json(trial(0))]}


def _with(path, value):
    def fn(doc):
        target = doc
        for p in path[:-1]:
            target = target[p]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return doc
    return fn


BAD_DOCS = [
    ("not json", None, "not JSON"),
    ("wrong format", _with(["format"], "other"), 'expected "format": "mlagen-tuning"'),
    ("wrong version", _with(["version"], 99), "export version 99, this mlagen reads 1 to 2"),
    ("best not a list", _with(["best"], 5), "best: expected a list, got int"),
    ("trial not an object", _with(["trials"], [1]), "trials[0]: expected an object"),
    ("missing key column", _with(["trials", 0, "device"], KeyError), "trials[0]: missing 'device'"),
    ("wrong type", _with(["best", 0, "sm_count"], "132"), "best[0].sm_count: expected int, got str"),
    ("null time of a winner", _with(["best", 0, "time_ms"], None), "best[0].time_ms: expected int or float, got NoneType"),
    ("null key column", _with(["trials", 0, "family"], None), "trials[0].family: expected str, got NoneType"),
    ("bad outcome", _with(["trials", 0, "outcome"], "fast"), "trials[0].outcome: 'fast' is not one of"),
    ("text time", _with(["trials", 0, "time_ms"], "1.5"), "trials[0].time_ms: expected int or float or null"),
    ("text created", _with(["trials", 0, "created"], "yesterday"), "trials[0].created: expected int or float"),
    ("negative time", _with(["best", 0, "time_ms"], -4.1), "best[0].time_ms: -4.1 must be positive"),
    ("zero time", _with(["trials", 0, "time_ms"], 0), "trials[0].time_ms: 0 must be positive"),
    ("infinite tflops", _with(["best", 0, "tflops"], float("inf")), "best[0].tflops: inf must be positive"),
    ("negative SM count", _with(["best", 0, "sm_count"], -1), "best[0].sm_count: -1 must be positive"),
    ("bool SM count", _with(["best", 0, "sm_count"], True), "best[0].sm_count: expected int, got bool"),
    ("negative spills", _with(["trials", 0, "spills"], -8), "trials[0].spills: -8 must be non-negative"),
    ("ok without time", _with(["trials", 0, "time_ms"], None), "trials[0].time_ms: an 'ok' trial needs its time"),
    ("unknown spec", _with(["best", 0, "spec"], "mla_prefill_sm70"), "best[0].spec: 'mla_prefill_sm70' is not a known"),
    ("wrong family", _with(["best", 0, "family"], "gemm"), "best[0].family: 'gemm', but mla_prefill_sm90 is of family"),
    ("unknown tunable", _with(["best", 0, "variant"], {"block_q": 64}), "best[0].variant.block_q: not a tunable of"),
    ("unknown value", _with(["trials", 0, "variant"], {"block_n": 100}), "trials[0].variant.block_n: 100 is not one of"),
    ("bool for an int", _with(["best", 0, "variant"], {"block_n": True}), "best[0].variant.block_n: True is not one of"),
    ("empty device", _with(["best", 0, "device"], " "), "best[0].device: must not be empty"),
]


@pytest.mark.parametrize("mutate, match", [c[1:] for c in BAD_DOCS], ids=[c[0] for c in BAD_DOCS])
def test_import_of_a_malformed_file_writes_nothing(tdb, tmp_path, mutate, match):
    tdb.add_trials([trial(7)])
    tdb.set_best(best(symbol="keep", problem="none/h1/q1/k1"))
    before = (tdb.trials(), tdb.bests())
    doc = _good_doc()
    doc["trials"].append(db._trial_to_json(trial(1)))  # valid records before the bad one are not written either
    path = tmp_path / "bad.json"
    path.write_text("{ not json" if mutate is None else json.dumps(mutate(doc)))
    with pytest.raises(DatabaseError) as info:
        tdb.import_(path)
    assert str(info.value).startswith(f"{path}: ") and match in str(info.value), str(info.value)
    assert (tdb.trials(), tdb.bests()) == before


def test_import_of_a_missing_file(tdb, tmp_path):
    with pytest.raises(DatabaseError, match="no such file"):
        tdb.import_(tmp_path / "missing.json")


# --- the file itself ------------------------------------------------------------------------


def test_schema_version_mismatch(tmp_path):
    path = tmp_path / "old.sqlite"
    db.TuningDB(path).add_trial(trial())
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    with pytest.raises(DatabaseError, match="schema version 3, this mlagen reads 2; export it with the mlagen"):
        db.TuningDB(path).trials()


_V1_TABLES = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema', '1');
CREATE TABLE trials (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, created REAL NOT NULL,
    family TEXT NOT NULL, spec TEXT NOT NULL, problem TEXT NOT NULL, dtypes TEXT NOT NULL,
    device TEXT NOT NULL, sm_count INTEGER NOT NULL, driver TEXT NOT NULL, nvrtc TEXT NOT NULL,
    source_hash TEXT NOT NULL, variant TEXT NOT NULL, symbol TEXT NOT NULL, outcome TEXT NOT NULL,
    time_ms REAL, tflops REAL, max_error REAL, registers INTEGER, spills INTEGER, detail TEXT NOT NULL DEFAULT '');
CREATE INDEX trials_key ON trials (family, spec, problem, dtypes, device, sm_count, driver, nvrtc, source_hash);
CREATE TABLE best (family TEXT NOT NULL, spec TEXT NOT NULL, problem TEXT NOT NULL, dtypes TEXT NOT NULL,
    device TEXT NOT NULL, sm_count INTEGER NOT NULL, driver TEXT NOT NULL, nvrtc TEXT NOT NULL,
    source_hash TEXT NOT NULL, variant TEXT NOT NULL, symbol TEXT NOT NULL, time_ms REAL NOT NULL, tflops REAL,
    run_id TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (family, spec, problem, dtypes, device, sm_count, driver, nvrtc, source_hash));
INSERT INTO best VALUES ('mla_prefill', 'mla_prefill_sm80', 'causal/h128/q8192/k8192', 'bf16', 'NVIDIA H100 80GB HBM3',
    132, '13.0', '13.0', 'abc', '{"block_n": 64}', 'sym', 1.5, 300.0, 'run', 1.0);
INSERT INTO trials (run_id, created, family, spec, problem, dtypes, device, sm_count, driver, nvrtc, source_hash,
    variant, symbol, outcome) VALUES ('run', 1.0, 'mla_prefill', 'mla_prefill_sm80', 'causal/h128/q8192/k8192',
    'bf16', 'NVIDIA H100 80GB HBM3', 132, '13.0', '13.0', 'abc', '{}', 'sym', 'ok');
"""


def test_version_1_database_is_migrated(tmp_path):
    path = tmp_path / "v1.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(_V1_TABLES)
    conn.close()
    tdb = db.TuningDB(path)
    (b,) = tdb.bests()
    (t,) = tdb.trials()
    assert b.key.compiler == t.key.compiler == "nvrtc 13.0" and b.time_ms == 1.5
    conn = sqlite3.connect(path)
    # Reads never change the file; the first write migrates it.
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == "1"
    tdb.add_trial(trial())  # the migrated tables take new rows
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == str(db.SCHEMA_VERSION)
    conn.close()
    assert len(db.TuningDB(path).trials()) == 2


def test_version_1_export_is_upgraded(tmp_path):
    doc = {"format": "mlagen-tuning", "version": 1,
           "best": [{**{k: v for k, v in db._best_to_json(best()).items() if k != "compiler"}, "nvrtc": "12.8"}],
           "trials": []}
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(doc))
    tdb = db.TuningDB(tmp_path / "t.sqlite")
    report = tdb.import_(path)
    assert len(report.added) == 1 and report.added[0].key.compiler == "nvrtc 12.8"
    assert tdb.bests()[0].key.compiler == "nvrtc 12.8"


def test_not_a_database(tmp_path):
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DatabaseError, match="junk.sqlite"):
        db.TuningDB(path).trials()


def _writer(path: str, worker: int, n: int, barrier) -> None:
    d = db.TuningDB(path)
    barrier.wait()  # all start together, on a database none of them has created yet
    for i in range(n):
        d.add_trial(trial(i, run_id=f"w{worker}"))


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_writer, args=(str(path), w, 50, barrier)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    trials = db.TuningDB(path).trials()
    assert len(trials) == 200
    for w in range(4):
        assert sorted(t.symbol for t in trials if t.run_id == f"w{w}") == sorted(f"sym_{i}" for i in range(50))


# --- lookup ---------------------------------------------------------------------------------


def test_lookup_prefers_the_exact_problem(tdb, no_shipped):
    tdb.set_best(best(symbol="near", problem="causal/h128/q4096/k4096", updated=9000.0))
    tdb.set_best(best(symbol="exact"))
    tdb.set_best(best(symbol="far", problem="causal/h16/q1024/k1024"))
    assert db.lookup(KEY, distance, tdb).symbol == "exact"


def test_lookup_uses_the_nearest_problem(tdb, no_shipped):
    tdb.set_best(best(symbol="far", problem="causal/h16/q1024/k1024"))
    tdb.set_best(best(symbol="near", problem="causal/h128/q4096/k8192"))
    tdb.set_best(best(symbol="other mask", problem="none/h128/q8192/k8192"))
    assert db.lookup(KEY, distance, tdb).symbol == "near"


def test_lookup_never_crosses_masks(tdb, no_shipped):
    tdb.set_best(best(symbol="other mask", problem="none/h128/q8192/k8192"))
    assert db.lookup(KEY, distance, tdb) is None


@pytest.mark.parametrize("field, value", [("source_hash", "fedcba9876543210"), ("device", "NVIDIA A100"),
                                          ("sm_count", 114), ("spec", "mla_prefill_sm80"), ("dtypes", "fp16")])
def test_lookup_never_uses_records_of_another_kernel_or_device(tdb, no_shipped, field, value):
    tdb.set_best(best(symbol="mismatch", **{field: value}))
    assert db.lookup(KEY, distance, tdb) is None
    tdb.set_best(best(symbol="match", problem="causal/h1/q1/k1"))  # far, but usable
    assert db.lookup(KEY, distance, tdb).symbol == "match"


def test_toolchain_mismatch_only_breaks_ties(tdb, no_shipped):
    tdb.set_best(best(symbol="old toolchain", driver="12.4", compiler="nvrtc 12.4"))
    tdb.set_best(best(symbol="near same toolchain", problem="causal/h128/q4096/k8192"))
    assert db.lookup(KEY, distance, tdb).symbol == "old toolchain"  # an exact problem beats a toolchain match
    tdb.set_best(best(symbol="exact same toolchain", problem="causal/h128/q8192/k8192", driver=KEY.driver,
                      compiler=KEY.compiler, updated=1.0))
    assert db.lookup(KEY, distance, tdb).symbol == "exact same toolchain"  # the tie goes to the toolchain match


def test_lookup_breaks_remaining_ties_by_recency(tdb, no_shipped):
    tdb.set_best(best(symbol="older", problem="causal/h128/q4096/k8192", updated=1.0))
    tdb.set_best(best(symbol="newer", problem="causal/h128/q8192/k4096", updated=2.0))
    assert db.lookup(KEY, distance, tdb).symbol == "newer"


def _ship(directory, *bests):
    doc = {"format": "mlagen-tuning", "version": db.SCHEMA_VERSION, "best": [db._best_to_json(b) for b in bests],
           "trials": []}
    (directory / "h100.json").write_text(json.dumps(doc))
    db.shipped_records.cache_clear()


def test_shipped_records_are_used_without_a_user_record(tdb, no_shipped):
    _ship(no_shipped, best(symbol="shipped"))
    found = db.lookup(KEY, distance, tdb)
    assert found.symbol == "shipped" and found.origin == "shipped:h100.json"
    assert db.lookup(KEY, distance, tdb, include_shipped=False) is None
    assert db.lookup(KEY, distance, None).symbol == "shipped"


def test_an_exact_shipped_record_beats_a_near_user_record(tdb, no_shipped):
    # The issue-8 case: after tuning only D2, a D4 call must keep the shipped exact D4 record.
    _ship(no_shipped, best(symbol="shipped exact"))
    tdb.set_best(best(symbol="user near", problem="causal/h128/q4096/k8192"))
    found = db.lookup(KEY, distance, tdb)
    assert (found.symbol, found.origin) == ("shipped exact", "shipped:h100.json")


def test_the_user_database_wins_ties(tdb, no_shipped):
    _ship(no_shipped, best(symbol="shipped exact", updated=5.0))
    tdb.set_best(best(symbol="user exact", updated=1.0))
    found = db.lookup(KEY, distance, tdb)
    assert (found.symbol, found.origin) == ("user exact", "user")
    # and a near user record beats a farther shipped one
    _ship(no_shipped, best(symbol="shipped far", problem="causal/h16/q8192/k8192"))
    tdb2_key = db.RecordKey(**{**KEY.as_dict(), "problem": "causal/h128/q4096/k4096"})
    assert db.lookup(tdb2_key, distance, tdb).symbol == "user exact"


def _same_arch(record_key):
    return record_key.device in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H20")


H200 = db.RecordKey(**{**KEY.as_dict(), "device": "NVIDIA H200", "sm_count": 132})


def test_records_of_another_device_of_the_same_arch_come_before_the_default(tdb, no_shipped):
    _ship(no_shipped, best(symbol="h100 shipped", problem="causal/h128/q4096/k8192"))
    assert db.lookup(H200, distance, tdb) is None  # without an architecture match: unusable
    found = db.lookup(H200, distance, tdb, same_arch=_same_arch)
    assert found.symbol == "h100 shipped"
    assert found.origin == "shipped:h100.json (other device: NVIDIA H100 80GB HBM3)"
    # the H100 record is one doubling away (q 4096) and counts one more as another device's: a record
    # of the device itself three doublings away does not beat it
    tdb.set_best(best(symbol="h200 own far", device="NVIDIA H200", problem="causal/h16/q8192/k8192"))
    assert db.lookup(H200, distance, tdb, same_arch=_same_arch).symbol == "h100 shipped"
    # one doubling away it does
    tdb.set_best(best(symbol="h200 own near", device="NVIDIA H200", problem="causal/h64/q8192/k8192"))
    found = db.lookup(H200, distance, tdb, same_arch=_same_arch)
    assert (found.symbol, found.origin) == ("h200 own near", "user")
    ranked = db.candidates(H200, distance, tdb, same_arch=_same_arch)
    assert [b.symbol for b in ranked] == ["h200 own near", "h100 shipped", "h200 own far"]


def test_another_device_with_the_same_sm_count_comes_first(tdb, no_shipped):
    tdb.set_best(best(symbol="h20 exact", device="NVIDIA H20", sm_count=78))
    tdb.set_best(best(symbol="h100 far", problem="causal/h16/q8192/k8192"))
    found = db.lookup(H200, distance, tdb, same_arch=_same_arch)
    assert (found.symbol, found.origin) == ("h100 far", "user (other device: NVIDIA H100 80GB HBM3)")
    tdb.set_best(best(symbol="a100", device="NVIDIA A100-SXM4-80GB", sm_count=132))
    assert db.lookup(H200, distance, tdb, same_arch=_same_arch).symbol == "h100 far"


def test_shipped_records_filter_like_user_records(tdb, no_shipped):
    _ship(no_shipped, best(symbol="other hash", source_hash="ffff"), best(symbol="usable", problem="causal/h64/q8192/k8192"))
    assert db.lookup(KEY, distance, tdb).symbol == "usable"


def test_malformed_shipped_file_is_an_error(no_shipped):
    (no_shipped / "bad.json").write_text('{"format": "mlagen-tuning", "version": 1, "best": [{"spec": 1}]}')
    db.shipped_records.cache_clear()
    with pytest.raises(DatabaseError, match="best\\[0\\]: missing 'family'"):
        db.shipped_records()


def test_unreadable_user_database_falls_back_to_shipped(tmp_path, no_shipped):
    _ship(no_shipped, best(symbol="shipped"))
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not sqlite" * 200)
    assert db.lookup(KEY, distance, db.TuningDB(junk)).symbol == "shipped"


def test_packaged_shipped_records_are_valid():
    db.shipped_records.cache_clear()
    from mlagen import families

    families_seen = set()
    for b in db.shipped_records():
        assert b.origin.startswith("shipped:") and b.time_ms > 0
        family = families.get(spec_mod.load(b.key.spec).family)
        assert family.problem_distance(b.key.problem, b.key.problem) == 0   # the family reads its key
        families_seen.add(spec_mod.load(b.key.spec).family)
    # (Records whose source hash no longer matches their spec are dropped on load: a stale one
    # would be missing here.)
    assert families_seen == {"mla_prefill", "mla_sparse_prefill"}


def test_source_hash():
    s80, s90 = spec_mod.load("mla_prefill_sm80"), spec_mod.load("mla_prefill_sm90")
    h = db.source_hash(s80)
    assert len(h) == 16 and h == db.source_hash(spec_mod.load("mla_prefill_sm80"))
    assert h != db.source_hash(s90)


def test_source_hash_follows_the_template(tmp_path):
    import yaml

    template = (paths.templates_dir() / "mla_prefill_sm80.cu.j2").read_text()
    d = yaml.safe_load((paths.specs_dir() / "mla_prefill_sm80.yaml").read_text())
    d["name"], d["template"] = "local", "local.cu.j2"
    spec_path = tmp_path / "local.yaml"
    spec_path.write_text(yaml.safe_dump(d))
    (tmp_path / "local.cu.j2").write_text(template)
    h1 = db.source_hash(spec_mod.load(spec_path))
    (tmp_path / "local.cu.j2").write_text(template + "// changed\n")
    assert db.source_hash(spec_mod.load(spec_path)) != h1


def test_record_with_a_malformed_problem_is_skipped(tdb, no_shipped):
    tdb.set_best(best(symbol="garbage", problem="causal/h0/q8192/k8192"))
    tdb.set_best(best(symbol="typo", problem="causal/128/8192/8192"))
    assert db.lookup(KEY, distance, tdb) is None  # not an exception: dispatch falls back to the default
    tdb.set_best(best(symbol="usable", problem="causal/h64/q8192/k8192"))
    assert db.lookup(KEY, distance, tdb).symbol == "usable"


def test_candidates_rank_every_usable_record(tdb, no_shipped):
    _ship(no_shipped, best(symbol="shipped exact"), best(symbol="shipped far", problem="causal/h16/q8192/k8192"))
    tdb.set_best(best(symbol="user exact"))
    tdb.set_best(best(symbol="user near", problem="causal/h128/q4096/k8192"))
    tdb.set_best(best(symbol="h20", device="NVIDIA H20", sm_count=78))
    ranked = db.candidates(KEY, distance, tdb, same_arch=_same_arch)
    assert [b.symbol for b in ranked] == ["user exact", "shipped exact", "user near", "shipped far", "h20"]
    assert ranked[-1].origin == "user (other device: NVIDIA H20)"
    assert db.lookup(KEY, distance, tdb).symbol == "user exact"


def test_source_hash_counts_a_header_the_template_names_by_expression():
    # The sparse template includes "sparse_kv_{{ 'fp8' if ... else 'bf16' }}.cuh": both operand
    # headers are part of what its records were built from (before, neither was, and a change to
    # the FP8 producer left the FP8 record current).
    seen = set()
    db._included_headers('#include "mlagen/sm90/sparse_kv_{{ \'fp8\' if kv.quantized else \'bf16\' }}.cuh"\n', seen)
    names = {p.name for p in seen}
    assert {"sparse_kv_fp8.cuh", "sparse_kv_bf16.cuh", "sparse_prefill.cuh"} <= names
    template = spec_mod.template_path(spec_mod.load("mla_sparse_prefill_sm90").template,
                                      spec_mod.load("mla_sparse_prefill_sm90").path).read_text()
    closure = set()
    db._included_headers(template, closure)
    assert "sparse_kv_fp8.cuh" in {p.name for p in closure}
