"""The tuner on the GPU: every outcome recorded, failures never selected, winners used later."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from mlagen import api, bench, db, resources  # noqa: E402
from mlagen.families.mla_prefill.peers import FA3  # noqa: E402
from mlagen.families.mla_prefill.problem import Shape, parse_shape  # noqa: E402
from mlagen.dispatch import dispatcher  # noqa: E402
from mlagen.tune import EXTRA_ROUNDS, TuneConfig, tune  # noqa: E402

FAULTY = Path(__file__).parent / "fixtures" / "faulty_sm80.yaml"
TINY = Shape("T1", (200,), (200,), 4, True)
FIXED_SM80 = {"block_m": 128, "warps": 8, "stages": 2, "swizzle": "pad", "q_in_regs": True}


def test_every_failure_is_a_recorded_outcome(tmp_path):
    path = tmp_path / "tuning.sqlite"
    config = TuneConfig(spec=str(FAULTY), shapes=(TINY,), strategy="exhaustive", fixed={**FIXED_SM80, "block_n": 64},
                        timeout_s=20, iters=3, warmup=1, db_path=str(path))
    (result,) = tune(config, progress=lambda line: None)
    outcomes = {t.variant["fault"]: t.outcome for t in result.trials}
    assert outcomes == {"none": "ok", "trap": "crash", "hang": "hang", "wrong": "wrong_result",
                        "syntax": "compile_error", "huge": "pruned"}
    assert result.best is not None and result.best.variant["fault"] == "none"
    database = db.TuningDB(path)
    stored = {t.variant["fault"]: t.outcome for t in database.trials(run_id=result.run_id)}
    assert stored == outcomes
    (best,) = database.bests()
    assert best.variant["fault"] == "none" and best.key.problem == result.problem


def test_every_failure_is_a_recorded_outcome_on_two_gpus(tmp_path):
    """With two GPUs a trial's checks and timed calls are split between them (each check on one
    GPU, a share of the calls on each): the faulty variants end as on one GPU, and the tune logs
    where each GPU's time went."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    lines = []
    config = TuneConfig(spec=str(FAULTY), shapes=(TINY,), strategy="exhaustive", fixed={**FIXED_SM80, "block_n": 64},
                        timeout_s=20, iters=4, warmup=1, db_path=str(tmp_path / "tuning.sqlite"), devices=(0, 1))
    (result,) = tune(config, progress=lines.append)
    outcomes = {t.variant["fault"]: t.outcome for t in result.trials}
    assert outcomes == {"none": "ok", "trap": "crash", "hang": "hang", "wrong": "wrong_result",
                        "syntax": "compile_error", "huge": "pruned"}
    assert result.best is not None and result.best.variant["fault"] == "none"
    ok = next(t for t in result.trials if t.outcome == "ok")
    assert ok.max_error is not None and ok.max_error < 2e-2   # from the check that ran on either GPU
    workers = [line for line in lines if line.startswith("  GPU worker ")]
    assert len(workers) == 2 and all(" 0 measurements" not in line for line in workers), workers


def test_a_worker_runs_the_checks_it_is_asked_for(tmp_path):
    """The worker protocol on the GPU: each check on request, timing without a check, the
    seconds it spent."""
    from mlagen import spec as spec_mod
    from mlagen import variant as variant_mod
    from mlagen.tune import GpuWorker

    spec = spec_mod.load("mla_prefill_sm80")
    v = variant_mod.make(spec, {**FIXED_SM80, "block_n": 64, "mask": "causal"})
    worker = GpuWorker(spec.path, TINY, 0, 1, 60.0, device=0)
    try:
        worker.start()
        timed = worker.run(dict(v.values), 3, verify=())
        assert timed["outcome"] == "ok" and timed["max_error"] is None and timed["verify_s"] < 1e-3
        shape = worker.run(dict(v.values), 3, verify=("shape",))
        both = worker.run(dict(v.values), 3)          # the check problem now (the shape was checked)
        assert shape["outcome"] == both["outcome"] == "ok"
        assert 0 < shape["max_error"] <= both["max_error"] < 2e-2
        assert all(both[k] > 0 for k in ("load_s", "verify_s", "time_s"))
    finally:
        worker.stop()


