"""GPU-free tests of mlagen.bench and the families' peers: shapes of every family, peer names and
availability, interleaving, reports of fake timings, and the peers' correctness plumbing (dense
SDPA layouts and masks, the sparse naive peer, FlashMLA's padding) run on the CPU."""

from __future__ import annotations

import json

import pytest

from mlagen import bench, families
from mlagen.errors import BenchError, MlagenError, ShapeError
from mlagen.families.base import Peer, Prepared
from mlagen.families.mla_prefill.problem import SHAPES as D_SHAPES
from mlagen.families.mla_prefill.reference import Check as DenseCheck
from mlagen.families.mla_sparse_prefill.problem import SHAPES as S_SHAPES
from mlagen.families.kit import Check as SparseCheck

DENSE = families.get("mla_prefill")
SPARSE = families.get("mla_sparse_prefill")


# --- shapes ---------------------------------------------------------------------------------


def _ids(items):
    return [(fam.name, shape.id) for fam, shape in items]


def test_ids_resolve_to_their_family():
    assert _ids(bench.resolve_shapes("D1")) == [("mla_prefill", "D1")]
    assert _ids(bench.resolve_shapes("s1")) == [("mla_sparse_prefill", "S1")]
    assert _ids(bench.resolve_shapes(["S5", "D2,S6", "D2"])) == [
        ("mla_sparse_prefill", "S5"), ("mla_prefill", "D2"), ("mla_sparse_prefill", "S6")]
    fam, shape = bench.resolve_shapes("sq=4096,h=16,topk=1024,skv=8192")[0]
    assert fam is SPARSE and (shape.heads, shape.topk, shape.s_kv) == (16, 1024, 8192)
    fam, shape = bench.resolve_shapes("b=2,q=512,h=16,causal")[0]
    assert fam is DENSE and shape.q_lens == (512, 512)
    assert _ids(bench.resolve_shapes("mla_sparse_prefill")) == [("mla_sparse_prefill", s) for s in S_SHAPES]
    everything = _ids(bench.resolve_shapes("all"))
    assert everything == [("mla_prefill", d) for d in D_SHAPES] + [("mla_sparse_prefill", s) for s in S_SHAPES]


def test_shape_objects_find_their_family():
    assert bench.resolve_shapes([S_SHAPES["S4"], D_SHAPES["D3"]]) == [(SPARSE, S_SHAPES["S4"]),
                                                                      (DENSE, D_SHAPES["D3"])]


def test_unknown_shape_names_every_family_and_the_sparse_ids():
    with pytest.raises(ShapeError) as info:
        bench.resolve_shapes("S9")
    text = str(info.value)
    assert "D1" in text and "S1, S2" in text and "(mla_prefill)" in text and "(mla_sparse_prefill)" in text
    assert isinstance(info.value, ValueError) and isinstance(info.value, MlagenError)
    with pytest.raises(ShapeError, match="topk <= skv"):
        bench.resolve_shapes("sq=4,h=16,topk=64,skv=32")
    with pytest.raises(ShapeError, match="no shape given"):
        bench.resolve_shapes(" , ")


# --- peers ----------------------------------------------------------------------------------


def test_each_family_declares_its_peers_in_column_order():
    assert list(DENSE.peers()) == ["fa3", "cudnn", "fa2", "mlagen", "mlagen-check"]
    assert list(SPARSE.peers()) == ["flashmla", "naive", "mlagen", "flashmla-concat", "mlagen-onepool"]
    assert [n for n, p in DENSE.peers().items() if p.ours] == ["mlagen", "mlagen-check"]
    assert [n for n, p in SPARSE.peers().items() if p.lead] == ["flashmla"]
    assert SPARSE.tolerance == 1e-2 and DENSE.tolerance == 2e-2


