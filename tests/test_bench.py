"""GPU-free tests of mlagen.bench: the shape table, statistics, interleaving, reports, and the
correctness plumbing (reference slicing, SDPA layouts and masks) run on the CPU."""

from __future__ import annotations

import json
import math
import random

import pytest

from mlagen import bench
from mlagen.errors import BenchError, MlagenError

D4_LENGTHS = (3586, 1705, 3232, 3774, 1850, 293, 1188, 4082, 2222, 2118, 1786, 3889, 3338, 3527, 1370, 4092)


# --- shapes ---------------------------------------------------------------------------------


def test_parse_peers():
    assert bench.parse_peers("mlagen,cudnn,fa2") == ["mlagen", "cudnn", "fa2"]
    assert bench.parse_peers("fa3,mlagen-check,mlagen:mla_prefill_sm80") == ["fa3", "mlagen-check",
                                                                              "mlagen:mla_prefill_sm80"]
    assert bench.is_ours("mlagen-check") and not bench.is_ours("fa3")
    assert bench.parse_peers(("CUDNN", "cudnn")) == ["cudnn"]
    with pytest.raises(BenchError, match="'flashinfer'"):
        bench.parse_peers("mlagen,flashinfer")


def _fake_fa3(root, built: bool):
    (root / "fa3").mkdir(parents=True)
    (root / "fa3" / "fa3_peer.py").write_text("def load(): pass\n")
    if built:
        (root / "fa3" / "build").mkdir()
        (root / "fa3" / "build" / "fa3_peer_C.so").write_bytes(b"")


def test_fa3_is_a_default_peer_only_when_built(tmp_path, monkeypatch):
    monkeypatch.delenv("FA3_PEER_SO", raising=False)
    monkeypatch.delenv("FA3_PEER_BUILD", raising=False)
    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path / "none"))
    logs = []
    assert bench.default_peers(logs.append) == ["cudnn", "mlagen"]
    assert len(logs) == 1 and logs[0].startswith("fa3 skipped: ") and "fa3_peer.py not found" in logs[0]

    _fake_fa3(tmp_path / "unbuilt", built=False)
    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path / "unbuilt"))
    path, why = bench.fa3_status()
    assert path is None and "not built" in why and "run_remote.sh" in why
    with pytest.raises(BenchError, match="not built"):
        bench.fa3_peer(bench.SHAPES["D1"], {})   # asked for explicitly: n/a with the reason

    _fake_fa3(tmp_path / "built", built=True)
    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path / "built"))
    logs = []
    assert bench.default_peers(logs.append) == ["fa3", "cudnn", "mlagen"] and logs == []


def test_fa3_is_the_first_column():
    d1 = bench.SHAPES["D1"]
    r = bench.Result(d1, {"cudnn": bench.PeerResult("cudnn"), "mlagen": bench.PeerResult("mlagen"),
                          "fa3": bench.PeerResult("fa3")}, iters=1, rounds=1)
    assert bench._peer_order([r]) == ["fa3", "cudnn", "mlagen"]
    header = next(line for line in bench.format_table([r], {}).splitlines() if line.startswith("| shape"))
    assert header.index("fa3 TFLOP/s") < header.index("cudnn TFLOP/s") < header.index("mlagen TFLOP/s")
    assert "mlagen / fa3" in header


# --- statistics and interleaving --------------------------------------------------------------


def test_interleaving_puts_ours_after_each_peer():
    order = bench.interleaving(["mlagen", "cudnn", "fa2"], 2)
    assert order == [(0, "cudnn"), (0, "mlagen"), (0, "fa2"), (0, "mlagen"),
                     (1, "cudnn"), (1, "mlagen"), (1, "fa2"), (1, "mlagen")]
    assert bench.interleaving(["cudnn", "mlagen"], 1) == [(0, "cudnn"), (0, "mlagen")]
    assert bench.interleaving(["cudnn", "fa2"], 2) == [(0, "cudnn"), (0, "fa2"), (1, "cudnn"), (1, "fa2")]
    assert bench.interleaving(["mlagen"], 3) == [(0, "mlagen"), (1, "mlagen"), (2, "mlagen")]
    assert bench.interleaving([], 3) == []


