"""The sparse family through the generic tuner, short of launching: ``mlagen tune
mla_sparse_prefill_sm90 --shape S1`` (or a description) reads the shape with the family, groups
shapes into the family's shape classes, enumerates the spec's variants, keys and stores the
trials and the winner, and the sparse call's dispatch finds that record for a call of the class.
GPU trials are replaced by a synthetic cost (as tests/test_tune_loop.py does for the dense family)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from mlagen import arch, db, dispatch, resources
from mlagen import spec as spec_mod
from mlagen import variant as variant_mod
from mlagen.build import BuildResult
from mlagen.families import get as get_family
from mlagen.runtime import DeviceInfo
from mlagen.shapes import parse_shapes, parse_workload
from mlagen.tune import Exhaustive, ShapeClass, TrialRunner, TuneConfig, make_search, shape_classes, tune_class

SPARSE = get_family("mla_sparse_prefill")
S90 = spec_mod.load("mla_sparse_prefill_sm90")
SM90A = arch.target("sm_90a")
H100 = "NVIDIA H100 80GB HBM3"
FLAT576 = {"d_qk": 576, "paged": False, "kv_format": "bf16"}


def test_ids_and_descriptions_resolve_to_sparse_shape_classes():
    given = ["S1", "sq=4096,h=128,topk=2048,skv=8000", "S2", "S5", "s6", "sq=100,h=20,topk=600,skv=9000,d=512"]
    shapes = [s for text in given for s in parse_shapes(text, S90)]
    classes = shape_classes(shapes, SPARSE)
    assert [(c.problem, c.shape.id, len(c.members)) for c in classes] == [
        ("d576/h128/k2048/s8192/flat", "S1", 2),    # S1 and a description of its pool's bucket are one class
        ("d576/h128/k2048/s32768/flat", "S2", 1),   # another pool size (S2) is another
        ("d576/h16/k2048/s32768/flat", "S5", 1),
        ("d576/h128/k1024/s65536/flat", "S6", 1),
        ("d512/h32/k1024/s16384/flat", "sq=100,h=20,topk=600,skv=9000,d=512", 1),   # H, topk, pool round up
    ]
    assert SPARSE.specialization(classes[0].shape) == FLAT576
    assert SPARSE.problem_specialization("d512/h32/k1024/flat") == {"d_qk": 512, "paged": False, "kv_format": "bf16"}
    with pytest.raises(ValueError, match="S1, S2"):
        parse_shapes("D1", S90)   # the dense id is no shape of this spec's family


def test_a_workload_file_of_sparse_shapes():
    items = parse_workload({"family": "mla_sparse_prefill", "shapes": [{"shape": "S1", "weight": 3},
                                                                       {"shape": "S3", "weight": 1},
                                                                       {"shape": "S5", "weight": 5}]}, family=S90)
    classes = shape_classes(items, SPARSE)
    assert [(c.problem, c.weight) for c in classes] == [("d576/h16/k2048/s32768/flat", 5.0),
                                                        ("d576/h128/k2048/s8192/flat", 3.0),
                                                        ("d576/h128/k2048/s131072/flat", 1.0)]


# The sm90 spec's tune space at one specialisation: 3 x 3 register budgets, 2 x 2 x 2 x 2 flags
# (evict-last, gather fence, late fence, lazy max), 4 epilogues, 2 x 2 x 2 (early free, Q evict-first,
# persistent).
SPACE = 3 * 3 * 2 * 2 * 2 * 2 * 4 * 2 * 2 * 2


def test_the_variants_enumerate_and_fit():
    search = make_search("auto", S90, FLAT576, SM90A, SPACE, 0)
    assert isinstance(search, Exhaustive)
    batch = search.next_batch()
    assert len(batch) == variant_mod.space_size(S90, FLAT576) == SPACE
    assert all(v["d_qk"] == 576 and v["paged"] is False for v in batch)
    fits = [v for v in batch if resources.check(v, SM90A).ok]
    assert fits and variant_mod.make(S90, FLAT576) in fits


class Cost:
    """Synthetic milliseconds: the default is 4.0; producer_regs=88 with l2_evict_last off is 3.5."""

    def __init__(self):
        self.calls = []

    def run(self, values, iters, **request):
        self.calls.append(values)
        v = variant_mod.make(S90, values)
        t = 4.0 - 0.5 * (v["producer_regs"] == 88 and not v["l2_evict_last"]) + 0.01 * (v["consumer_regs"] != 216)
        return {"outcome": "ok", "time_ms": t, "tflops": SPARSE.flops(SPARSE.shapes()["S1"]) / t / 1e9,
                "max_error": 4e-3, "registers": 216, "spills": 0}


def build(variants, on_built):
    for v in variants:
        verdict = resources.check(v, SM90A)
        on_built(BuildResult(v, "sm_90a", verdict.resources, "ok" if verdict.ok else "pruned",
                             [] if verdict.ok else verdict.reasons))


def device(name=H100):
    return DeviceInfo(index=0, name=name, compute=(9, 0), sm_count=132, driver_version="13.0",
                      smem_per_block_optin=232448, l2_bytes=50 << 20)


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    """S1 tuned with the synthetic cost into a fresh database: (database, result, record key)."""
    monkeypatch.delenv("MLAGEN_NO_TUNED", raising=False)
    monkeypatch.delenv("MLAGEN_NO_SHIPPED", raising=False)
    s1 = SPARSE.shapes()["S1"]
    problem = SPARSE.problem_key(s1)
    key = dispatch.record_key(S90, problem, device=H100, sm_count=132, driver="13.0", target=SM90A)
    database = db.TuningDB(tmp_path / "t.sqlite")
    config = TuneConfig(spec=S90.path, shapes=("S1",), strategy="auto", max_trials=SPACE, iters=5)
    runner = TrialRunner([Cost()], build, config.iters)
    result = tune_class(S90, ShapeClass(problem, s1, 1.0, [s1]), SM90A, config, database, runner, key,
                        progress=lambda line: None, clock=time.monotonic)
    return database, result, key


def test_the_tuner_keys_and_stores_sparse_records(tuned):
    database, result, key = tuned
    assert (key.family, key.spec, key.problem, key.dtypes) == ("mla_sparse_prefill", "mla_sparse_prefill_sm90",
                                                               "d576/h128/k2048/s8192/flat", "bf16")
    assert result.best.variant["producer_regs"] == 88 and result.best.variant["l2_evict_last"] is False
    # 88 producer registers leave room for 208 per consumer only: the register pool's constraint.
    assert result.best.variant["consumer_regs"] == 208 and result.best.time_ms == pytest.approx(3.51)
    assert len(result.trials) == SPACE and {t.outcome for t in result.trials} == {"ok", "pruned"}
    assert all(t.outcome == "pruned" for t in result.trials
               if t.variant["producer_regs"] == 88 and t.variant["consumer_regs"] != 208)
    (best,) = database.bests(family="mla_sparse_prefill")
    assert best.key == key and best.symbol == result.best.variant.symbol
    assert len(database.trials(**key.as_dict())) == len(result.trials)


def test_sparse_dispatch_reads_the_record_of_its_shape_class(tuned):
    database, result, key = tuned
    # A call of another S1-class size (the same rounded H and topk): the winner, from the user's database.
    call = SimpleNamespace(d_qk=576, heads=100, topk=1500, page_size=0, num_kv=5000)
    assert str(SPARSE.problem_key(call)) == key.problem
    v, origin = dispatch.choose_variant(S90, SPARSE.problem_key(call), SPARSE.specialization(call), device(),
                                        database)
    assert (v, origin) == (result.best.variant, "user")
    # Another device of the same architecture uses it too; another class (H 16) is 3 halvings away
    # and still the nearest record; a paged pool is compiled apart, so the default serves it.
    v, origin = dispatch.choose_variant(S90, key.problem, FLAT576, device("NVIDIA H200"), database)
    assert v == result.best.variant and origin == f"user (other device: {H100})"
    v, _ = dispatch.choose_variant(S90, "d576/h16/k2048/s65536/flat", FLAT576, device(), database)
    assert v == result.best.variant
    paged = {"d_qk": 576, "paged": True}
    v, origin = dispatch.choose_variant(S90, "d576/h128/k2048/paged", paged, device(), database)
    assert origin == "default" and v == resources.feasible_default(S90, SM90A, paged)


def test_the_sparse_call_asks_dispatch_for_its_shape_class(monkeypatch):
    """``mla_sparse_prefill`` selects through the dispatcher with the call's shape class and
    specialisation (which choose_variant above resolves to the tuned record)."""
    torch = pytest.importorskip("torch")
    from mlagen.families.mla_sparse_prefill import call as sp_call, entry as sp_entry

    asked = {}

    class FakeDispatcher:
        generation = 0   # read by the family's select memo (dispatch.SelectionMemo)

        def select(self, family, problem, specialization, device, accepts, variant=None, only=None):
            asked.update(family=family, problem=problem, specialization=specialization, device=device,
                         accepts=accepts(S90), variant=variant, only=only)
            return "selection"

    monkeypatch.setattr(dispatch, "dispatcher", lambda: FakeDispatcher())
    monkeypatch.setattr(sp_entry, "_selected", None)   # a fresh select memo
    q = SimpleNamespace(device=torch.device("cuda", 1))
    call = sp_call.Call(q, None, None, None, None, None, None, None, sq=4096, heads=128, topk=2048, d_qk=576,
                    num_kv=8192, kv_row_stride=576, kv_page_stride=0, page_size=0, scale=0.04)
    assert sp_entry.select(call) == (1, "selection")
    assert asked == {"family": "mla_sparse_prefill", "problem": "d576/h128/k2048/s8192/flat",
                     "specialization": FLAT576, "device": 1, "accepts": True, "variant": None, "only": None}
    sp_entry.select(call, "mla_sparse_prefill_sm80")
    assert asked["only"] == "mla_sparse_prefill_sm80"


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.parametrize("args, fragment", [
    (("--shape", "D1"), "not a shape id (S1, S2, S3, S4, S5, S6, V1, V2, V3, V4, V5, M1, M2, M3, M4, M5, M6, M7, M8)"),
    (("--shape", "sq=4096,h=128,topk=4096,skv=2048"), "topk <= skv"),
    (("--shape", "S1", "--fixed", "producer_regs=99"), "producer_regs"),
    (("--shape", "S1", "--fixed", "mask=causal"), "mask"),
])
def test_tune_sparse_argument_errors_are_one_line(args, fragment):
    from click.testing import CliRunner

    from mlagen.cli import cli

    result = CliRunner().invoke(cli, ["tune", "mla_sparse_prefill_sm90", *args])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("Error: ")]
    assert fragment in line


@pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU error; this machine has a GPU")
@pytest.mark.parametrize("shape", ["S1", "sq=4096,h=128,topk=2048,skv=8192"])
def test_tune_sparse_gets_to_the_gpu(shape):
    """Spec, shape and tunables are accepted; the first thing that fails is finding the GPU."""
    from click.testing import CliRunner

    from mlagen.cli import cli

    result = CliRunner().invoke(cli, ["tune", "mla_sparse_prefill_sm90", "--shape", shape])
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("Error: ")]
    assert "CUDA" in line or "GPU" in line, line
