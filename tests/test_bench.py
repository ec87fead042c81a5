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


def test_shape_table_matches_benchmarks_md():
    s = bench.SHAPES
    assert list(s) == ["D1", "D2", "D3", "D4", "D5"]
    expect = {  # id: (batch, q_lens, k_lens, heads, causal)
        "D1": (1, (8192,), (8192,), 128, True),
        "D2": (4, (4096,) * 4, (4096,) * 4, 16, True),
        "D3": (2, (8192,) * 2, (8192,) * 2, 16, False),
        "D4": (16, D4_LENGTHS, D4_LENGTHS, 128, True),
        "D5": (1, (2048,), (16384,), 128, True),
    }
    for sid, (batch, q_lens, k_lens, heads, causal) in expect.items():
        shape = s[sid]
        assert (shape.id, shape.batch, shape.q_lens, shape.k_lens, shape.heads, shape.causal) == \
            (sid, batch, q_lens, k_lens, heads, causal)


def test_d4_lengths_are_seed0_uniform_draws():
    d4 = bench.SHAPES["D4"]
    rng = random.Random(0)
    assert d4.q_lens == tuple(rng.randint(128, 4096) for _ in range(16))
    assert d4.q_lens == bench.ragged_lengths(16, 128, 4096, seed=0)
    assert len(d4.q_lens) == 16 and all(128 <= n <= 4096 for n in d4.q_lens)
    assert d4.packed and not d4.uniform


def test_d5_is_a_chunk_after_a_cached_prefix():
    d5 = bench.SHAPES["D5"]
    assert d5.k_lens[0] - d5.q_lens[0] == 14336
    assert not d5.packed and d5.uniform
    assert "14336 cached" in d5.description


