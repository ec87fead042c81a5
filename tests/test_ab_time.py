"""tools/ab_time.py on a CPU machine: its case list and its refusal without a GPU (the timing
itself runs on the device, where the A/B tables of docs/benchmarks.md come from)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_tool():
    spec = importlib.util.spec_from_file_location("ab_time", ROOT / "tools" / "ab_time.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("text, cases", [
    ("D1,D2,D7", ["D1", "D2", "D7"]),
    ("D1,b=2,q=[1,5],h=8,causal,D3", ["D1", "b=2,q=[1,5],h=8,causal", "D3"]),
    ("S1,sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32,M3", ["S1", "sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32", "M3"]),
    ("b=1,q=8192,h=64,causal,d=192/64/256", ["b=1,q=8192,h=64,causal,d=192/64/256"]),
])
def test_cases_split_only_where_a_new_shape_starts(text, cases):
    assert load_tool().split_cases(text) == cases


def test_without_a_gpu_it_says_so(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        load_tool().main(["mla_prefill_sm90", "--cases", "D1"])