# --- reports --------------------------------------------------------------------------------


def _timed(shape, tflops, iters=5, rounds=2):
    seconds = shape.flops() / (tflops * 1e12)
    return bench.Timing([[seconds] * iters for _ in range(rounds)])


def _fake_results():
    d1, d5 = bench.SHAPES["D1"], bench.SHAPES["D5"]
    good = bench.Check(3.9e-3, 2.1e-3, 1.5e-5)
    r1 = bench.Result(d1, {
        "mlagen": bench.PeerResult("mlagen", _timed(d1, 500.0), good, note="shared k_rope [Tk, 1, 64]"),
        "cudnn": bench.PeerResult("cudnn", _timed(d1, 550.0), bench.Check(4e-3, 2e-3, None)),
        "fa2": bench.PeerResult("fa2", error="RuntimeError: No available kernel | aborting"),
    }, iters=5, rounds=2, telemetry="SM clock 1500 MHz (max 1980 MHz), power 690 W of 700 W")
    wrong = bench.Check(0.9, 0.5, 0.1, problem="relative L2 error 5.00e-01 > 2e-02")
    r5 = bench.Result(d5, {
        "mlagen": bench.PeerResult("mlagen", None, wrong, error="WRONG: relative L2 error 5.00e-01 > 2e-02"),
        "cudnn": bench.PeerResult("cudnn", error="RuntimeError: " + "x" * 200),
        "fa2": bench.PeerResult("fa2", _timed(d5, 250.0), bench.Check(4e-3, 2e-3, None), note="V zero-padded to 192"),
    }, iters=5, rounds=2)
    return [r1, r5]


def _table_rows(text):
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in rows]


def test_format_table_renders_tflops_ratios_and_na():
    env = {"device": "NVIDIA H100 80GB HBM3, 132 SMs", "torch": "2.13"}
    text = bench.format_table(_fake_results(), env)
    assert "- device: NVIDIA H100 80GB HBM3, 132 SMs" in text
    header, d1, d5 = _table_rows(text)
    assert header == ["shape", "description", "mlagen TFLOP/s", "cudnn TFLOP/s", "fa2 TFLOP/s",
                      "mlagen / cudnn", "mlagen / fa2", "mlagen error"]
    assert d1[0] == "D1" and d1[1] == "1 × 8192, H 128, causal"
    assert d1[2].startswith("500.0 [500.0–500.0], rounds 500.0–500.0")
    assert d1[3].startswith("550.0 ")
    assert d1[4] == "n/a (RuntimeError: No available kernel \\| aborting)"
    assert d1[5] == f"{500 / 550:.2f}×" and d1[6] == "—"
    assert d1[7] == "max abs 3.9e-03, rel L2 2.1e-03, lse 1.5e-05"
    assert d5[2].startswith("WRONG (relative L2 error")
    assert d5[3].startswith("n/a (RuntimeError: xxx") and d5[3].endswith("…") and len(d5[3]) == bench.CELL_LIMIT
    assert d5[4].startswith("250.0 ")
    assert d5[5] == "—" and d5[6] == "—"
    assert d5[7].startswith("WRONG: relative L2 error")
    assert "- D5 cudnn: RuntimeError: " + "x" * 200 in text   # the full reason goes to the notes
    assert "- D5 fa2: V zero-padded to 192" in text
    assert "- D1 GPU right after timing: SM clock 1500 MHz" in text


def test_format_table_shows_spread_between_rounds():
    d2 = bench.SHAPES["D2"]
    fast, slow = d2.flops() / 600e12, d2.flops() / 400e12
    r = bench.Result(d2, {"mlagen": bench.PeerResult("mlagen", bench.Timing([[fast] * 3, [slow] * 3, [fast] * 3]))},
                     iters=3, rounds=3)
    cell = _table_rows(bench.format_table([r], {}))[1][2]
    assert cell == "600.0 [400.0–600.0], rounds 400.0–600.0"


