"""``mlagen db compare``: two databases' winners per record key, and the re-timing's verdict by the
tuner's own noise allowance (GPU-free parts; the re-timing itself: tests/gpu/test_db_compare_gpu.py)."""

from __future__ import annotations

import dataclasses

import pytest
from click.testing import CliRunner

from mlagen import db, dispatch, variant
from mlagen import spec as spec_mod
from mlagen.cli import cli
from mlagen.tune import NOISE_CAP, NOISE_FLOOR, Final, choose, compare, noise_allowance

SPEC = spec_mod.load("mla_prefill_sm90")
PROBLEM = "causal/h128/q8192/k8192"
KEY = db.RecordKey(family=SPEC.family, spec=SPEC.name, problem=PROBLEM, dtypes="bf16", device="NVIDIA H200",
                   sm_count=132, driver="13.0", compiler="nvrtc 13.0", source_hash=dispatch.cached_source_hash(SPEC))
DEFAULT = variant.make(SPEC, {"mask": "causal"})
OTHER = variant.make(SPEC, {**DEFAULT.tunables, "block_n": 112 if DEFAULT["block_n"] != 112 else 96, "mask": "causal"})


def best(v, ms=1.0, **changes) -> db.Best:
    return db.Best(dataclasses.replace(KEY, **changes), dict(v.tunables), v.symbol, ms, 700.0, "run", 1000.0)


def database(path, *records) -> str:
    d = db.TuningDB(path)
    for r in records:
        d.set_best(r)
    return str(path)


def compare_cli(*args):
    return CliRunner().invoke(cli, ["db", "compare", *map(str, args)], catch_exceptions=False)


def test_pairs_match_by_record_key_and_name_the_rest(tmp_path):
    a = database(tmp_path / "a.sqlite", best(DEFAULT), best(DEFAULT, problem="causal/h128/q4096/k4096"))
    b = database(tmp_path / "b.sqlite", best(OTHER, ms=0.9), best(OTHER, device="NVIDIA H100 80GB HBM3"))
    listing = compare.pairs(db.TuningDB(a), db.TuningDB(b))
    assert [(p.key, p.a.symbol, p.b.symbol) for p in listing.pairs] == [(KEY, DEFAULT.symbol, OTHER.symbol)]
    assert [r.key.problem for r in listing.only_a] == ["causal/h128/q4096/k4096"]
    assert [r.key.device for r in listing.only_b] == ["NVIDIA H100 80GB HBM3"]
    assert not listing.pairs[0].same
    assert listing.pairs[0].differing() == [("block_n", DEFAULT["block_n"], OTHER["block_n"])]
    assert compare.pairs(db.TuningDB(a), db.TuningDB(b), spec="mla_sparse_prefill_sm90").pairs == []


def test_the_listing_says_same_or_differ_on_cpu(tmp_path):
    a = database(tmp_path / "a.sqlite", best(DEFAULT), best(DEFAULT, problem="causal/h128/q4096/k4096"))
    b = database(tmp_path / "b.sqlite", best(DEFAULT, ms=1.1), best(OTHER, problem="causal/h128/q4096/k4096"))
    result = compare_cli(a, b)
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"  A {DEFAULT.symbol} (recorded 1.000 ms)" in out and f"  B {DEFAULT.symbol} (recorded 1.100 ms)" in out
    assert "  verdict: same" in out
    assert "  verdict: differ (not re-timed; --retime times them here)" in out
    assert f"tunables that differ (A | B): block_n {DEFAULT['block_n']} | {OTHER['block_n']}" in out
    assert out.rstrip().endswith("2 shape class(es) in both, 1 differ, 1 same; 0 only in A, 0 only in B")


