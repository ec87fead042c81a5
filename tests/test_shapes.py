"""The dense family's BENCHMARKS.md table and shape descriptions (mlagen.families.mla_prefill.problem);
mlagen.shapes: resolving ids and descriptions through the family protocol, workload files."""

from __future__ import annotations

import random

import pytest

from mlagen import shapes
from mlagen.families.mla_prefill import problem as dense
from mlagen.errors import BenchError, MlagenError, ShapeError

D4_LENGTHS = (3586, 1705, 3232, 3774, 1850, 293, 1188, 4082, 2222, 2118, 1786, 3889, 3338, 3527, 1370, 4092)


def test_shape_table_matches_benchmarks_md():
    s = dense.SHAPES
    assert list(s) == ["D1", "D2", "D3", "D4", "D5", "D6", "D7", "D8", "D9", "D10", "D11"]
    expect = {  # id: (batch, q_lens, k_lens, heads, causal)
        "D1": (1, (8192,), (8192,), 128, True),
        "D2": (4, (4096,) * 4, (4096,) * 4, 16, True),
        "D3": (2, (8192,) * 2, (8192,) * 2, 16, False),
        "D4": (16, D4_LENGTHS, D4_LENGTHS, 128, True),
        "D5": (1, (2048,), (16384,), 128, True),
        "D6": (32, (512,) * 32, (512,) * 32, 128, True),
        "D7": (8, (2048,) * 8, (2048,) * 8, 16, True),
    }
    for sid, (batch, q_lens, k_lens, heads, causal) in expect.items():
        shape = s[sid]
        assert (shape.id, shape.batch, shape.q_lens, shape.k_lens, shape.heads, shape.causal) == \
            (sid, batch, q_lens, k_lens, heads, causal)
        assert shape.dims == (128, 64, 128) and shape.window == (-1, -1) and shape.mask == ("causal" if causal else "none")


# BENCHMARKS.md "Dense, other geometries and masks": D10's cached prefixes, drawn as D4's lengths are.
D10_PREFIXES = (14859, 7335, 13442, 15609, 7914, 1687, 5266, 9400, 8985, 7658, 16068, 13865, 14620, 5993, 8832, 6890)


def test_section_1b_shapes_match_benchmarks_md():
    s = dense.SHAPES
    expect = {  # id: (q_lens, k_lens, heads, (d_nope, d_rope, d_v), mask, window)
        "D8": ((8192,), (8192,), 64, (192, 64, 256), "causal", (-1, -1)),
        "D9": ((2048,) * 8, (2048,) * 8, 8, (192, 64, 256), "causal", (-1, -1)),
        "D10": ((1024,) * 16, tuple(p + 1024 for p in D10_PREFIXES), 16, (128, 64, 128), "causal", (-1, -1)),
        "D11": ((16384,), (16384,), 16, (128, 64, 128), "window", (4095, 0)),
    }
    for sid, (q_lens, k_lens, heads, dims, mask, window) in expect.items():
        shape = s[sid]
        assert (shape.q_lens, shape.k_lens, shape.heads, shape.dims, shape.mask, shape.window) == \
            (q_lens, k_lens, heads, dims, mask, window), sid
    assert s["D8"].geometry == s["D9"].geometry == "n192r64v256" and not s["D11"].causal


def test_d10_prefixes_are_seed0_uniform_draws():
    rng = random.Random(0)
    assert D10_PREFIXES == tuple(rng.randint(1024, 16384) for _ in range(16))
    assert D10_PREFIXES == dense.ragged_lengths(16, 1024, 16384, seed=0)
    d10 = dense.SHAPES["D10"]
    assert all(1024 <= lk - lq <= 16384 for lq, lk in zip(d10.q_lens, d10.k_lens))
    assert d10.packed and not d10.uniform
    assert (min(D10_PREFIXES), max(D10_PREFIXES)) == (1687, 16068)