def test_result_ratio_and_tflops():
    r1 = _fake_results()[0]
    assert r1.tflops("mlagen") == pytest.approx(500.0)
    assert r1.ratio("mlagen", "cudnn") == pytest.approx(500 / 550)
    assert r1.ratio("mlagen", "fa2") is None
    assert r1.tflops("nobody") is None


def test_results_to_json_and_write_markdown(tmp_path):
    results = _fake_results()
    doc = json.loads(bench.results_to_json(results, {"torch": "2.13"}))
    assert doc["environment"] == {"torch": "2.13"}
    d1 = doc["results"][0]
    assert d1["shape"] == "D1" and d1["flops"] == bench.SHAPES["D1"].flops()
    assert d1["peers"]["mlagen"]["timing"]["tflops"] == pytest.approx(500.0)
    assert d1["peers"]["fa2"]["timing"] is None and d1["peers"]["fa2"]["error"].startswith("RuntimeError")
    assert d1["ratios"]["mlagen/cudnn"] == pytest.approx(500 / 550) and d1["ratios"]["mlagen/fa2"] is None
    assert doc["results"][1]["peers"]["mlagen"]["check"]["problem"].startswith("relative L2")
    path = tmp_path / "sub" / "bench.md"
    bench.write_markdown(path, results, {"torch": "2.13"})
    assert path.read_text() == bench.format_table(results, {"torch": "2.13"})


# --- correctness plumbing, on the CPU ----------------------------------------------------------

torch = pytest.importorskip("torch")

TINY = {
    "ragged": bench.Shape("R", (5, 9, 3), (5, 9, 3), 3, True),
    "prefix": bench.Shape("P", (6,), (11,), 3, True),
    "prefix_batch": bench.Shape("B", (4, 4), (7, 7), 2, True),
    "ragged_prefix": bench.Shape("RP", (5, 2), (8, 6), 2, True),
    "no_mask": bench.Shape("N", (6, 9), (7, 5), 2, False),
}


@pytest.mark.parametrize("lower_right", ["dense", "bias"])
@pytest.mark.parametrize("name", sorted(TINY))
def test_sdpa_peer_layouts_and_masks_on_cpu(name, lower_right):
    """The SDPA peers' layout, padding, per-sequence split and bottom-right masks, through the
    math backend: they must compute what MLA.md says."""
    from torch.nn.attention import SDPBackend

    shape = TINY[name]
    x = bench.make_inputs(shape, "cpu", seed=2)
    peer = bench.sdpa_peer(shape, x, name="math", backend=SDPBackend.MATH, pad_v=True, lower_right=lower_right)
    out, lse = peer.checked_call()
    assert lse is None and tuple(out.shape) == (shape.total_q, shape.heads, 128)
    check = bench.compare(out, None, *bench.reference_heads(shape, x))
    assert check.ok, check.problem
    assert ("per-sequence calls" in peer.note) == (not shape.uniform)
    assert "V zero-padded" in peer.note


def test_dense_lower_right_mask():
    mask = bench._sdpa_mask(2, 4, True, "dense", "cpu")["attn_mask"]
    assert tuple(mask.shape) == (1, 1, 2, 4)
    assert torch.isinf(mask[0, 0]).tolist() == [[False, False, False, True], [False, False, False, False]]
    assert bench._sdpa_mask(4, 4, True, "dense", "cpu") == {"is_causal": True}
    assert bench._sdpa_mask(2, 4, False, "dense", "cpu") == {}


