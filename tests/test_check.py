"""mlagen check: kernels compiled on the CPU compared with committed expectations per NVRTC version."""

from __future__ import annotations

import json
from xml.etree import ElementTree

import pytest
from click.testing import CliRunner

from mlagen import check
from mlagen.cli import cli
from mlagen.backends.cuda import NvrtcCompiler

NVRTC = NvrtcCompiler().version()
SUBSET = {"specs": ["mla_prefill_sm80"], "targets": ["sm_80"]}  # a few quick compiles


def test_expectations_are_committed_for_the_local_nvrtc_and_13_0():
    versions = check.expectation_files()
    assert (13, 0) in versions
    path, note = check.choose_expectations(NVRTC)
    assert path.name == f"nvrtc-{NVRTC}.json" and note == "", "run `mlagen check --update` and commit the file"


def test_an_unknown_version_uses_the_nearest_older_and_says_so(tmp_path):
    files = {(13, 0): tmp_path / "nvrtc-13.0.json", (13, 5): tmp_path / "nvrtc-13.5.json"}
    assert check.choose_expectations("13.5", files) == (files[(13, 5)], "")
    path, note = check.choose_expectations("13.4", files)
    assert path == files[(13, 0)] and "no expectations for NVRTC 13.4; comparing with NVRTC 13.0" in note
    assert check.choose_expectations("14.1", files)[0] == files[(13, 5)]
    with pytest.raises(check.CheckError, match=r"no expectations for NVRTC 12.8 or older \(have: 13.0, 13.5\)"):
        check.choose_expectations("12.8", files)


def test_every_spec_default_and_shipped_record_is_an_item():
    items = check.items()
    whys = [w for i in items for w in i.why]
    assert any(w.startswith("shipped:h100.json ") for w in whys) and "default" in whys
    assert {i.target for i in items} >= {"sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a"}
    assert {(i.spec, i.variant.get("mask")) for i in items if "default" in i.why} >= {
        ("mla_prefill_sm90", "causal"), ("mla_prefill_sm90", "none"), ("mla_prefill_sm80", "none")}


def test_compare_reports_each_difference():
    want = {"a@sm_80": {"status": "ok", "registers": 128, "spill_bytes": 0, "stack_bytes": 0, "smem_bytes": 1024},
            "gone@sm_80": {"status": "ok"}}
    got = {"a@sm_80": {**want["a@sm_80"], "registers": 130, "spill_bytes": 8}, "new@sm_80": {"status": "pruned"}}
    out = {o.key: o for o in check.compare(got, want, {})}
    assert out["a@sm_80"].problems == ["registers: expected 128, got 130", "spill_bytes: expected 0, got 8"]
    assert "no expectation recorded" in out["new@sm_80"].problems[0]
    assert "no longer built" in out["gone@sm_80"].problems[0]
    assert check.compare(want, want, {})[0].ok


def test_the_committed_expectations_hold_for_a_subset():
    report = check.run(**SUBSET)
    assert report.ok, check.format_report(report)
    assert len(report.outcomes) >= 2


@pytest.fixture
def broken_expectations(tmp_path, monkeypatch):
    """The committed file of the local NVRTC, saved as 13.0 with one register count changed."""
    doc = json.loads(check.choose_expectations(NVRTC)[0].read_text())
    key = next(k for k in sorted(doc["kernels"]) if k.startswith("mla_prefill_sm80_") and k.endswith("@sm_80")
               and doc["kernels"][k]["status"] == "ok")
    doc["kernels"][key]["registers"] += 7
    (tmp_path / "nvrtc-13.0.json").write_text(json.dumps(doc))
    monkeypatch.setattr(check, "EXPECTATIONS_DIR", tmp_path)
    return key, doc["kernels"][key]["registers"]


def test_a_violated_expectation_fails_the_cli_with_a_diff_and_junit(broken_expectations, tmp_path):
    key, expected = broken_expectations
    junit = tmp_path / "check.xml"
    result = CliRunner().invoke(cli, ["check", "--spec", "mla_prefill_sm80", "--arch", "sm_80", "--junit", str(junit)])
    assert result.exit_code == 1, result.output
    assert f"FAIL {key}" in result.output
    assert f"registers: expected {expected}, got {expected - 7}" in result.output
    if NVRTC != "13.0":
        assert f"no expectations for NVRTC {NVRTC}; comparing with NVRTC 13.0" in result.output
    suite = ElementTree.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "1" and int(suite.get("tests")) >= 2
    [failed] = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert failed.get("name") == key and "registers" in failed.find("failure").get("message")


def test_update_writes_the_local_version_and_keeps_other_kernels(broken_expectations, tmp_path):
    key, expected = broken_expectations
    local = tmp_path / f"nvrtc-{NVRTC}.json"  # under NVRTC 13.0 it is the broken file itself
    before = json.loads(local.read_text())["kernels"] if local.exists() else {}
    result = CliRunner().invoke(cli, ["check", "--update", "--spec", "mla_prefill_sm80", "--arch", "sm_80"])
    assert result.exit_code == 0, result.output
    written = json.loads(local.read_text())
    assert written["nvrtc"] == NVRTC

    def selected(k):
        return k.endswith("@sm_80") and k.startswith("mla_prefill_sm80_")

    assert written["kernels"][key]["registers"] == expected - 7  # the selection was re-measured
    assert {k: v for k, v in written["kernels"].items() if not selected(k)} == \
        {k: v for k, v in before.items() if not selected(k)}  # everything else is kept as it was
    result = CliRunner().invoke(cli, ["check", "--spec", "mla_prefill_sm80", "--arch", "sm_80"])
    assert result.exit_code == 0, result.output


