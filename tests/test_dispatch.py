"""Which variant dispatch picks for a device and shape class, without a GPU: a temporary tuning
database, the shipped records, and DeviceInfo records of devices this machine does not have."""

from __future__ import annotations

import time

import pytest

from mlagen import arch, db, dispatch, resources, variant
from mlagen import spec as spec_mod
from mlagen.runtime import DeviceInfo

S90 = spec_mod.load("mla_prefill_sm90")
S80 = spec_mod.load("mla_prefill_sm80")
SHIPPED_DEVICE = "NVIDIA H100 80GB HBM3"


def device(name, sm_count=132, compute=(9, 0)):
    return DeviceInfo(index=0, name=name, compute=compute, sm_count=sm_count, driver_version="13.0",
                      smem_per_block_optin=232448, l2_bytes=50 << 20)


@pytest.fixture
def empty_db(tmp_path, monkeypatch):
    monkeypatch.delenv("MLAGEN_NO_TUNED", raising=False)
    monkeypatch.delenv("MLAGEN_NO_SHIPPED", raising=False)
    return db.TuningDB(tmp_path / "t.sqlite")


def shipped(spec, problem):
    return next(b for b in db.shipped_records() if b.key.spec == spec.name and b.key.problem == problem)


def test_the_shipped_h100_record_on_an_h100(empty_db):
    rec = shipped(S90, "causal/h128/q8192/k8192")
    v, origin = dispatch.choose_variant(S90, rec.key.problem, {"mask": "causal"}, device(SHIPPED_DEVICE), empty_db)
    assert (v.symbol, origin) == (rec.symbol, "shipped:h100.json")


@pytest.mark.parametrize("name, sms", [("NVIDIA H200", 132), ("NVIDIA H800", 132), ("NVIDIA H20", 78)])
def test_h100_records_serve_other_hopper_devices(empty_db, name, sms):
    rec = shipped(S90, "causal/h128/q8192/k8192")
    v, origin = dispatch.choose_variant(S90, rec.key.problem, {"mask": "causal"}, device(name, sms), empty_db)
    assert v.symbol == rec.symbol
    assert origin == f"shipped:h100.json (other device: {SHIPPED_DEVICE})"


def test_sm80_records_need_a_known_device_of_the_same_target(empty_db):
    rec = shipped(S80, "causal/h128/q8192/k8192")
    v, origin = dispatch.choose_variant(S80, rec.key.problem, {"mask": "causal"}, device("NVIDIA H200"), empty_db)
    assert origin.endswith("(other device: NVIDIA H100 80GB HBM3)")  # the H100 is an sm_90a device by name
    a100 = device("NVIDIA A100-SXM4-80GB", 108, (8, 0))
    v, origin = dispatch.choose_variant(S80, rec.key.problem, {"mask": "causal"}, a100, empty_db)
    assert origin == "default" and v == resources.feasible_default(S80, arch.target("sm_80"), {"mask": "causal"})


def test_a_user_record_of_another_class_does_not_hide_the_exact_shipped_one(empty_db):
    exact = shipped(S90, "causal/h128/q8192/k8192")
    near = dispatch.record_key(S90, "causal/h128/q4096/k4096", device=SHIPPED_DEVICE, sm_count=132, driver="13.0",
                               target=arch.target("sm_90a"))
    other = next(b for b in db.shipped_records() if b.key.spec == S90.name and b.symbol != exact.symbol)
    empty_db.set_best(db.Best(near, other.variant, other.symbol, 1.0, 500.0, "run", time.time()))
    v, origin = dispatch.choose_variant(S90, exact.key.problem, {"mask": "causal"}, device(SHIPPED_DEVICE), empty_db)
    assert (v.symbol, origin) == (exact.symbol, "shipped:h100.json")
    v, origin = dispatch.choose_variant(S90, "causal/h128/q4096/k4096", {"mask": "causal"}, device(SHIPPED_DEVICE),
                                        empty_db)
    assert origin == "user"


def test_no_tuned_gives_the_default(empty_db, monkeypatch):
    monkeypatch.setenv("MLAGEN_NO_TUNED", "1")
    v, origin = dispatch.choose_variant(S90, "causal/h128/q8192/k8192", {"mask": "causal"}, device(SHIPPED_DEVICE),
                                        empty_db)
    assert origin == "default"


@pytest.mark.parametrize("name, target", [("NVIDIA H100 80GB HBM3", "sm_90a"), ("NVIDIA H200", "sm_90a"),
                                          ("NVIDIA H800 PCIe", "sm_90a"), ("NVIDIA H20", "sm_90a"),
                                          ("NVIDIA GH200 480GB", "sm_90a"), ("NVIDIA A100-SXM4-80GB", "sm_80"),
                                          ("NVIDIA A10", "sm_86"), ("NVIDIA L40S", "sm_89"),
                                          ("NVIDIA B200", "sm_100a"), ("Some Future GPU", None)])
def test_target_of_device_name(name, target):
    assert arch.target_of_device_name(name) == target