def test_parse_peers():
    assert bench.parse_peers("mlagen,cudnn,fa2", [DENSE]) == ["mlagen", "cudnn", "fa2"]
    assert bench.parse_peers("fa3,mlagen-check,mlagen:mla_prefill_sm80", [DENSE]) == [
        "fa3", "mlagen-check", "mlagen:mla_prefill_sm80"]
    assert bench.parse_peers(("CUDNN", "cudnn"), [DENSE]) == ["cudnn"]
    assert bench.parse_peers("flashmla,naive,mlagen:mla_sparse_prefill_sm80", [SPARSE]) == [
        "flashmla", "naive", "mlagen:mla_sparse_prefill_sm80"]
    assert bench.parse_peers("fa3,flashmla,mlagen") == ["fa3", "flashmla", "mlagen"]   # any family's
    with pytest.raises(BenchError, match="'flashinfer'"):
        bench.parse_peers("mlagen,flashinfer", [DENSE])
    with pytest.raises(BenchError, match=r"'fa3'; choose from flashmla, naive, mlagen, flashmla-concat, mlagen-onepool, mlagen:<spec\|symbol>, "
                                          r"mlagen-onepool:<spec\|symbol> \(mla_sparse_prefill\)"):
        bench.parse_peers("fa3", [SPARSE])
    with pytest.raises(BenchError, match="'naive:x'"):
        bench.parse_peers("naive:x", [SPARSE])    # naive takes no argument
    assert bench.lookup_peer(SPARSE, "mlagen:mla_sparse_prefill_sm80")[1] == "mla_sparse_prefill_sm80"
    assert bench.lookup_peer(DENSE, "flashmla") is None


def _fake_build(root, folder, wrapper, library, built: bool):
    (root / folder).mkdir(parents=True)
    (root / folder / f"{wrapper}.py").write_text("def load(): pass\n")
    if built:
        (root / folder / "build").mkdir()
        (root / folder / "build" / library).write_bytes(b"")


@pytest.fixture
def no_wrapper_env(monkeypatch, tmp_path):
    for var in ("FA3_PEER_SO", "FA3_PEER_BUILD", "FLASHMLA_PEER_SO", "FLASHMLA_PEER_BUILD", "FA3_EXTRA_SO"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FA3_EXTRA_BUILD", str(tmp_path / "no-fa3-extra"))   # not <repo>/out/fa3_extra, if built


def test_fa3_is_a_default_peer_only_when_built(tmp_path, monkeypatch, no_wrapper_env):
    from mlagen.families.mla_prefill.peers import FA3

    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path / "none"))
    logs = []
    assert bench.default_peers(DENSE, logs.append) == ["cudnn", "mlagen"]
    assert len(logs) == 1 and logs[0].startswith("fa3 skipped: ") and "fa3_peer.py not found" in logs[0]

    _fake_build(tmp_path / "unbuilt", "fa3", "fa3_peer", "fa3_peer_C.so", built=False)
    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path / "unbuilt"))
    why = DENSE.peers()["fa3"].status()
    assert "not built" in why and "run_remote.sh" in why and str(tmp_path / "unbuilt" / "fa3" / "build") in why
    with pytest.raises(BenchError, match="not built"):
        DENSE.peers()["fa3"].prepare(D_SHAPES["D1"], {}, None)   # asked for anyway: the same reason

    _fake_build(tmp_path / "built", "fa3", "fa3_peer", "fa3_peer_C.so", built=True)
    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path / "built"))
    logs = []
    assert bench.default_peers(DENSE, logs.append) == ["fa3", "cudnn", "mlagen"] and logs == []
    assert FA3.status()[0] == str(tmp_path / "built" / "fa3" / "fa3_peer.py")


def test_flashmla_is_found_like_fa3(tmp_path, monkeypatch, no_wrapper_env):
    from mlagen.families.mla_sparse_prefill.peers import FLASHMLA

    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path))
    logs = []
    assert bench.default_peers(SPARSE, logs.append) == ["naive", "mlagen"]
    assert logs == [f"flashmla skipped: {tmp_path / 'flashmla' / 'flashmla_sparse_peer.py'} not found"]

    _fake_build(tmp_path, "flashmla", "flashmla_sparse_peer", "flashmla_sparse_sm90_C.so", built=False)
    why = SPARSE.peers()["flashmla"].status()
    assert why.startswith("FlashMLA is not built (") and "flashmla/run_remote.sh" in why
    # The wrapper's own variables move the library, as they do for the wrapper.
    elsewhere = tmp_path / "elsewhere" / "lib.so"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"")
    monkeypatch.setenv("FLASHMLA_PEER_SO", str(elsewhere))
    assert SPARSE.peers()["flashmla"].status() is None
    assert bench.default_peers(SPARSE) == ["flashmla", "naive", "mlagen"]
    monkeypatch.delenv("FLASHMLA_PEER_SO")
    monkeypatch.setenv("FLASHMLA_PEER_BUILD", str(tmp_path / "elsewhere"))
    assert "elsewhere/flashmla_sparse_sm90_C.so not found" in FLASHMLA.why_not()