def test_bench_shape_turns_peer_failures_into_results(monkeypatch):
    """The orchestration on the CPU: GPU timing replaced by a fake clock, peers by math SDPA."""
    from torch.nn.attention import SDPBackend

    def math_peer(name):
        return lambda shape, x: bench.sdpa_peer(shape, x, name=name, backend=SDPBackend.MATH, pad_v=False,
                                                lower_right="dense")

    def raising_peer(shape, x):
        import warnings

        warnings.warn("Flash attention kernel not used because:\n  head dims differ")
        raise RuntimeError("No available kernel.\nsecond line")

    def wrong_peer(shape, x):
        peer = math_peer("wrong")(shape, x)
        return bench.Peer("wrong", peer.fn, lambda: (peer.checked_call()[0] * 2, None))

    def breaks_when_timed(shape, x):
        peer = math_peer("flaky")(shape, x)
        peer.fn = lambda: None
        return peer

    calls = []

    def fake_time_calls(fn, iters, flush):
        calls.append(fn)
        if fn() is None:
            raise RuntimeError("illegal memory access")
        return [1e-3 * (1 + len(calls) % 3)] * iters

    monkeypatch.setattr(bench, "time_calls", fake_time_calls)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "gpu_telemetry", lambda device=None: {})
    monkeypatch.setattr(bench, "PEERS", {"mlagen": math_peer("mlagen"), "cudnn": math_peer("cudnn"),
                                         "fa2": raising_peer, "wrong": wrong_peer, "flaky": breaks_when_timed})
    logs = []
    shape = TINY["ragged_prefix"]
    result = bench._bench_shape(shape, ["mlagen", "cudnn", "fa2", "wrong", "flaky"], iters=4, rounds=2, warmup=1,
                                seed=0, device="cpu", flush=lambda: None, log=logs.append)
    p = result.peers
    assert list(p) == ["mlagen", "cudnn", "fa2", "wrong", "flaky"]
    assert len(p["mlagen"].timing.blocks) == 4 and len(p["cudnn"].timing.blocks) == 2   # ours after each peer
    assert all(len(b) == 4 for b in p["mlagen"].timing.blocks)
    assert p["mlagen"].check.ok and "per-sequence calls" in p["cudnn"].note
    assert p["fa2"].timing is None
    assert p["fa2"].error == "RuntimeError: No available kernel.; Flash attention kernel not used because: head dims differ"
    assert p["wrong"].wrong and p["wrong"].error.startswith("WRONG: relative L2 error")
    assert p["flaky"].timing is None and p["flaky"].error == "RuntimeError: illegal memory access"
    assert any("round 2/2 cudnn" in line for line in logs) and any("fa2: n/a" in line for line in logs)
    table = bench.format_table([result], {})
    assert "n/a (RuntimeError: No available kernel.; Flash attention" in table and "WRONG (relative L2 error" in table


def test_environment_without_a_gpu():
    env = bench.environment()
    assert env["torch"] == torch.__version__ and env["date"].endswith("+00:00")
    assert {"cudnn", "nvrtc", "mlagen", "device"} <= set(env)


def test_gpu_telemetry_picks_the_device_by_uuid(monkeypatch):
    import subprocess

    text = ("GPU-aaaa, 580.65, 1980 MHz, 1980 MHz, 71.2 W, 700.00 W\n"
            "GPU-bbbb, 580.65, 1530 MHz, 1980 MHz, 690.1 W, 700.00 W\n")
    monkeypatch.setattr(bench.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=text, stderr=""))
    monkeypatch.setattr(bench, "_torch_uuid", lambda device: "bbbb")
    t = bench.gpu_telemetry(1)
    assert t["clocks.sm"] == "1530 MHz" and t["driver_version"] == "580.65"
    assert bench._telemetry_text(t) == "SM clock 1530 MHz (max 1980 MHz), power 690.1 W of 700.00 W"
    monkeypatch.setattr(bench, "_torch_uuid", lambda device: "cccc")
    assert bench.gpu_telemetry(1) == {}   # two GPUs, none of them ours: say nothing rather than guess

    def missing(*a, **k):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(bench.subprocess, "run", missing)
    assert bench.gpu_telemetry() == {} and bench._telemetry_text({}) is None
