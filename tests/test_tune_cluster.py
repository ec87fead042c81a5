"""The Dask cluster runner on a two-process LocalCluster: compiles on the workers match a local
build, a workload's tune through the cluster (measurements simulated on its GPU workers) makes
the same trials and winner as the same tune run locally, and a worker that dies fails its
trial without losing one."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest

distributed = pytest.importorskip("distributed", reason="Dask is not installed (pip install 'mlagen[cluster]')")

import cloudpickle  # noqa: E402

from mlagen import arch, db, dispatch  # noqa: E402
from mlagen import spec as spec_mod  # noqa: E402
from mlagen import variant as variant_mod  # noqa: E402
from mlagen.build import build_many  # noqa: E402
from mlagen.tune import TrialRunner, TuneConfig, shape_classes, tune_class  # noqa: E402
from mlagen.tune import cluster  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])   # the simulated GPU runs on the workers

S90 = spec_mod.load("mla_prefill_sm90")
SM90A = arch.target("sm_90a")
# Two tunables free (8 variants): the compiles stay few on a two-core machine.
FREE = ("block_n", "stages")
FIXED = {k: v for k, v in variant_mod.make(S90, {"mask": "causal"}).values if k not in FREE}
FAKE = {"device": "Fake GPU", "sm_count": 132, "driver": "13.0", "target": "sm_90a"}


def fake_probe() -> dict:
    return dict(FAKE)


def fake_measure(args, values, iters, warmup, verify) -> dict:
    """The tuner's simulation: a time that is a fixed function of the variant."""
    ms = 1.0 + zlib.crc32(repr(sorted(values.items())).encode()) % 1000 / 1000
    return {"outcome": "ok", "time_ms": ms, "tflops": 100 / ms, "max_error": 0.0}


def dying_measure(marker: str):
    """The simulation, but the first share of the first variant with block_n 128 kills its worker
    process (one of the two: the marker is created by exactly one)."""
    def measure(args, values, iters, warmup, verify) -> dict:
        if values.get("block_n") == 128:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                os._exit(1)
        return fake_measure(args, values, iters, warmup, verify)
    return measure


class LocalSim:
    def run(self, values, iters, warmup=None, verify=None):
        return fake_measure(None, values, iters, warmup, verify)


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, resources={"GPU": 1},
                                  dashboard_address=None, silence_logs=40) as lc, distributed.Client(lc) as c:
        yield c


def _config(tmp_path, name, strategy="exhaustive"):
    return TuneConfig(spec=S90.path, shapes=("D1",), strategy=strategy, max_trials=8, fixed=FIXED,
                      db_path=str(tmp_path / name), target="sm_90a", iters=4, finalists=2, final_rounds=1)


def test_importing_mlagen_tune_does_not_import_dask():
    code = "import sys, mlagen.tune, mlagen.cli; print('distributed' in sys.modules or 'dask' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_compiles_on_the_workers_match_a_local_build(client):
    variants = list(variant_mod.enumerate_space(S90, {**FIXED, "mask": "causal"}))[:4]
    remote = cluster.compile_all(client, variants, "sm_90a")
    local = build_many(variants, ["sm_90a"], jobs=1)
    assert [r.status for r in remote] == [r.status for r in local]
    assert any(r.status == "ok" for r in remote)
    for r, l in zip(remote, local):
        assert (r.binary.data if r.binary else None) == (l.binary.data if l.binary else None), r.variant.symbol