def test_format_peer_list_says_why_a_peer_cannot_run(tmp_path, monkeypatch, no_wrapper_env):
    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path))
    text = bench.format_peer_list()
    assert "mla_sparse_prefill (shapes S1, S2, S3, S4, S5, S6, V1, V2, V3, V4, V5, M1, M2, M3, M4, M5, M6, M7, M8):" in text
    line = next(x for x in text.splitlines() if x.strip().startswith("flashmla"))
    assert "[default, first column]" in line and "unavailable: " in line and "not found" in line
    assert any(x.strip().startswith("mlagen[:<spec|symbol>]") and "[ours, default]" in x for x in text.splitlines())


# --- statistics and interleaving --------------------------------------------------------------


def test_interleaving_puts_ours_after_each_peer():
    ours = {"mlagen", "mlagen:x"}
    order = bench.interleaving(["mlagen", "cudnn", "fa2"], 2, ours)
    assert order == [(0, "cudnn"), (0, "mlagen"), (0, "fa2"), (0, "mlagen"),
                     (1, "cudnn"), (1, "mlagen"), (1, "fa2"), (1, "mlagen")]
    assert bench.interleaving(["flashmla", "mlagen", "mlagen:x"], 1, ours) == [
        (0, "flashmla"), (0, "mlagen"), (0, "mlagen:x")]
    # Several of ours: their order alternates between rounds, so no peer always follows the same one.
    assert bench.interleaving(["fa3", "cudnn", "mlagen", "mlagen:x"], 2, ours) == [
        (0, "fa3"), (0, "mlagen"), (0, "mlagen:x"), (0, "cudnn"), (0, "mlagen"), (0, "mlagen:x"),
        (1, "fa3"), (1, "mlagen:x"), (1, "mlagen"), (1, "cudnn"), (1, "mlagen:x"), (1, "mlagen")]
    assert bench.interleaving(["cudnn", "fa2"], 2, ours) == [(0, "cudnn"), (0, "fa2"), (1, "cudnn"), (1, "fa2")]
    assert bench.interleaving(["mlagen"], 3, ours) == [(0, "mlagen"), (1, "mlagen"), (2, "mlagen")]
    assert bench.interleaving([], 3, ours) == []


# --- reports --------------------------------------------------------------------------------


def _timed(fam, shape, tflops, iters=5, rounds=2):
    seconds = fam.flops(shape) / (tflops * 1e12)
    return bench.Timing([[seconds] * iters for _ in range(rounds)])


def _peer(fam, name, **kw):
    p = fam.peers()[name.split(":")[0]]
    return bench.PeerResult(name, ours=p.ours, lead=p.lead, **kw)


def _fake_results():
    d1, d5 = D_SHAPES["D1"], D_SHAPES["D5"]
    good = DenseCheck(3.9e-3, 2.1e-3, 1.5e-5)
    r1 = bench.Result(DENSE, d1, {
        "mlagen": _peer(DENSE, "mlagen", timing=_timed(DENSE, d1, 500.0), check=good,
                        note="shared k_rope [Tk, 1, 64]"),
        "cudnn": _peer(DENSE, "cudnn", timing=_timed(DENSE, d1, 550.0), check=DenseCheck(4e-3, 2e-3, None)),
        "fa2": _peer(DENSE, "fa2", error="RuntimeError: No available kernel | aborting"),
    }, iters=5, rounds=2, telemetry="SM clock 1500 MHz (max 1980 MHz), power 690 W of 700 W")
    wrong = DenseCheck(0.9, 0.5, 0.1, problem="relative L2 error 5.00e-01 > 2e-02")
    r5 = bench.Result(DENSE, d5, {
        "mlagen": _peer(DENSE, "mlagen", check=wrong, error="WRONG: relative L2 error 5.00e-01 > 2e-02"),
        "cudnn": _peer(DENSE, "cudnn", error="RuntimeError: " + "x" * 200),
        "fa2": _peer(DENSE, "fa2", timing=_timed(DENSE, d5, 250.0), check=DenseCheck(4e-3, 2e-3, None),
                     note="V zero-padded to 192"),
    }, iters=5, rounds=2)
    return [r1, r5]