def test_tuned_winner_is_used_by_later_calls(tmp_path, monkeypatch):
    # without shipped records in use (one that wins the final stays, and nothing is recorded)
    monkeypatch.setenv("MLAGEN_NO_SHIPPED", "1")
    path = tmp_path / "tuning.sqlite"
    config = TuneConfig(spec="mla_prefill_sm80", shapes=(TINY,), strategy="exhaustive", fixed=FIXED_SM80,
                        timeout_s=60, iters=5, warmup=1, db_path=str(path))
    (result,) = tune(config, progress=lambda line: None)
    assert sum(t.outcome == "ok" for t in result.trials) >= 2
    monkeypatch.setenv("MLAGEN_TUNING_DB", str(path))
    dispatcher().clear()
    q = torch.randn(200, 4, 192, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(200, 4, 128, device="cuda", dtype=torch.bfloat16)
    kr = torch.randn(200, 1, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(200, 4, 128, device="cuda", dtype=torch.bfloat16)
    sel = api.mla_prefill_kernel(q, k, v, k_rope=kr, causal=True, kernel="mla_prefill_sm80")
    assert sel.origin == "user"
    assert sel.variant.symbol == result.best.variant.symbol
    dispatcher().clear()
    monkeypatch.setenv("MLAGEN_NO_TUNED", "1")
    sel = api.mla_prefill_kernel(q, k, v, k_rope=kr, causal=True, kernel="mla_prefill_sm80")
    assert sel.origin == "default"
    dispatcher().clear()


def test_sm90_schedule_search_runs(tmp_path):
    """Coordinate descent over the Hopper schedule (a few axes) completes and records a winner."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 kernel needs a Hopper GPU")
    config = TuneConfig(spec="mla_prefill_sm90", shapes=(TINY,), strategy="coordinate", max_trials=8,
                        fixed={"consumers": 2, "stages": 2, "producer_regs": 24, "consumer_regs": 240,
                               "swizzle_q": 128, "swizzle_k": 128, "swizzle_v": 128, "cluster": 1},
                        timeout_s=60, iters=3, warmup=1, db_path=str(tmp_path / "t.sqlite"))
    (result,) = tune(config, progress=lambda line: None)
    assert result.best is not None
    assert all(t.outcome in ("ok", "pruned") for t in result.trials), [(t.variant.symbol, t.outcome, t.detail)
                                                                       for t in result.trials]


SMALL = "b=2,q=[300,129],k=[333,129],h=4"
FIXED_SM90_FEW = {"consumers": 2, "stages": 2, "producer_regs": 24, "swizzle_q": 128, "swizzle_k": 128,
                  "swizzle_v": 128, "order": "pingpong", "load_warps": 2, "overlap": True}


def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 kernel needs a Hopper GPU")


def test_global_search_on_a_described_shape(tmp_path, monkeypatch):
    """The global strategy end to end: samples, halving re-times, descent, finalists re-timed."""
    _hopper()
    monkeypatch.setenv("MLAGEN_NO_SHIPPED", "1")   # a shipped record in use may win and stay unrecorded
    config = TuneConfig(spec="mla_prefill_sm90", shapes=(SMALL,), strategy="global", max_trials=16,
                        fixed=FIXED_SM90_FEW, timeout_s=60, iters=3, warmup=1, db_path=str(tmp_path / "t.sqlite"),
                        seed=1)
    (result,) = tune(config, progress=lambda line: None)
    assert result.problem == "causal/h4/q256/k256" and result.best is not None
    assert 2 <= len(result.finals) and all(len(f.block_ms) in (3, 3 + EXTRA_ROUNDS) for f in result.finals)
    assert len(result.trials) <= 16
    (best,) = db.TuningDB(tmp_path / "t.sqlite").bests()
    assert best.symbol == result.best.variant.symbol


def test_the_record_in_use_is_checked_and_retimed_with_the_finalists(tmp_path, monkeypatch):
    """A user record for the class (one a two-trial search may not reach): measured once, checked
    against the reference like every trial, re-timed in the final rounds and named in the result;
    whichever wins is what the database holds afterwards, with its re-timed time."""
    _hopper()
    from mlagen import dispatch, runtime
    from mlagen import spec as spec_mod
    from mlagen import variant as variant_mod
    from mlagen.tune import family_of, problem_of

    monkeypatch.setenv("MLAGEN_NO_SHIPPED", "1")
    spec = spec_mod.load("mla_prefill_sm90")
    target = runtime.device_info(0).target
    keep = {**FIXED_SM90_FEW, "mask": "causal"}
    base = variant_mod.make(spec, {**FIXED_SM90_FEW, "mask": "causal"})
    record = resources.nearest_feasible(base.with_values(block_n=96 if base["block_n"] != 96 else 128), target,
                                          keep=keep)
    assert record != resources.nearest_feasible(base, target, keep=keep)
    info = runtime.device_info(0)
    problem = problem_of(parse_shape(SMALL), family_of(spec))
    key = dispatch.record_key(spec, problem, device=info.name, sm_count=info.sm_count, driver=info.driver_version,
                              target=target)
    path = tmp_path / "t.sqlite"
    db.TuningDB(path).set_best(db.Best(key, dict(record.tunables), record.symbol, 9.9, None, "before", 0.0))
    lines = []
    config = TuneConfig(spec="mla_prefill_sm90", shapes=(SMALL,), strategy="coordinate", max_trials=2,
                        fixed=FIXED_SM90_FEW, timeout_s=60, iters=3, warmup=1, db_path=str(path))
    (result,) = tune(config, progress=lines.append)
    assert result.in_use == f"{record.symbol} (user)"
    mine = [t for t in result.trials if t.variant == record]
    assert len(mine) == 1 and mine[0].outcome == "ok" and mine[0].max_error < 2e-2
    assert record in {f.variant for f in result.finals}
    (best,) = db.TuningDB(path).bests()
    assert best.symbol == result.best.variant.symbol and best.time_ms < 9.9


def test_resume_runs_no_finished_trial_again(tmp_path):
    _hopper()
    path = str(tmp_path / "t.sqlite")
    first = TuneConfig(spec="mla_prefill_sm90", shapes=(SMALL,), strategy="coordinate", max_trials=5,
                       fixed=FIXED_SM90_FEW, timeout_s=60, iters=3, warmup=1, db_path=path)
    (a,) = tune(first, progress=lambda line: None)
    second = TuneConfig(**{**first.__dict__, "max_trials": 9, "resume": True})
    (b,) = tune(second, progress=lambda line: None)
    assert sum(t.resumed for t in b.trials) == len(a.trials)
    symbols = [t.symbol for t in db.TuningDB(path).trials()]
    assert len(symbols) == len(set(symbols))   # every variant measured once over both runs


def test_two_gpus_give_the_same_trials(tmp_path):
    """--devices 0,1 on a 2-GPU machine: the same trials (variants and outcomes) as one GPU."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    _hopper()
    base = dict(spec="mla_prefill_sm90", shapes=(SMALL,), strategy="coordinate", max_trials=8,
                fixed=FIXED_SM90_FEW, timeout_s=60, iters=3, warmup=1)
    (one,) = tune(TuneConfig(**base, devices=(0,), db_path=str(tmp_path / "1.sqlite")), progress=lambda line: None)
    (two,) = tune(TuneConfig(**base, devices=(0, 1), db_path=str(tmp_path / "2.sqlite")), progress=lambda line: None)
    assert [t.variant.symbol for t in one.trials] == [t.variant.symbol for t in two.trials]
    assert [t.outcome for t in one.trials] == [t.outcome for t in two.trials]


def test_bench_public_call_and_check_peer():
    """mlagen (the public call, default arguments) and mlagen-check run and are right; fa3 is
    timed when built, else n/a with the reason."""
    shape = parse_shape("b=2,q=[300,700],k=[333,900],h=16")
    (result,) = bench.run([shape], peers=["fa3", "mlagen", "mlagen-check"], iters=5, rounds=1, warmup=1,
                          progress=lambda line: None)
    for name in ("mlagen", "mlagen-check"):
        p = result.peers[name]
        assert p.check.ok and p.timing is not None, (name, p.error)
    assert "public call, default arguments" in result.peers["mlagen"].note
    assert "check_seqlens=True" in result.peers["mlagen-check"].note
    fa3 = result.peers["fa3"]
    path, why = FA3.status()
    if path is None:
        assert fa3.timing is None and "not" in fa3.error
    else:
        assert fa3.check.ok and fa3.timing is not None, fa3.error


def test_the_cluster_runner_warms_its_measuring_process_once(tmp_path):
    """Issue 39: ``cluster.warm`` starts the process a class measures in (spawned without importing
    this process's __main__); the class's measurements then use it, not a new one."""
    from mlagen import spec as spec_mod
    from mlagen import variant as variant_mod
    from mlagen.tune import cluster

    spec = spec_mod.load("mla_prefill_sm80")
    v = variant_mod.make(spec, {**FIXED_SM80, "block_n": 64, "mask": "causal"})
    args = (spec.name, TINY, 0, 1, 60.0)
    try:
        ready = cluster.warm(args)
        assert ready["device"] and ready["sm_count"] > 0
        pid = cluster._PROCESSES[args].proc.pid
        assert cluster.warm(args) == {}   # already running
        out = cluster.measure(args, dict(v.values), 3, None, None)
        assert out["outcome"] == "ok", out
        assert cluster._PROCESSES[args].proc.pid == pid
    finally:
        cluster.release()