@pytest.mark.parametrize("strategy", ["exhaustive", "coordinate"])   # coordinate: guesses compiled ahead
def test_a_cluster_tune_makes_the_trials_and_winner_of_a_local_tune(tmp_path, client, strategy):
    lines = []
    results = cluster.tune(_config(tmp_path, "c.sqlite", strategy), client, progress=lines.append, probe_fn=fake_probe,
                           measure_fn=fake_measure)
    assert len(results) == 1 and results[0].shape.startswith("Fake GPU: ")
    assert any(line.startswith("[Fake GPU] ") for line in lines)

    config = _config(tmp_path, "l.sqlite", strategy)
    c = shape_classes(config.shapes, cluster.family_of(S90))[0]
    key = dispatch.record_key(S90, c.problem, device=FAKE["device"], sm_count=FAKE["sm_count"],
                              driver=FAKE["driver"], target=SM90A)

    def build(variants, on_built):
        for r in build_many(variants, ["sm_90a"], jobs=1):
            on_built(r)

    local = tune_class(S90, c, SM90A, config, db.TuningDB(config.db_path),
                       TrialRunner([LocalSim(), LocalSim()], build, config.iters, warmup=config.warmup), key,
                       progress=lambda line: None)
    remote = results[0]
    assert [(t.variant.symbol, t.outcome, t.time_ms) for t in remote.trials] == \
        [(t.variant.symbol, t.outcome, t.time_ms) for t in local.trials]
    assert remote.best.variant == local.best.variant
    recorded = db.TuningDB(str(tmp_path / "c.sqlite")).trials(**key.as_dict())
    assert len(recorded) == len(remote.trials)
    assert "winner" in cluster.summary(results) and remote.best.variant.symbol in cluster.summary(results)


def test_a_worker_that_dies_fails_its_trial_and_loses_none(tmp_path, client):
    results = cluster.tune(_config(tmp_path, "d.sqlite"), client, progress=lambda line: None,
                           probe_fn=fake_probe, measure_fn=dying_measure(str(tmp_path / "died")))
    trials = results[0].trials
    died = [t for t in trials if t.outcome == "crash"]
    assert len(died) == 1 and "dask worker" in died[0].detail and died[0].variant["block_n"] == 128
    # Every other variant measured as without the death (some do not fit: pruned), the later ones
    # on the worker its nanny restarted.
    assert len(trials) == 8 and [t.outcome for t in trials if t is not died[0]].count("crash") == 0
    assert sum(t.outcome == "ok" for t in trials) >= 2
    key = dispatch.record_key(S90, shape_classes(("D1",), cluster.family_of(S90))[0].problem, device=FAKE["device"],
                              sm_count=FAKE["sm_count"], driver=FAKE["driver"], target=SM90A)
    assert len(db.TuningDB(str(tmp_path / "d.sqlite")).trials(**key.as_dict())) == len(trials)
    client.wait_for_workers(2, timeout=120)   # the nanny restarted it: the other tests keep two


def test_the_cli_takes_device_kind_only_with_a_scheduler():
    from click.testing import CliRunner

    from mlagen.cli import cli

    out = CliRunner().invoke(cli, ["tune", "mla_prefill_sm90", "--shape", "D1", "--device-kind", "H200"])
    assert out.exit_code != 0 and "--device-kind: only with --scheduler" in out.output
    out = CliRunner().invoke(cli, ["tune", "mla_prefill_sm90", "--shape", "D1", "--devices", "0",
                                    "--scheduler", "tcp://127.0.0.1:1"])
    assert out.exit_code != 0 and "--devices: not with --scheduler" in out.output


# --- the fixed time of a cluster tune (issue 39: 26.7 s against 19.5 s locally on one H200) ------


class _FakeClient:
    def __init__(self, workers):
        self.workers = workers

    def scheduler_info(self, n_workers=-1):
        return {"workers": self.workers}


def test_compile_slots_leave_each_gpu_worker_its_measuring_thread():
    gpu2 = {"nthreads": 2, "resources": {"GPU": 1}}
    gpu1 = {"nthreads": 1, "resources": {"GPU": 1}}
    cpu3 = {"nthreads": 3, "resources": {}}
    assert cluster.compile_slots(_FakeClient({"g": gpu2, "c1": cpu3, "c2": cpu3})) == {"g": 1, "c1": 3, "c2": 3}
    assert cluster.compile_slots(_FakeClient({"g": gpu1, "c": cpu3})) == {"c": 3}
    # Only one-thread GPU workers: they compile too (else nothing would).
    assert cluster.compile_slots(_FakeClient({"g1": gpu1, "g2": gpu1})) == {"g1": 1, "g2": 1}