def _sparse_results():
    s1, s5 = S_SHAPES["S1"], S_SHAPES["S5"]
    good = SparseCheck(2e-3, 7.8e-6, 9.5e-7)
    pad = "q zero-padded to 64 heads (from 16) once, before timing"
    rows = []
    for shape, ours, theirs, note in ((s1, 600.0, 604.0, ""), (s5, 138.0, 142.0, pad)):
        rows.append(bench.Result(SPARSE, shape, {
            "flashmla": _peer(SPARSE, "flashmla", timing=_timed(SPARSE, shape, theirs), check=good, note=note),
            "naive": _peer(SPARSE, "naive", timing=_timed(SPARSE, shape, 60.0), check=good),
            "mlagen": _peer(SPARSE, "mlagen", timing=_timed(SPARSE, shape, ours), check=good),
        }, iters=5, rounds=2))
    return rows


def _table_rows(text):
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in rows]


def test_format_table_renders_tflops_ratios_and_na():
    env = {"device": "NVIDIA H100 80GB HBM3, 132 SMs", "torch": "2.13"}
    text = bench.format_table(_fake_results(), env)
    assert "- device: NVIDIA H100 80GB HBM3, 132 SMs" in text
    assert "##" not in text   # one family: one table, no family heading
    assert "WRONG above a relative L2 error of 0.02 or on any NaN" in text
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


def test_the_lead_peer_is_the_first_column():
    d1 = D_SHAPES["D1"]
    r = bench.Result(DENSE, d1, {"cudnn": _peer(DENSE, "cudnn"), "mlagen": _peer(DENSE, "mlagen"),
                                 "fa3": _peer(DENSE, "fa3")}, iters=1, rounds=1)
    assert bench._peer_order([r]) == ["fa3", "cudnn", "mlagen"]
    header = next(line for line in bench.format_table([r], {}).splitlines() if line.startswith("| shape"))
    assert header.index("fa3 TFLOP/s") < header.index("cudnn TFLOP/s") < header.index("mlagen TFLOP/s")
    assert "mlagen / fa3" in header
    s1 = S_SHAPES["S1"]
    r = bench.Result(SPARSE, s1, {"naive": _peer(SPARSE, "naive"), "mlagen": _peer(SPARSE, "mlagen"),
                                  "flashmla": _peer(SPARSE, "flashmla")}, iters=1, rounds=1)
    assert bench._peer_order([r]) == ["flashmla", "naive", "mlagen"]


def test_sparse_report_ratios_padding_note_and_tolerance():
    text = bench.format_table(_sparse_results(), {})
    header, s1, s5 = _table_rows(text)
    assert header == ["shape", "description", "flashmla TFLOP/s", "naive TFLOP/s", "mlagen TFLOP/s",
                      "mlagen / flashmla", "mlagen / naive", "mlagen error"]
    assert s1[:2] == ["S1", "sq=4096,h=128,topk=2048,skv=8192,d=576,sink=1"]
    assert s1[2].startswith("604.0 [") and s1[4].startswith("600.0 [")
    assert s1[5] == f"{600 / 604:.2f}×" and s1[6] == "10.00×"
    assert s5[5] == f"{138 / 142:.2f}×"
    assert "- S5 flashmla: q zero-padded to 64 heads (from 16)" in text
    assert "WRONG above a relative L2 error of 0.01 or on any NaN" in text


def test_shapes_of_two_families_get_a_table_each():
    text = bench.format_table(_fake_results() + _sparse_results(), {"torch": "2.13"})
    assert text.index("## mla_prefill") < text.index("| D1 |") < text.index("## mla_sparse_prefill") \
        < text.index("| S1 |")
    headers = [line for line in text.splitlines() if line.startswith("| shape")]
    assert len(headers) == 2 and "cudnn TFLOP/s" in headers[0] and "flashmla TFLOP/s" in headers[1]
    assert "relative L2 error of 0.02" in text and "relative L2 error of 0.01" in text


def test_format_table_shows_spread_between_rounds():
    d2 = D_SHAPES["D2"]
    fast, slow = DENSE.flops(d2) / 600e12, DENSE.flops(d2) / 400e12
    r = bench.Result(DENSE, d2, {"mlagen": _peer(DENSE, "mlagen", timing=bench.Timing([[fast] * 3, [slow] * 3,
                                                                                         [fast] * 3]))},
                     iters=3, rounds=3)
    cell = _table_rows(bench.format_table([r], {}))[1][2]
    assert cell == "600.0 [400.0–600.0], rounds 400.0–600.0"