def test_flops():
    s = bench.SHAPES
    assert s["D1"].flops() == 2 * 128 * 320 * 8192 * 8193 // 2
    assert s["D3"].flops() == 2 * 16 * 320 * 2 * 8192 * 8192
    assert s["D5"].flops() == 2 * 128 * 320 * (2048 * 14336 + 2048 * 2049 // 2)
    assert s["D4"].flops() == sum(2 * 128 * 320 * n * (n + 1) // 2 for n in D4_LENGTHS)


def test_cu_seqlens_and_sequence_lengths():
    shape = bench.Shape("T", (3, 5), (4, 7), 2, True)
    assert shape.cu_seqlens() == ([0, 3, 8], [0, 4, 11])
    assert shape.sequence_lengths() == [(0, 3, 0, 4), (3, 5, 4, 7)]


def test_shape_rejects_mismatched_lengths():
    with pytest.raises(BenchError, match="same sequences"):
        bench.Shape("T", (3, 5), (4,), 2, True)


def test_parse_shapes():
    assert [s.id for s in bench.parse_shapes("D1,D3")] == ["D1", "D3"]
    assert [s.id for s in bench.parse_shapes(" d2 , D2,D5")] == ["D2", "D5"]
    assert [s.id for s in bench.parse_shapes(["D4"])] == ["D4"]
    assert len(bench.parse_shapes("all")) == 5


def test_parse_shapes_names_the_bad_ids():
    with pytest.raises(BenchError) as info:
        bench.parse_shapes("D1,D9,S1")
    assert "'D9'" in str(info.value) and "'S1'" in str(info.value) and "D1, D2" in str(info.value)
    assert isinstance(info.value, MlagenError)
    with pytest.raises(BenchError, match="no shape"):
        bench.parse_shapes(" , ")


def test_parse_peers():
    assert bench.parse_peers("mlagen,cudnn,fa2") == ["mlagen", "cudnn", "fa2"]
    assert bench.parse_peers(("CUDNN", "cudnn")) == ["cudnn"]
    with pytest.raises(BenchError, match="'flashinfer'"):
        bench.parse_peers("mlagen,flashinfer")


# --- statistics and interleaving --------------------------------------------------------------


def test_percentile_and_median_on_known_data():
    data = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert bench.median(data) == 3.0
    assert bench.percentile(data, 20) == pytest.approx(1.8)
    assert bench.percentile(data, 80) == pytest.approx(4.2)
    assert bench.percentile(data, 0) == 1.0 and bench.percentile(data, 100) == 5.0
    assert bench.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert bench.median([7.0]) == 7.0
    with pytest.raises(ValueError):
        bench.median([])


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    rng = random.Random(1)
    data = [rng.random() for _ in range(57)]
    for pct in (0, 13, 20, 50, 80, 99, 100):
        assert bench.percentile(data, pct) == pytest.approx(float(np.percentile(data, pct)))


def test_timing_statistics():
    t = bench.Timing([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [10.0, 10.0, 11.0]])
    assert t.block_medians == [2.0, 4.0, 10.0]
    assert t.median == 4.0
    assert t.spread == (2.0, 10.0)
    assert t.p20 == pytest.approx(bench.percentile(t.samples, 20))
    assert t.p80 == pytest.approx(bench.percentile(t.samples, 80))
    assert len(t.samples) == 9


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


def test_make_inputs_shapes_and_values():
    shape = TINY["ragged_prefix"]
    x = bench.make_inputs(shape, "cpu", seed=3)
    assert tuple(x["q"].shape) == (7, 2, 192) and x["q"].dtype == torch.bfloat16
    assert tuple(x["k"].shape) == (14, 2, 128) and tuple(x["k_rope"].shape) == (14, 1, 64)
    assert tuple(x["v"].shape) == (14, 2, 128)
    assert x["cu_seqlens_q"].tolist() == [0, 5, 7] and x["cu_seqlens_k"].tolist() == [0, 8, 14]
    assert x["cu_seqlens_q"].dtype == torch.int32
    assert all(float(x[n].float().std()) > 0.5 for n in ("q", "k", "k_rope", "v"))
    again = bench.make_inputs(shape, "cpu", seed=3)
    assert torch.equal(x["q"], again["q"])
    single = bench.make_inputs(TINY["prefix"], "cpu")
    assert single["cu_seqlens_q"] is None and single["cu_seqlens_k"] is None


@pytest.mark.parametrize("name", sorted(TINY))
def test_reference_heads_chunked_equals_whole(name):
    shape = TINY[name]
    x = bench.make_inputs(shape, "cpu", seed=1)
    out, lse = bench.reference_heads(shape, x, heads=2, budget_bytes=6 * 4 * 2 * max(shape.k_lens) * 2)  # 2 rows
    from mlagen.families.mla_prefill import reference

    want_out, want_lse = reference(x["q"][:, :2], x["k"][:, :2], x["v"][:, :2], k_rope=x["k_rope"],
                                   cu_seqlens_q=x["cu_seqlens_q"], cu_seqlens_k=x["cu_seqlens_k"],
                                   causal=shape.causal, dtype=torch.float32)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)


def _ref_as_bf16(shape, x):
    out, lse = bench.reference_heads(shape, x, heads=shape.heads)
    return out.to(torch.bfloat16), lse


def test_compare_accepts_the_reference_and_rejects_wrong_outputs():
    shape = TINY["ragged"]   # 3 heads: one outside the CHECK_HEADS compared with the reference
    x = bench.make_inputs(shape, "cpu")
    ref = bench.reference_heads(shape, x)
    out, lse = _ref_as_bf16(shape, x)
    check = bench.compare(out, lse, *ref)
    assert check.ok and check.rel_l2 < 5e-3 and check.lse_max_abs < 1e-5

    poisoned = out.clone()
    poisoned[3, 1, 7] = math.nan
    assert "1 of" in bench.compare(poisoned, lse, *ref).problem

    uncovered = out.clone()
    uncovered[:, 2] = math.nan   # a head outside the compared ones, never written
    assert "NaN or inf" in bench.compare(uncovered, lse, *ref).problem

    nan_lse = lse.clone()
    nan_lse[1, 2] = math.nan
    assert "lse values are NaN" in bench.compare(out, nan_lse, *ref).problem

    bad_lse = lse.clone()
    bad_lse[0, 0] += 1.0
    assert "lse error" in bench.compare(out, bad_lse, *ref).problem

    shuffled = out[torch.randperm(out.shape[0])]
    assert "relative L2 error" in bench.compare(shuffled, None, *ref).problem


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


def test_compare_rows_that_see_no_key():
    shape = bench.Shape("E", (4,), (2,), 2, True)   # causal, Lk < Lq: rows 0 and 1 see nothing
    x = bench.make_inputs(shape, "cpu")
    ref = bench.reference_heads(shape, x)
    out, lse = _ref_as_bf16(shape, x)
    assert torch.isinf(lse[:2]).all() and bench.compare(out, lse, *ref).ok
    finite_lse = lse.clone()
    finite_lse[0] = 0.0
    assert "+inf" in bench.compare(out, finite_lse, *ref).problem


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