def _event(what: str) -> None:
    """Appends (event, worker address, monotonic time) to the file $MLAGEN_TEST_EVENTS."""
    import time

    with open(os.environ["MLAGEN_TEST_EVENTS"], "a") as f:
        f.write(f"{what}\t{distributed.get_worker().address}\t{time.monotonic()}\n")


def _events(path) -> list:
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    return sorted(((w, a, float(t)) for w, a, t in rows), key=lambda e: e[2])


def slow_compile(spec, values, target, out_dir):
    """A compile of 0.2 s that compiles nothing, so the worker's threads are what is measured."""
    import time

    _event("compile start")
    time.sleep(0.2)
    _event("compile end")
    return "ok", (), None, None, 0.2


def watched_measure(args, values, iters, warmup, verify) -> dict:
    _event("measure")
    return fake_measure(args, values, iters, warmup, verify)


def watched_warm(args) -> dict:
    _event("warm")
    return {}


@pytest.fixture(scope="module")
def threaded():
    """One GPU worker with two threads and one CPU worker, in this process (the events are shared)."""
    workers = {"gpu": {"cls": distributed.Worker, "options": {"nthreads": 2, "resources": {"GPU": 1},
                                                              "dashboard": False}},
               "cpu": {"cls": distributed.Worker, "options": {"nthreads": 1, "dashboard": False}}}
    scheduler = {"cls": distributed.Scheduler, "options": {"dashboard": False}}
    with distributed.SpecCluster(workers=workers, scheduler=scheduler, silence_logs=40) as sc, \
            distributed.Client(sc) as c:
        c.wait_for_workers(2)
        yield c


def test_a_compile_never_takes_the_measuring_thread_and_the_process_starts_first(tmp_path, threaded, monkeypatch):
    """A GPU worker of two threads runs at most one compile at a time (before: guesses took both,
    and a measurement waited for a compile to end: 0.1 to 1 s each, 16 s of 33 in the CPU
    profile); its measuring process is started (warm) as the class begins, before the first
    measurement, as a local tune starts its workers while the first batch compiles."""
    monkeypatch.setenv("MLAGEN_TEST_EVENTS", str(tmp_path / "events"))
    config = _config(tmp_path, "t.sqlite", "coordinate")
    results = cluster.tune(config, threaded, progress=lambda line: None, probe_fn=fake_probe,
                           measure_fn=watched_measure, compile_fn=slow_compile, warm_fn=watched_warm)
    assert results[0].best is not None
    gpu = next(a for a, w in threaded.scheduler_info(n_workers=-1)["workers"].items() if w["resources"])
    events = _events(tmp_path / "events")
    running, most = 0, 0
    for what, address, _ in events:
        if address == gpu and what.startswith("compile"):
            running += 1 if what == "compile start" else -1
            most = max(most, running)
    assert most == 1, f"{most} compiles at once on the GPU worker's two threads"
    assert any(a != gpu for what, a, _ in events if what == "compile start")
    order = [what for what, address, _ in events if what in ("warm", "measure")]
    assert order[0] == "warm" and order.count("warm") == 1


def test_a_gpu_worker_process_does_not_import_the_dask_workers_main(tmp_path):
    """Spawned from a Dask worker (``python -m distributed.cli.dask_worker``), the measuring
    process imported that module first: 3 to 4 s of its 4 s start on this machine. A __main__
    that marks its import shows it is not imported (the process fails to start: no GPU)."""
    pkg = tmp_path / "slowmain"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "cli.py").write_text(
        "import os, sys\n"
        "if __name__ != '__main__':\n"
        "    open(os.environ['MARK'], 'w').write(__name__)\n"
        "else:\n"
        "    from mlagen.tune.cluster import _process\n"
        "    try:\n"
        "        _process(('mla_prefill_sm90', 'D1', 0, 1, 5.0)).start()\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), root]), "MARK": str(tmp_path / "mark"),
           "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-m", "slowmain.cli"], env=env, capture_output=True, text=True, timeout=120)
    assert "TuningError" in out.stdout, out.stdout + out.stderr
    assert not (tmp_path / "mark").exists(), "the spawned process imported the parent's __main__"