def test_result_ratio_and_tflops():
    r1 = _fake_results()[0]
    assert r1.tflops("mlagen") == pytest.approx(500.0)
    assert r1.ratio("mlagen", "cudnn") == pytest.approx(500 / 550)
    assert r1.ratio("mlagen", "fa2") is None
    assert r1.tflops("nobody") is None
    s1 = _sparse_results()[0]
    assert s1.flops == 2 * 4096 * 128 * 2048 * (576 + 512) and s1.tflops("flashmla") == pytest.approx(604.0)


def test_results_to_json_and_write_markdown(tmp_path):
    results = _fake_results() + _sparse_results()
    doc = json.loads(bench.results_to_json(results, {"torch": "2.13"}))
    assert doc["environment"] == {"torch": "2.13"}
    d1 = doc["results"][0]
    assert d1["family"] == "mla_prefill" and d1["shape"] == "D1" and d1["flops"] == DENSE.flops(D_SHAPES["D1"])
    assert (d1["q_lens"], d1["k_lens"], d1["heads"], d1["causal"]) == ([8192], [8192], 128, True)
    assert d1["peers"]["mlagen"]["timing"]["tflops"] == pytest.approx(500.0)
    assert d1["peers"]["fa2"]["timing"] is None and d1["peers"]["fa2"]["error"].startswith("RuntimeError")
    assert d1["ratios"]["mlagen/cudnn"] == pytest.approx(500 / 550) and d1["ratios"]["mlagen/fa2"] is None
    assert doc["results"][1]["peers"]["mlagen"]["check"]["problem"].startswith("relative L2")
    s5 = doc["results"][3]
    assert s5["family"] == "mla_sparse_prefill" and (s5["sq"], s5["heads"], s5["topk"], s5["s_kv"]) == (
        4096, 16, 2048, 32768)
    assert s5["ratios"]["mlagen/flashmla"] == pytest.approx(138 / 142) and "padded to 64" in s5["peers"]["flashmla"][
        "note"]
    path = tmp_path / "sub" / "bench.md"
    bench.write_markdown(path, results, {"torch": "2.13"})
    assert path.read_text() == bench.format_table(results, {"torch": "2.13"})


# --- correctness plumbing, on the CPU ----------------------------------------------------------

torch = pytest.importorskip("torch")

from mlagen.families.mla_prefill import peers as dense_peers  # noqa: E402
from mlagen.families.mla_prefill.problem import Shape as DenseShape  # noqa: E402
from mlagen.families.mla_prefill.reference import compare as dense_compare  # noqa: E402
from mlagen.families.mla_prefill.reference import make_inputs as dense_inputs  # noqa: E402
from mlagen.families.mla_prefill.reference import reference_heads  # noqa: E402
from mlagen.families.mla_sparse_prefill.problem import Shape as SparseShape  # noqa: E402
from mlagen.families.mla_sparse_prefill import peers as sparse_peers  # noqa: E402

TINY = {
    "ragged": DenseShape("R", (5, 9, 3), (5, 9, 3), 3, True),
    "prefix": DenseShape("P", (6,), (11,), 3, True),
    "prefix_batch": DenseShape("B", (4, 4), (7, 7), 2, True),
    "ragged_prefix": DenseShape("RP", (5, 2), (8, 6), 2, True),
    "no_mask": DenseShape("N", (6, 9), (7, 5), 2, False),
}


@pytest.mark.parametrize("lower_right", ["dense", "bias"])
@pytest.mark.parametrize("name", sorted(TINY))
def test_sdpa_peer_layouts_and_masks_on_cpu(name, lower_right):
    """The SDPA peers' layout, padding, per-sequence split and bottom-right masks, through the
    math backend: they must compute what MLA.md says."""
    from torch.nn.attention import SDPBackend

    shape = TINY[name]
    x = dense_inputs(shape, "cpu", seed=2)
    peer = dense_peers.sdpa_peer(shape, x, backend=SDPBackend.MATH, pad_v=True, lower_right=lower_right)
    out, lse = peer.checked_call()
    assert lse is None and tuple(out.shape) == (shape.total_q, shape.heads, 128)
    check = dense_compare(out, None, *reference_heads(shape, x))
    assert check.ok, check.problem
    assert ("per-sequence calls" in peer.note) == (not shape.uniform)
    assert "V zero-padded" in peer.note


def test_dense_lower_right_mask():
    mask = dense_peers._sdpa_mask(2, 4, True, "dense", "cpu")["attn_mask"]
    assert tuple(mask.shape) == (1, 1, 2, 4)
    assert torch.isinf(mask[0, 0]).tolist() == [[False, False, False, True], [False, False, False, False]]
    assert dense_peers._sdpa_mask(4, 4, True, "dense", "cpu") == {"is_causal": True}
    assert dense_peers._sdpa_mask(2, 4, False, "dense", "cpu") == {}


