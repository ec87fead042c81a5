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
