"""mlagen.dispatch: a tuning record whose kernel spills under the local compiler (it was measured
with another NVRTC) gives way to the next record, then to the default, and dispatch says so."""

from __future__ import annotations

import logging

import pytest

from mlagen import build, db, dispatch, resources
from mlagen import spec as spec_mod
from mlagen import variant
from mlagen.compiler import Binary, KernelResources
from mlagen.runtime import DeviceInfo

S80 = spec_mod.load("mla_prefill_sm80")
H100 = DeviceInfo(0, "NVIDIA H100 80GB HBM3", (9, 0), 132, "13.0", 232448, 50 << 20)
PROBLEM = "causal/h128/q8192/k8192"


class FakeCompiler:
    """Compiles nothing; kernels whose symbol is in ``spilling`` come back with spills."""

    name = "nvrtc"

    def __init__(self, spilling):
        self.spilling = spilling

    def version(self):
        return "13.9"

    def compile(self, source, target):
        spills = 4 if source.symbol in self.spilling else 0
        return Binary(b"\x7fELF", target, source.symbol, "k", KernelResources(registers=128, spill_stores=spills,
                                                                             spill_loads=spills), "nvrtc 13.9")


def record(values) -> db.Best:
    v = variant.make(S80, {"mask": "causal", **values})
    key = db.RecordKey("mla_prefill", S80.name, PROBLEM, "bf16", H100.name, 132, "13.0", "nvrtc 13.0", "x")
    return db.Best(key, dict(v.tunables), v.symbol, 1.0, 600.0, "run", 0.0, "shipped:h100.json")


@pytest.fixture
def dispatch_with(monkeypatch):
    monkeypatch.delenv("MLAGEN_NO_TUNED", raising=False)
    monkeypatch.setattr(dispatch, "runtime", lambda: type("R", (), {"load": lambda self, b, d: ("kernel", b)})())

    def setup(records, spilling):
        monkeypatch.setattr(dispatch, "for_target", lambda target: FakeCompiler(spilling))
        monkeypatch.setattr(build, "for_target", lambda target: FakeCompiler(spilling))
        monkeypatch.setattr(dispatch.db, "candidates", lambda *a, **k: list(records))
        dispatch._compiler_id.cache_clear()
        return dispatch.Dispatcher()

    yield setup
    dispatch._compiler_id.cache_clear()


def test_a_spilling_record_gives_way_to_the_next(dispatch_with, caplog):
    first, second = record({"block_n": 32}), record({"block_n": 64})
    d = dispatch_with([first, second], spilling={first.symbol})
    with caplog.at_level(logging.WARNING, logger="mlagen"):
        sel = d._choose(S80, PROBLEM, {"mask": "causal"}, H100, 0)
    assert sel.variant.symbol == second.symbol and sel.origin == "shipped:h100.json"
    [msg] = [r.getMessage() for r in caplog.records]
    assert f"skipping tuning record {first.symbol}" in msg and "spills registers under nvrtc 13.9" in msg


def test_then_the_default(dispatch_with, caplog):
    first = record({"block_n": 32})
    d = dispatch_with([first], spilling={first.symbol})
    sel = d._choose(S80, PROBLEM, {"mask": "causal"}, H100, 0)
    assert sel.origin == "default" and sel.variant == resources.feasible_default(S80, H100.target, {"mask": "causal"})
    assert not sel.binary.resources.spills


def test_a_spilling_default_still_runs_with_a_warning(dispatch_with, caplog):
    default = resources.feasible_default(S80, H100.target, {"mask": "causal"})
    d = dispatch_with([], spilling={default.symbol})
    with caplog.at_level(logging.WARNING, logger="mlagen"):
        sel = d._choose(S80, PROBLEM, {"mask": "causal"}, H100, 0)
    assert sel.origin == "default" and sel.binary.resources.spills
    assert any("launching it anyway" in r.getMessage() for r in caplog.records)


def test_explicit_variant_that_spills_is_refused(monkeypatch):
    from mlagen.errors import VariantError

    v = variant.make(S80, {"block_n": 32})
    monkeypatch.setattr(build, "for_target", lambda target: FakeCompiler({v.symbol}))
    with pytest.raises(VariantError, match=f"{v.symbol} spills registers under nvrtc 13.9"):
        dispatch.build(v, H100.target)
    assert dispatch.build(v, H100.target, allow_spills=True).resources.spills