def _no_gpu_timing(monkeypatch, calls):
    def fake_time_calls(fn, iters, flush):
        calls.append(fn)
        if fn() is None:
            raise RuntimeError("illegal memory access")
        return [1e-3 * (1 + len(calls) % 3)] * iters

    monkeypatch.setattr(bench, "time_calls", fake_time_calls)
    monkeypatch.setattr(bench, "host_time", lambda fn: 42e-6)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "gpu_telemetry", lambda device=None: {})


def test_bench_shape_turns_peer_failures_into_results(monkeypatch):
    """The orchestration on the CPU: GPU timing replaced by a fake clock, peers by math SDPA."""
    from torch.nn.attention import SDPBackend

    def math_prepare(shape, x, arg=None):
        return dense_peers.sdpa_peer(shape, x, backend=SDPBackend.MATH, pad_v=False, lower_right="dense")

    def raising(shape, x, arg=None):
        import warnings

        warnings.warn("Flash attention kernel not used because:\n  head dims differ")
        raise RuntimeError("No available kernel.\nsecond line")

    def wrong(shape, x, arg=None):
        p = math_prepare(shape, x)
        return Prepared(p.fn, lambda: (p.checked_call()[0] * 2, None))

    def breaks_when_timed(shape, x, arg=None):
        p = math_prepare(shape, x)
        p.fn = lambda: None
        return p

    fake = {p.name: p for p in (
        Peer("mlagen", "", math_prepare, ours=True, default=True),
        Peer("cudnn", "", math_prepare, default=True),
        Peer("fa2", "", raising),
        Peer("wrong", "", wrong),
        Peer("flaky", "", breaks_when_timed),
        Peer("fa3", "", math_prepare, lead=True, status=lambda: "fa3: not built here"),
    )}
    monkeypatch.setattr(DENSE, "peers", lambda: fake)
    calls = []
    _no_gpu_timing(monkeypatch, calls)
    logs = []
    shape = TINY["ragged_prefix"]
    result = bench._bench_shape(DENSE, shape, ["mlagen", "cudnn", "fa2", "wrong", "flaky", "fa3"], iters=4,
                                rounds=2, warmup=1, seed=0, device="cpu", flush=lambda: None, log=logs.append)
    p = result.peers
    assert list(p) == ["mlagen", "cudnn", "fa2", "wrong", "flaky", "fa3"]
    assert len(p["mlagen"].timing.blocks) == 4 and len(p["cudnn"].timing.blocks) == 2   # ours after each peer
    assert all(len(b) == 4 for b in p["mlagen"].timing.blocks)
    assert p["mlagen"].check.ok and "per-sequence calls" in p["cudnn"].note
    assert p["fa2"].timing is None
    assert p["fa2"].error == "RuntimeError: No available kernel.; Flash attention kernel not used because: head dims differ"
    assert p["wrong"].wrong and p["wrong"].error.startswith("WRONG: relative L2 error")
    assert p["flaky"].timing is None and p["flaky"].error == "RuntimeError: illegal memory access"
    assert p["fa3"].timing is None and p["fa3"].error == "fa3: not built here"   # asked for: n/a with the reason
    assert any("round 2/2 cudnn" in line for line in logs) and any("fa2: n/a" in line for line in logs)
    assert p["mlagen"].host == p["cudnn"].host == 42e-6 and p["fa2"].host is None and p["wrong"].host is None
    table = bench.format_table([result], {})
    assert "n/a (RuntimeError: No available kernel.; Flash attention" in table and "WRONG (relative L2 error" in table
    host = _table_rows(table[table.index("Host (CPU) time per call"):])
    assert host[0][0] == "shape" and host[0].index("fa3 host µs/call") < host[0].index("mlagen host µs/call")
    assert host[1][0] == shape.id and host[1][host[0].index("mlagen host µs/call")] == "42"
    assert host[1][host[0].index("fa2 host µs/call")] == "—"
    assert table.index("fa3 TFLOP/s") < table.index("mlagen TFLOP/s") and "n/a (fa3: not built here)" in table


def _fake_flashmla(q, kv, indices, scale, d_v, sink, length):
    """FlashMLA's contract, computed by the naive peer: only the inputs its kernel accepts."""
    assert q.shape[1] in (64, 128), q.shape
    assert kv.dim() == 3 and kv.shape[1] == 1 and indices.dim() == 3 and indices.shape[-1] % 128 == 0
    assert d_v == 512
    return sparse_peers.naive(q, kv, indices, scale, sink, length)