def test_retime_without_a_gpu_is_one_line(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    a = database(tmp_path / "a.sqlite", best(DEFAULT))
    b = database(tmp_path / "b.sqlite", best(OTHER))
    result = CliRunner().invoke(cli, ["db", "compare", a, b, "--retime"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: db compare --retime needs a CUDA GPU, and torch sees none"


def test_retime_of_the_same_winners_needs_no_gpu(tmp_path):
    a = database(tmp_path / "a.sqlite", best(DEFAULT))
    b = database(tmp_path / "b.sqlite", best(DEFAULT, ms=1.2))
    result = compare_cli(a, b, "--retime")
    assert result.exit_code == 0, result.output
    assert "  verdict: same" in result.output and "re-timed" not in result.output


def test_a_missing_database_is_refused(tmp_path):
    a = database(tmp_path / "a.sqlite", best(DEFAULT))
    result = CliRunner().invoke(cli, ["db", "compare", a, str(tmp_path / "none.sqlite")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_the_options_default_to_the_tuners_final_rounds():
    params = {p.name: p.default for p in cli.commands["db"].commands["compare"].params}
    assert params["rounds"] == compare.ROUNDS and params["iters"] == compare.ITERS


def test_interleave_alternates_which_goes_first():
    order = []

    def block(item):
        order.append(item)
        return {"a": 1.0, "b": 2.0}[item] + len(order) / 100

    rounds = compare.interleave(["a", "b"], 4, block)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert rounds == [[1.01, 1.04, 1.05, 1.08], [2.02, 2.03, 2.06, 2.07]]


def _retimed(a_ms, b_ms) -> compare.Retimed:
    return compare.Retimed("D1", Final(DEFAULT, list(a_ms)), Final(OTHER, list(b_ms)))


@pytest.mark.parametrize("a_ms, b_ms, within", [
    ([1.0] * 3, [1.004] * 3, True),                   # closer than the floor
    ([1.0] * 3, [1.008] * 3, False),                  # further than the floor, no spread to widen it
    ([1.0, 1.01, 1.0], [1.008] * 3, True),            # A's rounds spread 1%: that is the allowance
    ([1.0, 1.03, 1.0], [1.014] * 3, True),            # spread 3%, capped at NOISE_CAP
    ([1.0, 1.03, 1.0], [1.016] * 3, False),
    ([1.016] * 3, [1.0, 1.03, 1.0], False),           # the same either way round
])
def test_the_verdict_is_the_tuners_tie_rule(a_ms, b_ms, within):
    r = _retimed(a_ms, b_ms)
    assert r.allowance == min(NOISE_CAP, max(NOISE_FLOOR, r.a.noise, r.b.noise)) == noise_allowance(r.a, r.b)
    assert r.within is within
    # The tuner's choice ties the two exactly when the comparison calls them within noise: the
    # tie goes to the variant closer to the default (DEFAULT itself), whichever is faster.
    assert (choose([r.a, r.b], DEFAULT).variant == DEFAULT) is (within or r.a.median_ms < r.b.median_ms)
    pair = compare.Pair(KEY, best(DEFAULT), best(OTHER))
    verdict = compare.Comparison(pair, r).verdict
    faster = "A" if r.a.median_ms < r.b.median_ms else "B"
    assert verdict == ("within noise" if within else f"{faster} faster beyond the noise")
    line = next(s for s in compare.lines(compare.Listing([pair]), [compare.Comparison(pair, r)]) if "re-timed" in s)
    assert f"B/A {r.ratio:.3f}, noise allowance {r.allowance:.1%}" in line


def test_a_pair_not_retimed_says_why():
    pair = compare.Pair(KEY, best(DEFAULT), best(OTHER))
    c = compare.Comparison(pair, note="made on NVIDIA H200 (132 SMs), this GPU is NVIDIA H100 (132 SMs)")
    assert c.verdict == "differ (not re-timed: made on NVIDIA H200 (132 SMs), this GPU is NVIDIA H100 (132 SMs))"
    assert compare.lines(compare.Listing([pair]), [c])[-1] == "1 shape class(es) in both, 1 differ; 0 only in A, 0 only in B"


def test_retime_glue_with_a_fake_gpu(monkeypatch):
    """retime() on CPU with the GPU parts faked: records of another device or of other sources are
    not timed (the comparison says why); otherwise both winners are checked, then timed in
    alternating order, each round's calls by measure.time_calls with the flush, on D1."""
    torch = pytest.importorskip("torch")
    from mlagen import measure, verify

    calls = []

    class FakeVerifier:
        def __init__(self, family, shape, device, seed, dtype="bf16"):
            assert shape.id == "D1" and dtype == "bf16"

        def verify(self, v):
            calls.append(("verify", v))
            return None, 1e-3

        def outputs(self):
            return "out"

        def call(self, v, outputs):
            calls.append(("call", v))

    def time_calls(fn, iters, flush):
        assert flush == "flush"
        fn()
        who = calls[-1][1]
        return [(1.0 if who == DEFAULT else 1.02) * 1e-3] * iters

    monkeypatch.setattr(measure, "require_gpu", lambda tool: None)
    monkeypatch.setattr(verify, "Verifier", FakeVerifier)
    monkeypatch.setattr(measure, "time_calls", time_calls)
    info = type("I", (), {"name": "NVIDIA H200", "sm_count": 132})()
    device = torch.device("cpu")
    pair = compare.Pair(KEY, best(DEFAULT), best(OTHER))
    other_gpu = type("I", (), {"name": "NVIDIA H100 80GB HBM3", "sm_count": 132})()
    assert compare.retime(pair, device=device, info=other_gpu, flush="flush").note == \
        "made on NVIDIA H200 (132 SMs), this GPU is NVIDIA H100 80GB HBM3 (132 SMs)"
    stale = compare.Pair(dataclasses.replace(KEY, source_hash="0" * 16), best(DEFAULT), best(OTHER))
    assert "made for other sources of mla_prefill_sm90" in compare.retime(stale, device=device, info=info,
                                                                          flush="flush").note
    assert calls == []
    c = compare.retime(pair, rounds=4, iters=2, warmup=1, device=device, info=info, flush="flush")
    assert c.note == "" and c.retimed.shape == "D1"
    assert c.retimed.a.block_ms == [1.0] * 4 and c.retimed.b.block_ms == pytest.approx([1.02] * 4)
    assert c.verdict == "A faster beyond the noise"
    assert calls[:2] == [("verify", DEFAULT), ("verify", OTHER)]
    timed = [v for what, v in calls[2:] if what == "call"]
    # each round: one warm-up call then one call per time_calls, A first in rounds 1 and 3
    order = [timed[i] for i in range(0, len(timed), 2)]
    assert order == [DEFAULT, OTHER, OTHER, DEFAULT, DEFAULT, OTHER, OTHER, DEFAULT]