def test_candidate_variants_end_with_the_default(empty_db):
    rec = shipped(S90, "causal/h128/q8192/k8192")
    found = list(dispatch.candidate_variants(S90, rec.key.problem, {"mask": "causal"}, device(SHIPPED_DEVICE),
                                             empty_db))
    assert found[0] == (variant.make(S90, {**rec.variant, "mask": "causal"}), "shipped:h100.json")
    assert found[-1][1] == "default" and len(found) >= 3  # every causal sm90 record is a candidate


def test_mla_prefill_select_memo_follows_the_dispatcher(monkeypatch):
    """entry.select answers a repeated call class from its memo, asks the dispatcher again for a
    new class, a forced spec (MLAGEN_FAMILY) or after dispatcher().clear()."""
    import types

    from mlagen.families.mla_prefill import entry

    asked = []

    def fake_select(self, family, problem, specialization, device, accepts, variant=None, only=None):
        asked.append((problem, only))
        return types.SimpleNamespace(problem=problem, n=len(asked))

    monkeypatch.setattr(dispatch.Dispatcher, "select", fake_select)
    monkeypatch.delenv("MLAGEN_FAMILY", raising=False)
    entry._selected.clear()
    from mlagen.families.mla_prefill.traits import Traits

    def call(heads=16, total=4096):
        q = types.SimpleNamespace(device=types.SimpleNamespace(index=0), dtype="torch.bfloat16")
        c = types.SimpleNamespace(q=q, dtype="bf16", heads=heads, total_q=total, total_k=total, batch=1, causal=True,
                                  mask="causal", key=f"causal/h{heads}/q{total}", tma_compatible=lambda: None,
                                  traits=Traits())
        return c

    first = entry.select(call())[1]
    assert entry.select(call())[1] is first and len(asked) == 1        # the same class: the memo
    assert entry.select(call(heads=64))[1].n == 2                     # another class: the dispatcher
    monkeypatch.setenv("MLAGEN_FAMILY", "mla_prefill_sm80")
    assert entry.select(call())[1].n == 3                             # a forced spec is part of the key
    monkeypatch.delenv("MLAGEN_FAMILY")
    assert entry.select(call())[1] is first
    dispatch.dispatcher().clear()
    assert entry.select(call())[1].n == 4                             # cleared: asked again
    entry._selected.clear()


def test_mla_sparse_prefill_select_memo_follows_the_dispatcher(monkeypatch):
    """The sparse family's select answers a repeated call class from its memo (the same
    dispatch.SelectionMemo as the dense one), asks again for another shape class, another
    specialisation (a paged pool), a forced spec, or after dispatcher().clear()."""
    import types

    from mlagen.families.mla_sparse_prefill import entry as sp_entry

    asked = []

    def fake_select(self, family, problem, specialization, device, accepts, variant=None, only=None):
        asked.append((problem, tuple(specialization.items()), only))
        return types.SimpleNamespace(problem=problem, n=len(asked))

    monkeypatch.setattr(dispatch.Dispatcher, "select", fake_select)
    monkeypatch.delenv("MLAGEN_FAMILY", raising=False)
    monkeypatch.setattr(sp_entry, "_selected", None)

    from mlagen.families.mla_sparse_prefill import problem as sp_problem

    def call(heads=128, page_size=0, num_kv=8192, extra=None):
        q = types.SimpleNamespace(device=types.SimpleNamespace(index=0))
        c = types.SimpleNamespace(q=q, d_qk=576, heads=heads, topk=2048, keys=2048 + (extra.topk if extra else 0),
                                  num_kv=num_kv, extra=extra, page_size=page_size, kv_format="bf16")
        c.key = sp_problem.problem_key(c)   # what Call.key computes
        return c

    first = sp_entry.select(call())[1]
    assert sp_entry.select(call())[1] is first and len(asked) == 1          # the same class: the memo
    assert first.problem == "d576/h128/k2048/s8192/flat"
    assert sp_entry.select(call(heads=64))[1].n == 2                       # another class
    assert sp_entry.select(call(page_size=64))[1].n == 3                   # another specialisation
    assert asked[-1][1] == (("d_qk", 576), ("paged", True), ("kv_format", "bf16"))
    monkeypatch.setenv("MLAGEN_FAMILY", "mla_sparse_prefill_sm80")
    assert sp_entry.select(call())[1].n == 4                               # a forced spec is part of the key
    monkeypatch.delenv("MLAGEN_FAMILY")
    assert sp_entry.select(call())[1] is first
    dispatch.dispatcher().clear()
    assert sp_entry.select(call())[1].n == 5                               # cleared: asked again
    # Another pool size is another class; a second pool (only some specs read one) asks again,
    # even where both pools' keys and rows give the class of a one-pool call.
    assert sp_entry.select(call(num_kv=65536))[1].problem == "d576/h128/k2048/s65536/flat" and len(asked) == 6
    two = call(num_kv=4096, extra=types.SimpleNamespace(topk=0, num_kv=4096))
    assert two.key == call().key and sp_entry.select(two)[1].n == 7