def test_sparse_bench_on_cpu_pads_for_flashmla_and_checks_every_peer(monkeypatch):
    """The sparse path of the orchestration: H = 16 and topk 200, FlashMLA (a stand-in with its
    input contract) padded, the naive peer, and ours (a stand-in for the public call, which
    needs a GPU) all checked against the family's reference and timed in interleaved rounds."""
    def ours(shape, x, arg=None):
        def fn():
            return sparse_peers.naive(x["q"], x["kv"], x["indices"], x["softmax_scale"], x["attn_sink"])

        return Prepared(fn, fn, "stand-in")

    fake = dict(SPARSE.peers())
    fake["flashmla"] = Peer("flashmla", "", lambda s, x, a=None: sparse_peers.flashmla_peer(
        s, x, a, sparse_fwd=_fake_flashmla), lead=True, default=True)
    fake["mlagen"] = Peer("mlagen", "", ours, ours=True, default=True)
    monkeypatch.setattr(SPARSE, "peers", lambda: fake)
    calls = []
    _no_gpu_timing(monkeypatch, calls)
    shape = SparseShape("small", 40, 16, 200, 300)
    result = bench._bench_shape(SPARSE, shape, ["mlagen", "naive", "flashmla"], iters=3, rounds=2, warmup=0,
                                seed=1, device="cpu", flush=lambda: None, log=lambda line: None)
    p = result.peers
    for name in ("flashmla", "naive", "mlagen"):
        assert p[name].error is None and p[name].check.ok and p[name].check.lse_max_abs < 1e-3, (name, p[name].error)
    assert len(p["mlagen"].timing.blocks) == 4 and len(p["flashmla"].timing.blocks) == 2
    assert "zero-padded to 64 heads (from 16)" in p["flashmla"].note and "topk 200 to 256" in p["flashmla"].note
    text = bench.format_table([result], {})
    assert bench._peer_order([result])[0] == "flashmla" and "padded to 64" in text


def test_flashmla_padding():
    assert sparse_peers.flashmla_padding(16, 2048) == (64, 2048)
    assert sparse_peers.flashmla_padding(64, 1024) == (64, 1024)
    assert sparse_peers.flashmla_padding(65, 1) == (128, 128)
    assert sparse_peers.flashmla_padding(128, 129) == (128, 256)
    with pytest.raises(BenchError, match="at most 128 heads"):
        sparse_peers.flashmla_padding(129, 128)


def test_flashmla_peer_leaves_a_problem_it_takes_alone():
    shape = SparseShape("s", 8, 64, 128, 256)
    x = SPARSE.make_inputs(shape, "cpu", seed=3)
    seen = []

    def fwd(*args):
        seen.append(args)
        return _fake_flashmla(*args)

    prepared = sparse_peers.flashmla_peer(shape, x, sparse_fwd=fwd)
    prepared.checked_call()
    q, kv, idx, _, _, sink, _ = seen[0]
    assert prepared.note == "" and q is x["q"] and sink is x["attn_sink"]   # no copies
    assert idx.data_ptr() == x["indices"].data_ptr() and idx.shape == x["indices"].shape
    assert kv.data_ptr() == x["kv"].data_ptr() and kv.shape == x["kv"].shape


@pytest.mark.parametrize("sink", ["none", "finite", "inf"])
def test_naive_peer_matches_the_reference(sink):
    """The naive peer is MLA.md section 2: invalid indices, topk_length (0 included) and the
    sink, against the family's float64 reference."""
    from mlagen.families.mla_sparse_prefill.reference import compare, reference

    gen = torch.Generator().manual_seed(4)
    sq, heads, topk, n = 9, 5, 70, 50
    q = torch.randn((sq, heads, 576), generator=gen).to(torch.bfloat16)
    kv = torch.randn((n, 1, 576), generator=gen).to(torch.bfloat16)
    idx = torch.randint(-3, n + 3, (sq, 1, topk), generator=gen, dtype=torch.int32)
    idx[2] = -1   # a row with no valid entry
    length = torch.randint(0, topk + 1, (sq,), generator=gen, dtype=torch.int32)
    length[4] = 0
    attn_sink = {"none": None, "finite": torch.randn((heads,), generator=gen),
                 "inf": torch.full((heads,), float("inf"))}[sink]
    got = sparse_peers.naive(q, kv, idx, 576 ** -0.5, attn_sink, length, chunk=4)
    ref = reference(q, kv, idx, softmax_scale=576 ** -0.5, topk_length=length, attn_sink=attn_sink)
    check = compare(got, ref)
    assert check.ok, check.problem
    assert got[1][2].eq(float("-inf")).all() and got[2][2].eq(float("inf")).all() and got[0][2].eq(0).all()