def test_section_1b_flops():
    """2 · H · (d_qk + d_v) · visible pairs (BENCHMARKS.md "FLOPs"), with each shape's own widths."""
    s = dense.SHAPES
    assert s["D8"].flops() == 2 * 64 * (256 + 256) * 8192 * 8193 // 2
    assert s["D9"].flops() == 8 * 2 * 8 * 512 * 2048 * 2049 // 2
    assert s["D10"].flops() == sum(2 * 16 * 320 * (1024 * p + 1024 * 1025 // 2) for p in D10_PREFIXES)
    # window (4095, 0): row i sees min(i + 1, 4096) keys
    assert s["D11"].flops() == 2 * 16 * 320 * (4096 * 4097 // 2 + (16384 - 4096) * 4096)
    from mlagen import families

    fam = families.get("mla_prefill")
    assert [fam.flops(s[i]) for i in ("D8", "D9", "D10", "D11")] == [s[i].flops() for i in ("D8", "D9", "D10", "D11")]


def brute_window_pairs(lq, lk, left, right):
    return sum(1 for i in range(lq) for j in range(lk)
               if (left < 0 or j >= i + lk - lq - left) and (right < 0 or j <= i + lk - lq + right))


def test_window_pairs_against_brute_force():
    rng = random.Random(3)
    cases = [(lq, lk, left, right) for lq in (0, 1, 5, 17) for lk in (0, 1, 4, 17) for left in (-1, 0, 3, 30)
             for right in (-1, 0, 2, 40)]
    cases += [(rng.randint(0, 90), rng.randint(0, 90), rng.randint(-1, 100), rng.randint(-1, 100)) for _ in range(300)]
    for lq, lk, left, right in cases:
        got = dense.band_pairs(lq, lk, "window", (left, right))
        assert got == brute_window_pairs(lq, lk, left, right), (lq, lk, left, right)
        assert dense.band_pairs(lq, lk, "window", (-1, -1)) == dense.visible_pairs(lq, lk, False)
        if lk >= lq:
            assert dense.band_pairs(lq, lk, "window", (-1, 0)) == dense.visible_pairs(lq, lk, True)


def test_d4_lengths_are_seed0_uniform_draws():
    d4 = dense.SHAPES["D4"]
    rng = random.Random(0)
    assert d4.q_lens == tuple(rng.randint(128, 4096) for _ in range(16))
    assert d4.q_lens == dense.ragged_lengths(16, 128, 4096, seed=0)
    assert len(d4.q_lens) == 16 and all(128 <= n <= 4096 for n in d4.q_lens)
    assert d4.packed and not d4.uniform


def test_d5_is_a_chunk_after_a_cached_prefix():
    d5 = dense.SHAPES["D5"]
    assert d5.k_lens[0] - d5.q_lens[0] == 14336
    assert not d5.packed and d5.uniform
    assert "14336 cached" in d5.description


def test_flops():
    s = dense.SHAPES
    assert s["D1"].flops() == 2 * 128 * 320 * 8192 * 8193 // 2
    assert s["D3"].flops() == 2 * 16 * 320 * 2 * 8192 * 8192
    assert s["D5"].flops() == 2 * 128 * 320 * (2048 * 14336 + 2048 * 2049 // 2)
    assert s["D4"].flops() == sum(2 * 128 * 320 * n * (n + 1) // 2 for n in D4_LENGTHS)


def test_cu_seqlens_and_sequence_lengths():
    shape = dense.Shape("T", (3, 5), (4, 7), 2, True)
    assert shape.cu_seqlens() == ([0, 3, 8], [0, 4, 11])
    assert shape.sequence_lengths() == [(0, 3, 0, 4), (3, 5, 4, 7)]


def test_shape_rejects_mismatched_lengths():
    with pytest.raises(BenchError, match="same sequences"):
        dense.Shape("T", (3, 5), (4,), 2, True)


def test_parse_shapes():
    assert [s.id for s in dense.parse_shapes("D1,D3")] == ["D1", "D3"]
    assert [s.id for s in dense.parse_shapes(" d2 , D2,D5")] == ["D2", "D5"]
    assert [s.id for s in dense.parse_shapes(["D4"])] == ["D4"]
    assert len(dense.parse_shapes("all")) == 11


def test_parse_shapes_names_the_bad_ids():
    with pytest.raises(BenchError) as info:
        dense.parse_shapes("D1,D12,S1")
    assert "'D12'" in str(info.value) and "'S1'" in str(info.value) and "D1, D2" in str(info.value)
    assert isinstance(info.value, MlagenError)
    with pytest.raises(BenchError, match="no shape"):
        dense.parse_shapes(" , ")


# --- descriptions -----------------------------------------------------------------------------


def test_parse_description_uniform_batch():
    s = dense.parse_shape("b=4,q=4096,k=4096,h=16,causal")
    assert (s.q_lens, s.k_lens, s.heads, s.causal) == ((4096,) * 4, (4096,) * 4, 16, True)
    assert s.id == "b=4,q=4096,h=16,causal"
    assert s.flops() == dense.SHAPES["D2"].flops()
    assert dense.parse_shape(" h=16 , q=4096 ,b=4") == s      # any order, spaces; causal by default


def test_parse_description_defaults_prefix_and_mask():
    s = dense.parse_shape("q=2048,k=16384,h=128")
    assert (s.batch, s.q_lens, s.k_lens, s.causal) == (1, (2048,), (16384,), True)
    assert s.flops() == dense.SHAPES["D5"].flops()
    n = dense.parse_shape("b=2,q=8192,h=16,none")
    assert not n.causal and n.flops() == dense.SHAPES["D3"].flops()


def test_parse_description_ragged():
    s = dense.parse_shape("q=[300,1200,77],h=128")
    assert s.batch == 3 and s.q_lens == (300, 1200, 77) and s.k_lens == s.q_lens and s.packed
    s = dense.parse_shape("b=2,q=[5,7],k=[9,7],h=2,none")
    assert s.k_lens == (9, 7) and not s.causal
    assert dense.parse_shape("q=[5,7],k=100,h=2").k_lens == (100, 100)


@pytest.mark.parametrize("shape", ["D1", "D4", "D5", "b=3,q=100,k=300,h=4,none", "q=[1,2,3],k=[4,5,6],h=8",
                                   "D8", "D9", "D10", "D11", "q=[3,9],h=2,d=128/0/128,window=7/5"])
def test_description_round_trips(shape):
    s = dense.parse_shape(shape)
    again = dense.parse_shape(s.describe_text())
    assert (again.q_lens, again.k_lens, again.heads, again.causal) == (s.q_lens, s.k_lens, s.heads, s.causal)
    assert (again.geometry, again.window) == (s.geometry, s.window)


def test_parse_geometry_and_window():
    s = dense.parse_shape("q=8192,h=64,d=192/64/256")
    assert (s.dims, s.mask, s.id) == ((192, 64, 256), "causal", "b=1,q=8192,h=64,d=192/64/256,causal")
    assert s.flops() == dense.SHAPES["D8"].flops()
    w = dense.parse_shape("q=16384,h=16,window=4095/0")
    assert (w.window, w.causal, w.mask) == ((4095, 0), False, "window") and w.flops() == dense.SHAPES["D11"].flops()
    assert "window 4095/0" in w.description and "d 192/64/256" in s.description
    # FlashAttention's rules: causal with a window is the window (left, 0); (-1, 0) is causal
    assert dense.parse_shape("q=64,h=2,window=5/3,causal").window == (5, 0)
    assert dense.parse_shape("q=64,h=2,window=-1/0").mask == "causal"
    assert dense.parse_shape("q=64,h=2,window=-1/-1").mask == "none"
    with pytest.raises(ShapeError, match="geometry 'n1r2v3'"):
        dense.Shape("G", (4,), (4,), 1, True, geometry="n1r2v3")


@pytest.mark.parametrize("text, fragment", [
    ("q=4096", "needs q=<length> and h=<heads>"),
    ("h=16", "needs q=<length>"),
    ("b=4,q=4096,h=16,x=3", "unknown key 'x'"),
    ("q=4096,h=16,sliding", "'sliding' is not a mask"),
    ("q=4096,h=16,causal,none", "mask is given twice"),
    ("q=4096,q=2,h=16", "q is given twice"),
    ("q=0,h=16", "no query rows"),
    ("q=-3,h=16", "q=-3: expected a non-negative integer"),
    ("q=4k,h=16", "q=4k: expected a non-negative integer"),
    ("q=4096,h=1.5", "h=1.5"),
    ("q=[1,2,h=4", "cannot read"),
    ("q=[1,2],k=[1,2,3],h=4", "disagree on the number of sequences"),
    ("b=3,q=[1,2],h=4", "the batch (3) and the q/k lists disagree"),
    ("q=4096,,h=16", "cannot read ',h=16'"),
    ("D12", "unknown shape id 'D12'"),
    ("q=64,h=2,d=192/64", "d=192/64: expected d_nope/d_rope/d_v, one of 128/64/128, 192/64/256"),
    ("q=64,h=2,d=64/64/64", "d=64/64/64: expected d_nope/d_rope/d_v"),
    ("q=64,h=2,window=-2/0", "window=-2/0: each side is >= 0, or -1 for unbounded"),
    ("q=64,h=2,window=4", "window=4: expected <left>/<right>"),
    ("", "empty shape"),
])
def test_parse_description_errors_name_the_item(text, fragment):
    with pytest.raises(ShapeError) as info:
        dense.parse_shape(text)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
    if "=" in text:
        assert "allowed: b=<batch>" in str(info.value) or "no query rows" in str(info.value)


def test_parse_shapes_takes_one_description():
    (s,) = dense.parse_shapes("b=4,q=4096,h=16")
    assert s.batch == 4
    assert [x.id for x in dense.parse_shapes(["D1", "q=[3,4],h=2"])] == ["D1", "b=2,q=[3,4],h=2,causal"]


# --- workloads --------------------------------------------------------------------------------


def test_load_workload(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text('''family: mla_prefill
shapes:
  - {shape: "b=4,q=4096,k=4096,h=16,causal", weight: 120}
  - {shape: D4, weight: 3}      # ids from BENCHMARKS.md are allowed too
  - shape: "q=[100,200],h=8,none"
''')
    items = shapes.load_workload(path)
    assert [(i.shape.id, i.weight) for i in items] == [("b=4,q=4096,h=16,causal", 120.0), ("D4", 3.0),
                                                        ("b=2,q=[100,200],h=8,none", 1.0)]


@pytest.mark.parametrize("content, fragment", [
    ("[1, 2]", "expected a mapping"),
    ("family: sparse\nshapes: [D1]", "family: 'sparse'"),
    ("shapes: []", "non-empty list"),
    ("shapes: [{shape: D1, weight: 0}]", "shapes[0].weight: expected a positive number"),
    ("shapes: [{shape: D1, weight: yes}]", "shapes[0].weight"),
    ("shapes: [D1, {shape: 'q=5'}]", "shapes[1].shape: shape 'q=5': needs q=<length> and h=<heads>"),
    ("shapes: [{shape: D1, wieght: 2}]", "unknown key 'wieght'"),
    ("shapes: [D1]\nextra: 1", "unknown key 'extra'"),
    ("shapes: [{weight: 2}]", "shapes[0]: expected"),
    ("shapes: [D1", "not YAML"),
])
def test_workload_errors_name_the_entry(tmp_path, content, fragment):
    path = tmp_path / "w.yaml"
    path.write_text(content)
    with pytest.raises(ShapeError) as info:
        shapes.load_workload(path)
    assert fragment in str(info.value) and str(path) in str(info.value)


def test_missing_workload_file(tmp_path):
    with pytest.raises(ShapeError, match="no such workload file"):
        shapes.load_workload(tmp_path / "nope.yaml")


def test_a_recorded_file_is_a_workload(tmp_path, monkeypatch):
    """What MLAGEN_RECORD_SHAPES writes, mlagen tune --workload reads."""
    from mlagen import shapelog

    path = tmp_path / "shapes.yaml"
    monkeypatch.setenv("MLAGEN_RECORD_SHAPES", str(path))
    shapelog.reset()
    try:
        for _ in range(3):
            shapelog.note("mla_prefill", "causal/h16/q4096/k4096", lambda: "b=4,q=4000,h=16,causal")
        shapelog.note("mla_prefill", "none/h128/q8192/k8192", lambda: "b=1,q=8192,h=128,none")
        shapelog.flush()
    finally:
        shapelog.reset()
    items = shapes.load_workload(path)
    assert [(i.shape.q_lens, i.shape.heads, i.shape.causal, i.weight) for i in items] == [
        ((4000,) * 4, 16, True, 3.0), ((8192,), 128, False, 1.0)]


# --- resolution through the family protocol ---------------------------------------------------


def test_ids_resolve_to_their_family():
    from mlagen.families.mla_sparse_prefill import problem as sp_problem

    assert shapes.parse_shape("d1") is dense.SHAPES["D1"]
    assert shapes.parse_shape("S3") == sp_problem.SHAPES["S3"] and shapes.parse_shape("S3").s_kv == 131072
    assert shapes.parse_shape("sq=64,h=16,topk=32,skv=128").topk == 32
    assert shapes.parse_shape("b=4,q=4096,h=16") == dense.parse_shape("b=4,q=4096,h=16")


def test_a_given_family_reads_the_text(tmp_path):
    from mlagen import spec as spec_mod

    assert shapes.parse_shape("D2", "mla_prefill") is dense.SHAPES["D2"]
    assert shapes.parse_shape("D2", spec_mod.load("mla_prefill_sm90")) is dense.SHAPES["D2"]
    with pytest.raises(ShapeError, match="unknown shape id 'S3'; choose from D1") as info:
        shapes.parse_shape("S3", "mla_prefill")
    assert "\n" not in str(info.value)
    with pytest.raises(ShapeError, match=r"family: 'dense'; allowed: mla_prefill, mla_sparse_prefill"):
        shapes.parse_shape("D1", "dense")
    assert [s.id for s in shapes.parse_shapes("D1,d3", "mla_prefill")] == ["D1", "D3"]
    assert len(shapes.parse_shapes("all", "mla_sparse_prefill")) == 19   # S1-S6, V1-V5, M1-M8
    with pytest.raises(ShapeError, match="unknown shape id 'D12'"):
        shapes.parse_shapes("D1,D12", "mla_prefill")
    with pytest.raises(ShapeError, match="name the family"):
        shapes.parse_shapes("all")


def test_text_no_family_reads_names_every_familys_reason():
    with pytest.raises(ShapeError) as info:
        shapes.parse_shape("q=5")
    text = str(info.value)
    assert "needs q=<length> and h=<heads>" in text and "(mla_prefill)" in text and "(mla_sparse_prefill)" in text
    assert isinstance(info.value, ValueError) and "\n" not in text
    with pytest.raises(ShapeError, match="expected a string"):
        shapes.parse_shape(3)


def test_an_id_two_families_read_is_ambiguous(monkeypatch):
    from mlagen import families

    fam = families.get("mla_prefill")
    monkeypatch.setattr(shapes, "_all_families", lambda: [fam, fam])
    with pytest.raises(ShapeError, match="'D1' is ambiguous: mla_prefill, mla_prefill all read it"):
        shapes.parse_shape("D1")


def test_workload_of_another_family(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("family: mla_sparse_prefill\nshapes: [S1, {shape: 'sq=64,h=16,topk=32,skv=128', weight: 2}]\n")
    items = shapes.load_workload(path)
    assert [(i.shape.id, i.weight) for i in items] == [("S1", 1.0), ("sq=64,h=16,topk=32,skv=128", 2.0)]
    assert shapes.load_workload(path, "mla_sparse_prefill") == items
    with pytest.raises(ShapeError, match=r"w.yaml: family: 'mla_sparse_prefill'; the spec's family is 'mla_prefill'"):
        shapes.load_workload(path, "mla_prefill")
    path.write_text("shapes: [S1]\n")   # no family: the caller's reads the shapes
    with pytest.raises(ShapeError, match=r"shapes\[0\].shape: unknown shape id 'S1'; choose from D1"):
        shapes.load_workload(path, "mla_prefill")


def test_a_yaml_bomb_in_a_workload_is_refused_at_once(tmp_path):
    """Issue 42 point 14: anchors and aliases are refused before anything expands."""
    import time

    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
              f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]" for i in range(9)]
    lines += ["family: *j", "shapes: [D1]"]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    start = time.monotonic()
    with pytest.raises(ShapeError, match=f"{path}: line 1: not YAML \\(anchors"):
        shapes.load_workload(path)
    assert time.monotonic() - start < 1.0


def test_a_non_utf8_workload_names_its_file(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("family: mla_prefill\nshapes: [D1]  # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ShapeError, match=f"{path}: not UTF-8 text"):
        shapes.load_workload(path)
    with pytest.raises(ShapeError, match="/dev/zero: not a regular file"):
        shapes.load_workload("/dev/zero")
