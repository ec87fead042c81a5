"""MLAGEN_RECORD_SHAPES: shape classes counted per call, merged into a YAML file atomically."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mlagen import shapelog
from mlagen.families import mla_prefill as fam
from mlagen.families.mla_prefill import problem as dense_problem

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def recording(tmp_path, monkeypatch):
    path = tmp_path / "shapes.yaml"
    monkeypatch.setenv("MLAGEN_RECORD_SHAPES", str(path))
    shapelog.reset()
    yield path
    shapelog.reset()


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("MLAGEN_RECORD_SHAPES", raising=False)
    shapelog.reset()
    shapelog.note("mla_prefill", "causal/h16/q4096/k4096", lambda: pytest.fail("described while off"))
    assert not shapelog.enabled()


def test_counts_and_first_description_per_class(recording):
    for i in range(3):
        shapelog.note("mla_prefill", "causal/h16/q4096/k4096", lambda i=i: f"b=4,q={4000 + i},h=16,causal")
    shapelog.note("mla_prefill", "none/h128/q8192/k8192", lambda: "b=1,q=8192,h=128,none")
    shapelog.flush()
    text = recording.read_text()
    assert text.startswith("# written by MLAGEN_RECORD_SHAPES\nfamily: mla_prefill\nshapes:\n")
    family, shapes = shapelog.read(recording)
    assert family == "mla_prefill"
    assert shapes == [{"shape": "b=4,q=4000,h=16,causal", "weight": 3}, {"shape": "b=1,q=8192,h=128,none", "weight": 1}]
    # Flushing again adds only what is new; a later process adds to the counts in the file.
    shapelog.flush()
    assert shapelog.read(recording)[1][0]["weight"] == 3
    shapelog.reset()
    shapelog.note("mla_prefill", "causal/h16/q4096/k4096", lambda: "b=4,q=4000,h=16,causal")
    shapelog.flush()
    assert shapelog.read(recording)[1][0] == {"shape": "b=4,q=4000,h=16,causal", "weight": 4}


def test_every_description_parses_back_to_its_class(recording):
    for text in ("b=4,q=4096,k=4096,h=16,causal", "b=16,q=2105,h=128,causal", "b=1,q=2048,k=16384,h=128,causal",
                 "b=2,q=8192,h=16,none"):
        shape = dense_problem.parse_shape(text)
        assert dense_problem.parse_shape(dense_problem.describe_shape(shape)) == dense_problem.Shape(dense_problem.describe_shape(shape), shape.q_lens,
                                                                        shape.k_lens, shape.heads, shape.causal)
        assert fam.FAMILY.problem_key(shape) == str(dense_problem.problem_key(shape.heads, sum(shape.q_lens),
                                                                    sum(shape.k_lens), len(shape.q_lens), shape.causal))


def test_a_file_of_another_family_is_left_alone(recording, caplog):
    recording.write_text("# written by MLAGEN_RECORD_SHAPES\nfamily: mla_sparse_prefill\nshapes:\n"
                         "  - {shape: \"h=128,topk=2048\", weight: 5}\n")
    before = recording.read_text()
    shapelog.note("mla_prefill", "causal/h16/q4096/k4096", lambda: "b=4,q=4096,h=16,causal")
    shapelog.flush()
    assert recording.read_text() == before
    assert "one family per file" in caplog.text


def test_written_at_exit_by_a_process(tmp_path):
    path = tmp_path / "s.yaml"
    code = ("from mlagen import shapelog\n"
            "for _ in range(5): shapelog.note('mla_prefill', 'causal/h16/q4096/k4096', lambda: 'b=4,q=4096,h=16,causal')\n")
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                              env={**__import__("os").environ, "MLAGEN_RECORD_SHAPES": str(path)})
        assert proc.returncode == 0, proc.stderr
    assert shapelog.read(path) == ("mla_prefill", [{"shape": "b=4,q=4096,h=16,causal", "weight": 10}])


def test_flushes_every_n_calls(recording, monkeypatch):
    monkeypatch.setattr(shapelog, "FLUSH_EVERY", 4)
    for _ in range(4):
        shapelog.note("mla_prefill", "causal/h16/q4096/k4096", lambda: "b=4,q=4096,h=16,causal")
    assert shapelog.read(recording)[1] == [{"shape": "b=4,q=4096,h=16,causal", "weight": 4}]


@pytest.mark.parametrize("text, match", [
    ("q=4096", "needs q=<length> and h=<heads>"),
    ("b=4,q=4096,h=16,sliding", "'sliding' is not a mask"),
    ("b=4,q=[1,2],h=16", "disagree on the number of sequences"),
    ("q=[1,2],k=[1,2,3],h=16", "disagree"),
    ("q=4096,h=16,x=3", "unknown key 'x'"),
    ("q=abc,h=16", "expected a non-negative integer"),
    ("q=4096,h=0", "h=0: expected a positive integer"),
    ("q=1,q=2,h=1", "q is given twice"),
])
def test_shape_descriptions_reject(text, match):
    with pytest.raises(ValueError, match=match):
        dense_problem.parse_shape(text)


def test_ragged_shape_description():
    s = dense_problem.parse_shape("q=[100,200,300],k=[150,200,400],h=8,none")
    assert (s.q_lens, s.k_lens, s.heads, s.causal, s.batch) == ((100, 200, 300), (150, 200, 400), 8, False, 3)
    assert dense_problem.describe_shape(s) == "b=3,q=[100,200,300],k=[150,200,400],h=8,none"
    assert fam.FAMILY.flops(s) == dense_problem.flops([(0, 100, 0, 150), (0, 200, 0, 200), (0, 300, 0, 400)], 8, False)


def test_a_call_is_described_by_its_batch_mean_lengths_heads_and_mask():
    from mlagen.families.mla_prefill.call import Call, DenseArgs, describe_call

    call = Call(*[None] * 8, total_q=8400, total_k=8400, heads=128, batch=4, scale=1.0, rope="shared",
                args=DenseArgs(None, None, None, causal=True))
    assert describe_call(call) == "b=4,q=2100,h=128,causal"
    call = Call(*[None] * 8, total_q=2048, total_k=16384, heads=128, batch=1, scale=1.0, rope="shared",
                args=DenseArgs(None, None, None, causal=False))
    assert describe_call(call) == "b=1,q=2048,k=16384,h=128,none"
    assert fam.FAMILY.problem_key(dense_problem.parse_shape(describe_call(call))) == str(call.key)