def test_environment_without_a_gpu():
    env = bench.environment()
    assert env["torch"] == torch.__version__ and env["date"].endswith("+00:00")
    assert {"cudnn", "nvrtc", "mlagen", "device"} <= set(env)


def test_run_without_a_gpu_is_a_bench_error_after_checking_the_arguments():
    with pytest.raises(ShapeError):
        bench.run("S9")
    with pytest.raises(BenchError, match="'fa3'"):
        bench.run("S1", peers="fa3")          # not a sparse peer
    if not torch.cuda.is_available():
        with pytest.raises(BenchError, match="needs a CUDA GPU"):
            bench.run("S1,D1", peers="mlagen")


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


def test_bench_sparse_variant_peers_are_checked_before_any_gpu_work():
    from mlagen.families.mla_sparse_prefill import tools as bench_sparse
    from mlagen.errors import SpecError

    peer = bench_sparse.variant_peer("l2_evict_last=false,epilogue=direct")
    assert peer.name == "mlagen:l2_evict_last=false,epilogue=direct" and peer.ours and not peer.lead
    with pytest.raises(SpecError, match="producer_regs"):
        bench_sparse.variant_peer("producer_regs=99")
    with pytest.raises(SpecError, match="nope"):
        bench_sparse.variant_peer("nope=1")


def test_mlagen_peer_takes_a_kernel_symbol_and_refuses_the_wrong_mask():
    """``mlagen:<kernel symbol>`` forces one variant; a variant built for the other mask is refused
    before anything runs (no GPU needed to get that far)."""
    from mlagen import spec as spec_mod
    from mlagen import variant
    from mlagen.families.mla_prefill import peers

    shape = DENSE.shapes()["D1"]   # causal
    other = variant.make(spec_mod.load("mla_prefill_sm90"), {"mask": "none"})
    inputs = {"q": None, "k": None, "v": None, "k_rope": None, "cu_seqlens_q": None, "cu_seqlens_k": None}
    with pytest.raises(BenchError, match=r"mlagen:mla_prefill_sm90_none_.*: a kernel for mask=none, the shape D1 is causal"):
        peers.mlagen_peer(shape, inputs, other.symbol)
    with pytest.raises(ValueError, match="kernel: 'mla_prefill_sm90_bogus' names no variant"):
        peers.mlagen_peer(shape, inputs, "mla_prefill_sm90_bogus")


@pytest.mark.parametrize("sid, symbol, group", [
    ("D2", "mla_prefill_sm90_causal_n128r64v128_plain_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly"
           "_schdynamic_eptma_lw2_rp24_rc240_sq128_sk128_sv128_cl1_dghalf", 8),
    ("D7", "mla_prefill_sm90_causal_n128r64v128_plain_c2_n128_s2_qsmem_opingpong_ov1_rsoverlapped_pwearly"
           "_schpersistent_epdirect_lw1_rp56_rc224_sq128_sk128_sv128_cl1_dghalf", 1),
])
def test_mlagen_peer_names_the_tile_order(monkeypatch, sid, symbol, group):
    """The bench's note for our kernel says which head group the launcher picks (a launch-time
    choice that changes the time, not the kernel symbol)."""
    import types

    from mlagen import spec as spec_mod
    from mlagen import variant
    from mlagen.families.mla_prefill import entry, peers

    monkeypatch.delenv("MLAGEN_HEAD_GROUP", raising=False)
    s = spec_mod.load("mla_prefill_sm90")
    sel = types.SimpleNamespace(spec=s, variant=variant.from_symbol(s, symbol), origin="shipped:h100.json")
    monkeypatch.setattr(entry, "mla_prefill_kernel", lambda *a, **k: sel)
    inputs = {"q": None, "k": None, "v": None, "k_rope": None, "cu_seqlens_q": None, "cu_seqlens_k": None}
    note = peers.mlagen_peer(DENSE.shapes()[sid], inputs).note
    assert note.endswith(f"{symbol} (shipped:h100.json); tiles in groups of {group} heads"), note

