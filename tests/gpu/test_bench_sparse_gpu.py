"""The sparse family through ``mlagen bench`` and ``mlagen tune`` on the GPU: its peers (FlashMLA
when built, padded for H = 16; the naive PyTorch gather + matmul; ours through the public call
and with a spec forced) are checked against the reference and timed; the CLI writes the report
and the JSON; a tune of the sm90 spec records a winner that the sparse call then dispatches to.

Small shapes and few calls: these check the plumbing, never a speed.
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from mlagen import bench, db  # noqa: E402
from mlagen.families.mla_sparse_prefill import tools as bench_sparse  # noqa: E402
from mlagen.cli import cli  # noqa: E402
from mlagen.dispatch import dispatcher  # noqa: E402
from mlagen.families import mla_sparse_prefill as fam  # noqa: E402
from mlagen.families.mla_sparse_prefill import problem as sp_problem, call as sp_call, entry as sp_entry, reference as sp_ref  # noqa: E402
from mlagen.families.mla_sparse_prefill.peers import FLASHMLA  # noqa: E402
from mlagen.tune import TuneConfig, tune  # noqa: E402

H16 = "sq=256,h=16,topk=512,skv=4096"     # FlashMLA runs it padded to 64 heads
ODD = "sq=100,h=20,topk=200,skv=1000"     # and this one padded in heads and in topk


def _hopper():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 kernels and FlashMLA's need a Hopper GPU")


def _flashmla_checked(peer, padded_note: str):
    """FlashMLA: right and timed when built (with the padding said in the note), else n/a saying so."""
    path, why = FLASHMLA.status()
    if path is None:
        assert peer.timing is None and peer.error == why and "not" in why
    else:
        assert peer.check.ok and peer.timing is not None, peer.error
        assert padded_note in peer.note


@pytest.mark.parametrize("shape, note", [(H16, "padded to 64 heads (from 16)"), (ODD, "from topk 200 to 256")])
def test_sparse_peers_are_checked_and_timed(shape, note):
    _hopper()
    (result,) = bench.run(shape, peers=["flashmla", "naive", "mlagen", "mlagen:mla_sparse_prefill_sm80"], iters=5,
                          rounds=2, warmup=1, progress=lambda line: None)
    assert result.family is fam.FAMILY
    for name in ("naive", "mlagen", "mlagen:mla_sparse_prefill_sm80"):
        p = result.peers[name]
        assert p.check.ok and p.timing is not None and len(p.timing.blocks) >= 2, (name, p.error)
    assert "public call, default arguments" in result.peers["mlagen"].note
    assert "mla_sparse_prefill_sm90" in result.peers["mlagen"].note
    assert "mla_sparse_prefill_sm80" in result.peers["mlagen:mla_sparse_prefill_sm80"].note
    _flashmla_checked(result.peers["flashmla"], note)
    assert result.ratio("mlagen", "naive") is not None


def test_bench_cli_on_a_sparse_and_a_dense_shape(tmp_path):
    """``mlagen bench --shape S...`` and a dense shape in one run: a table per family, the JSON."""
    _hopper()
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(cli, ["bench", "--shape", H16, "--shape", "b=1,q=512,h=16,causal", "--peers",
                                      "flashmla,naive,cudnn,mlagen", "--iters", "3", "--rounds", "1", "--json",
                                      str(out)])
    assert result.exit_code == 0, result.output
    assert "## mla_prefill" in result.output and "## mla_sparse_prefill" in result.output
    doc = json.loads(out.read_text())
    sparse, dense = (next(r for r in doc["results"] if r["family"] == f) for f in ("mla_sparse_prefill", "mla_prefill"))
    assert set(sparse["peers"]) == {"flashmla", "naive", "mlagen"} and set(dense["peers"]) == {"cudnn", "mlagen"}
    assert sparse["heads"] == 16 and sparse["ratios"]["mlagen/naive"] > 0
    if FLASHMLA.status()[0] is not None:
        assert "padded to 64" in sparse["peers"]["flashmla"]["note"] and sparse["ratios"]["mlagen/flashmla"] > 0


def test_bench_sparse_tool_times_a_forced_variant(capsys):
    _hopper()
    code = bench_sparse.main(["bench", "--shapes", H16, "--peers", "mlagen", "--iters", "3", "--rounds", "1",
                              "--variant", "l2_evict_last=false"])
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("| ")]   # the legend also says "WRONG"
    assert code == 0 and "mlagen:l2_evict_last=false TFLOP/s" in text and not any("WRONG" in r for r in rows)


def test_a_sparse_tune_is_dispatched_to(tmp_path, monkeypatch):
    """``mlagen tune mla_sparse_prefill_sm90`` on a small shape: every trial right, the winner
    recorded under the call's shape class, and a later call of that class dispatches to it."""
    _hopper()
    path = tmp_path / "t.sqlite"
    fixed = {"consumer_regs": 216, "producer_regs": 72, "gather_fence": False, "late_fence": True,
             "epilogue": "staged", "softmax_max": "lazy", "early_free": False,
             "q_evict_first": False, "persistent": False}   # two variants left: l2_evict_last on and off
    config = TuneConfig(spec="mla_sparse_prefill_sm90", shapes=("sq=64,h=64,topk=256,skv=1024",),
                        strategy="exhaustive", fixed=fixed, timeout_s=120, iters=3, warmup=1, db_path=str(path))
    (result,) = tune(config, progress=lambda line: None)
    assert result.problem == "d576/h64/k256/s1024/flat"
    assert [t.outcome for t in result.trials] == ["ok", "ok"], [(t.variant.symbol, t.detail) for t in result.trials]
    (best,) = db.TuningDB(path).bests()
    assert best.key.family == "mla_sparse_prefill" and best.symbol == result.best.variant.symbol
    monkeypatch.setenv("MLAGEN_TUNING_DB", str(path))
    monkeypatch.setenv("MLAGEN_NO_SHIPPED", "1")
    dispatcher().clear()
    try:
        x = sp_ref.make_inputs(sp_problem.parse_shape("sq=32,h=50,topk=200,skv=500"), "cuda", seed=2)   # pool s512: the neighbour bucket
        _, sel = sp_entry.select(sp_call.prepare(x["q"], x["kv"], x["indices"], softmax_scale=x["softmax_scale"],
                                        attn_sink=x["attn_sink"]))
        assert (sel.variant.symbol, sel.origin) == (result.best.variant.symbol, "user")
    finally:
        dispatcher().clear()
