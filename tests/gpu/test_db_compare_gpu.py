"""``mlagen db compare --retime`` on the GPU: both winners checked, then timed in interleaved rounds."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from mlagen import arch, db, dispatch, resources, runtime, variant  # noqa: E402
from mlagen import spec as spec_mod  # noqa: E402
from mlagen.cli import cli  # noqa: E402
from mlagen.tune import compare  # noqa: E402

SPEC = spec_mod.load("mla_prefill_sm90")
PROBLEM = "causal/h128/q8192/k8192"   # D1's class


def _key():
    info = runtime.device_info(0)
    if info.target is None or info.target.name not in SPEC.targets:
        pytest.skip(f"{SPEC.name} does not target this GPU ({info.name})")
    return dispatch.record_key(SPEC, PROBLEM, device=info.name, sm_count=info.sm_count, driver=info.driver_version,
                               target=arch.target(info.target.name))


def _best(key, v, symbol=None) -> db.Best:
    return db.Best(key, dict(v.tunables), symbol or v.symbol, 1.0, None, "test", 1000.0)


def test_two_winners_are_retimed_interleaved_and_judged(tmp_path):
    key = _key()
    target = arch.target("sm_90a")
    default = resources.nearest_feasible(variant.make(SPEC, {"mask": "causal"}), target, keep={"mask": "causal"})
    keep = {"mask": "causal", "block_n": 112 if default["block_n"] != 112 else 96}
    other = resources.nearest_feasible(variant.make(SPEC, {**default.tunables, **keep}), target, keep=keep)
    a, b = db.TuningDB(tmp_path / "a.sqlite"), db.TuningDB(tmp_path / "b.sqlite")
    a.set_best(_best(key, default))
    b.set_best(_best(key, other))
    result = CliRunner().invoke(cli, ["db", "compare", str(a.path), str(b.path), "--retime", "--rounds", "4",
                                      "--iters", "5"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    line = next(s for s in result.output.splitlines() if "re-timed on D1, 4 rounds" in s)
    assert "B/A " in line and "noise allowance" in line
    verdict = next(s for s in result.output.splitlines() if s.startswith("  verdict: "))
    assert verdict in ("  verdict: within noise", "  verdict: A faster beyond the noise",
                       "  verdict: B faster beyond the noise")


def test_one_kernel_under_two_names_is_within_noise():
    """The same kernel re-timed against itself (the records' symbols made to differ) lies within
    the allowance, or a few percent of it: what two tunes' tied winners look like."""
    key = _key()
    default = variant.make(SPEC, {"mask": "causal"})
    pair = compare.Pair(key, _best(key, default), dataclasses.replace(_best(key, default), symbol="renamed"))
    c = compare.retime(pair, rounds=6, iters=10)
    assert c.retimed is not None, c.note
    assert len(c.retimed.a.block_ms) == len(c.retimed.b.block_ms) == 6
    assert abs(c.retimed.ratio - 1) < 0.05, c.retimed