def test_gpu_mode_logic_with_a_stand_in_kernel_and_timer(monkeypatch):
    """measure_shipped on the CPU: the family's call is the reference, the timer says what we
    tell it; a winner is compared with its record's TFLOP/s within the tolerance."""
    torch = pytest.importorskip("torch")
    from mlagen import db, families
    from mlagen.families.mla_prefill.problem import Shape
    from mlagen.runtime import DeviceInfo

    fam = families.get("mla_prefill")
    small = fam.parse_shape("b=1,q=64,h=2,causal", id="S")
    record = next(r for r in db.shipped_records() if r.key.spec == "mla_prefill_sm90")
    shape_of_class = Shape("X", small.q_lens, small.k_lens, small.heads, small.causal)
    monkeypatch.setattr(fam, "problem_key", lambda s: record.key.problem if s.id == "X" else "none/h1/q1/k1")

    def call(inputs, *, variant=None, kernel=None, outputs=None, check=False):
        o, l = fam.reference(small, inputs, heads=None)
        return o.to(torch.bfloat16), l

    monkeypatch.setattr(fam, "call", call)
    info = DeviceInfo(0, record.key.device, (9, 0), 132, "13.0", 232448, 50 << 20)
    flops = fam.flops(shape_of_class)
    fast = flops / (record.tflops * 1e12)  # seconds at exactly the recorded throughput

    speeds = check.measure_shipped(0.1, shapes=[shape_of_class], device=torch.device("cpu"), info=info,
                                   timer=lambda fn: fast / 0.95)
    mine = [s for s in speeds if s.record == record]
    assert mine and mine[0].ok and mine[0].tflops == pytest.approx(record.tflops * 0.95)
    speeds = check.measure_shipped(0.1, shapes=[shape_of_class], device=torch.device("cpu"), info=info,
                                   timer=lambda fn: fast / 0.8)
    [slow] = [s for s in speeds if s.record == record]
    assert not slow.ok and "below the recorded" in slow.problem
    # One slow timing (a hot GPU) is timed again: the best of up to three decides.
    seen = []
    speeds = check.measure_shipped(0.1, shapes=[shape_of_class], device=torch.device("cpu"), info=info,
                                   timer=lambda fn: seen.append(fn) or (fast / 0.8 if len(seen) == 1 else fast / 0.95))
    [retimed] = [s for s in speeds if s.record == record]
    assert retimed.ok and retimed.tflops == pytest.approx(record.tflops * 0.95) and len(seen) == 2
    others = [s for s in speeds if s.record.key.spec == "mla_prefill_sm90" and s.record != record]
    assert all("no benchmark shape of class" in s.problem for s in others)
    # On an H200 dispatch uses the H100 records (same architecture): they are measured, and marked
    # as made on another device (issue 38 point 5).
    other_device = DeviceInfo(0, "NVIDIA H200", (9, 0), 132, "13.0", 232448, 50 << 20)
    speeds = check.measure_shipped(0.1, shapes=[shape_of_class], device=torch.device("cpu"), info=other_device,
                                   timer=lambda fn: fast)
    [used] = [s for s in speeds if s.record == record]
    assert used.ok and used.other_device
    # ... and the H200's own records (mlagen/tuned/h200.json) are not.
    assert all(s.other_device == (s.record.key.device != "NVIDIA H200") for s in speeds)
    assert any(not s.other_device for s in speeds) and any(s.other_device for s in speeds)


def test_gpu_mode_without_a_cuda_gpu_is_one_line(monkeypatch):
    """Issue 42 point 13: `check --gpu` with a CPU-only PyTorch says so (no AssertionError)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = CliRunner().invoke(cli, ["check", "--gpu"])
    assert result.exit_code == 1 and "needs a CUDA GPU" in result.output, result.output


def test_gpu_mode_finds_a_shape_for_every_shipped_record():
    # A record of a class with no BENCHMARKS.md id (1 x 8192 with 64 heads, or an FP8 cache's
    # class) is timed on a shape of its class, not reported as untimeable.
    from mlagen import db, families
    from mlagen import spec as spec_mod

    for r in db.shipped_records():
        family = families.get(spec_mod.load(r.key.spec).family)
        shapes = family.check_shapes(r.key.problem)
        assert shapes and all(family.problem_covers(r.key.problem, s) for s in shapes), r.key   # an old sparse key: any pool
    dense = families.get("mla_prefill")
    [h64] = dense.check_shapes("causal/h64/q8192/k8192")
    assert (h64.q_lens, h64.heads, h64.causal) == ((8192,), 64, True)
    assert [s.id for s in dense.check_shapes("none/h16/q8192/k8192")] == ["D3"]
