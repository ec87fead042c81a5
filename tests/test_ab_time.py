"""tools/ab_time.py on a CPU machine: its case list and its refusal without a GPU (the timing
itself runs on the device, where the A/B tables of docs/benchmarks.md come from)."""

from __future__ import annotations

import pytest
from _tool import load_tool


@pytest.mark.parametrize("text, cases", [
    ("D1,D2,D7", ["D1", "D2", "D7"]),
    ("D1,b=2,q=[1,5],h=8,causal,D3", ["D1", "b=2,q=[1,5],h=8,causal", "D3"]),
    ("S1,sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32,M3", ["S1", "sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32", "M3"]),
    ("b=1,q=8192,h=64,causal,d=192/64/256", ["b=1,q=8192,h=64,causal,d=192/64/256"]),
])
def test_cases_split_only_where_a_new_shape_starts(text, cases):
    assert load_tool("ab_time.py").split_cases(text) == cases


def test_without_a_gpu_it_says_so(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        load_tool("ab_time.py").main(["mla_prefill_sm90", "--cases", "D1"])


def test_the_flow_with_the_gpu_parts_stood_in(monkeypatch, tmp_path, capsys):
    """Everything but the GPU: records chosen per case, both variants built and called, the
    outputs compared, rounds interleaved, the JSON written. The base spec is the tree's own here
    (on the device it is tools/ab_install.py's copy of a revision)."""
    torch = pytest.importorskip("torch")
    import json

    from mlagen import build, families, measure, spec as spec_mod
    from mlagen.errors import SpecError

    real_load = spec_mod.load
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(spec_mod, "load", lambda name: real_load(name.removesuffix("_base")))
    built = []
    monkeypatch.setattr(build, "build_many", lambda vs, archs, jobs: built.extend(vs))
    monkeypatch.setattr(measure, "L2Flush", lambda dev: (lambda: None))
    fam = families.get("mla_prefill")
    called = []

    def call(inputs, *, variant=None, kernel=None, outputs=None, check=False):
        called.append(variant.symbol)
        if "chunked" in variant.symbol:   # as a spec's rules refuse a default at build time
            raise SpecError("specs/x.yaml", "tune", "variant cannot run on sm_90a: a rule")
        return outputs

    monkeypatch.setattr(type(fam), "call", lambda self, inputs, **kw: call(inputs, **kw))
    monkeypatch.setattr(type(fam), "make_inputs", lambda self, shape, dev, seed=0, dtype="bf16": {})
    monkeypatch.setattr(type(fam), "make_outputs", lambda self, shape, dev, fill=0.0: (torch.zeros(4), torch.zeros(4)))
    order = []
    monkeypatch.setattr(measure, "time_calls", lambda fn, iters, flush: order.append(fn) or [1e-3] * iters)
    out = tmp_path / "ab.json"
    assert load_tool("ab_time.py").main(["mla_prefill_sm90", "--cases", "D1,b=1,q=300,h=8,chunk=128,D8", "--rounds", "2",
                             "--iters", "3", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert set(got) == {"D1", "b=1,q=300,h=8,chunk=128", "D8"}
    # A refused case is reported and the others still run.
    assert "cannot run on sm_90a" in got.pop("b=1,q=300,h=8,chunk=128")["refused"]
    assert got["D1"]["why"].startswith("record causal/h128/q8192/k8192")     # the shipped H100 record of D1's class
    assert "n192r64v256" in got["D8"]["variant"]                              # D8's geometry specialized
    assert all(r["outputs_identical"] and r["new_over_base"] == 1.0 for r in got.values())
    assert len(built) == 6 and len(order) == 8      # two variants a case; 2 rounds x 2 sides a case
    assert "| D1 |" in capsys.readouterr().out
