"""The tuner on the GPU: every outcome recorded, failures never selected, winners used later."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from mlagen import api, bench, db  # noqa: E402
from mlagen.dispatch import dispatcher  # noqa: E402
from mlagen.tune import TuneConfig, tune  # noqa: E402

FAULTY = Path(__file__).parent / "fixtures" / "faulty_sm80.yaml"
TINY = bench.Shape("T1", (200,), (200,), 4, True)
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


def test_tuned_winner_is_used_by_later_calls(tmp_path, monkeypatch):
    path = tmp_path / "tuning.sqlite"
    config = TuneConfig(spec="mla_prefill_sm80", shapes=(TINY,), strategy="exhaustive", fixed=FIXED_SM80,
                        timeout_s=60, iters=5, warmup=1, db_path=str(path))
    (result,) = tune(config, progress=lambda line: None)
    assert sum(t.outcome == "ok" for t in result.trials) >= 2
    monkeypatch.setenv("MLAGEN_TUNING_DB", str(path))
    monkeypatch.setenv("MLAGEN_NO_SHIPPED", "1")
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
