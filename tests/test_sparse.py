"""Sparse MLA prefill without a GPU: the spec, rendering, NVRTC compilation of every default
variant, argument errors, and the reference semantics of MLA.md section 2 in float64."""

from __future__ import annotations

import math

import pytest

from mlagen import paths, render, resources, spec, variant
from mlagen.errors import SpecError

torch = pytest.importorskip("torch")

from mlagen.families import mla_sparse_prefill as fam  # noqa: E402
from mlagen.families.mla_sparse_prefill import problem as sp_problem, params as sp_params, call as sp_call, compile as sp_compile, reference as sp_ref  # noqa: E402

SPECS = ["mla_sparse_prefill_sm90", "mla_sparse_prefill_sm80"]


def test_spec_loads_with_its_family():
    s = spec.load("mla_sparse_prefill_sm90")
    assert (s.family, s.abi, s.targets) == ("mla_sparse_prefill", "gather", ("sm_90a",))
    assert dict(s.specialize) == {"d_qk": (576, 512), "paged": (False, True),
                                  "kv_format": ("bf16", "fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0", "fp8_v4")}
    assert set(s.schedule) == {"roles", "gather", "consumer_split"}


def test_schedule_is_validated(tmp_path):
    text = spec.resolve("mla_sparse_prefill_sm90").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("output_columns: halves", "output_columns: quarters"))
    with pytest.raises(SpecError, match="consumer_split"):
        spec.load(bad)
    bad.write_text(text.replace("registers: producer_regs", "registers: nope_regs"))
    with pytest.raises(SpecError, match="nope_regs"):
        spec.load(bad)


def test_register_pool_is_checked():
    from mlagen import arch, resources

    s = spec.load("mla_sparse_prefill_sm90")
    v = variant.make(s, {"consumer_regs": 224, "producer_regs": 88})
    verdict = resources.check(v, arch.TARGETS["sm_90a"])
    assert not verdict.ok and any("setmaxnreg" in r for r in verdict.reasons)
    assert not resources.check(variant.make(s, {}), arch.TARGETS["sm_80"]).ok


@pytest.mark.parametrize("d_qk", [576, 512])
def test_render_is_deterministic_and_names_the_layout(d_qk):
    s = spec.load("mla_sparse_prefill_sm90")
    v = variant.make(s, {"d_qk": d_qk})
    a, b = render.render(v), render.render(v)
    assert a.text == b.text
    assert f"kDQk = {d_qk};" in a.text and "struct Params" in a.text


@pytest.mark.parametrize("values", [{"d_qk": 576}, {"d_qk": 512}, {"paged": True}, {"d_qk": 512, "paged": True},
                                    {"epilogue": "direct"}, {"gather_fence": True},
                                    {"d_qk": 512, "epilogue": "bulk", "early_free": True, "q_evict_first": True},
                                    {"d_qk": 512, "paged": True, "epilogue": "bulk", "early_free": True},
                                    {"d_qk": 512, "paged": True, "kv_format": "fp8_v4", "epilogue": "bulk"},
                                    {"d_qk": 512, "persistent": True, "epilogue": "warp"},
                                    {"d_qk": 512, "paged": True, "persistent": True, "epilogue": "warp",
                                     "softmax_max": "exact"},
                                    {"d_qk": 576, "persistent": True, "epilogue": "direct"},
                                    {"d_qk": 576, "epilogue": "warp"}])
def test_default_variants_compile_without_spills(values):
    from mlagen.compiler import for_target

    s = spec.load("mla_sparse_prefill_sm90")
    b = for_target("sm_90a").compile(render.render(variant.make(s, values)), "sm_90a")
    assert b.resources.spill_stores == 0 and b.resources.spill_loads == 0, b.log


def _sass(values, tmp_path) -> str:
    import subprocess

    from mlagen.compiler import for_target
    from tests.test_compiler import CUOBJDUMP

    v = variant.make(spec.load("mla_sparse_prefill_sm90"), {"d_qk": 512, **values})
    path = tmp_path / f"{v.symbol}.cubin"
    path.write_bytes(for_target("sm_90a").compile(render.render(v), "sm_90a").data)
    sass = subprocess.run([CUOBJDUMP, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    return "\n".join(line.split(";")[0].split("*/", 1)[-1].strip() for line in sass.splitlines()
                     if line.lstrip().startswith("/*") and ";" in line)


def _has_cuobjdump() -> bool:
    from tests.test_compiler import CUOBJDUMP

    return CUOBJDUMP is not None


@pytest.mark.skipif(not _has_cuobjdump(), reason="cuobjdump is neither on PATH nor installed by the "
                    "nvidia-cuda-cuobjdump wheel (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
def test_d512_schedule_options_build_what_they_name(tmp_path):
    """The bulk epilogue stores O with bulk copies (UBLKCP) and no 16-byte global store (the
    staged one has them); early_free and q_evict_first each change the kernel."""
    default = _sass({}, tmp_path)
    bulk = _sass({"epilogue": "bulk"}, tmp_path)
    assert "UBLKCP" not in default and "STG.E.128" in default
    assert "UBLKCP" in bulk and "STG.E.128" not in bulk
    for option in ({"early_free": True}, {"q_evict_first": True}):
        assert _sass(option, tmp_path) != default, option


@pytest.mark.skipif(not _has_cuobjdump(), reason="cuobjdump is neither on PATH nor installed by the "
                    "nvidia-cuda-cuobjdump wheel (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
def test_the_warp_epilogue_and_the_persistent_kernel_build_what_they_name(tmp_path):
    """The warp epilogue writes O pieces with stmatrix and stores them 16 bytes a lane (no bulk
    copy); the persistent kernel is another kernel with the same epilogue."""
    warp = _sass({"epilogue": "warp"}, tmp_path)
    persistent = _sass({"epilogue": "warp", "persistent": True}, tmp_path)
    for sass in (warp, persistent):
        assert "STG.E.128" in sass and "UBLKCP" not in sass and sass.count("STSM") > _sass({}, tmp_path).count("STSM")
    assert persistent != warp


@pytest.mark.parametrize("values, reason", [
    ({"d_qk": 512, "kv_format": "fp8_v32"}, "reads bf16 rows"),
    ({"d_qk": 512, "epilogue": "staged"}, "holds the next item's Q"),
    ({"d_qk": 512, "epilogue": "bulk"}, "holds the next item's Q"),
    ({"d_qk": 576, "epilogue": "warp"}, "rope tile"),
])
def test_the_persistent_kernel_prunes_what_it_cannot_run(values, reason):
    from mlagen import arch, resources

    v = variant.make(spec.load("mla_sparse_prefill_sm90"), {"persistent": True, **values})
    verdict = resources.check(v, arch.TARGETS["sm_90a"])
    assert not verdict.ok and any(reason in r for r in verdict.reasons), verdict.reasons
    ok = variant.make(spec.load("mla_sparse_prefill_sm90"), {"persistent": True, "d_qk": 512, "epilogue": "warp"})
    assert resources.check(ok, arch.TARGETS["sm_90a"]).ok


def test_the_persistent_kernel_launches_one_cta_per_sm(monkeypatch):
    """grid(): items (tokens x 64-head groups) for the per-item kernel; at most the SM count for
    the persistent one (never more CTAs than items)."""
    from types import SimpleNamespace

    from mlagen import runtime
    from mlagen.families.mla_sparse_prefill import entry

    monkeypatch.setattr(runtime, "device_info", lambda index: SimpleNamespace(sm_count=132))
    s = spec.load("mla_sparse_prefill_sm90")
    call = SimpleNamespace(sq=4096, heads=128, q=SimpleNamespace(device=SimpleNamespace(index=0)))
    per_item = SimpleNamespace(env={"block_h": 64, "persistent": False}, spec=s)
    persistent = SimpleNamespace(env={"block_h": 64, "persistent": True}, spec=s)
    assert entry.grid(per_item, call) == (8192, 1, 1)
    assert entry.grid(persistent, call) == (132, 1, 1)
    small = SimpleNamespace(sq=3, heads=100, q=call.q)
    assert entry.grid(persistent, small) == (6, 1, 1)
    # The H <= 16 kernel is persistent by its spec (problem.persistent), which the variant's env holds.
    h16 = variant.make(spec.load("mla_sparse_prefill_sm90_h16"), {"d_qk": 576})
    env = h16.env()
    assert entry.grid(SimpleNamespace(env=env, spec=h16.spec), call) == (132, 1, 1)


@pytest.mark.parametrize("target", ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("d_qk, paged", [(576, False), (512, True)])
def test_sm80_spec_compiles_for_every_target(target, d_qk, paged):
    from mlagen import arch, resources
    from mlagen.compiler import for_target

    s = spec.load("mla_sparse_prefill_sm80")
    v = variant.make(s, {"d_qk": d_qk, "paged": paged})
    assert resources.check(v, arch.TARGETS[target]).ok
    b = for_target(target).compile(render.render(v), target)
    assert b.resources.spill_stores == 0, b.log


def test_sm90_is_preferred_on_hopper():
    from mlagen.dispatch import family_specs

    names = [s.name for s in family_specs("mla_sparse_prefill")]
    # The H <= 16 kernel first: dispatch takes it only up to its max_heads (16).
    assert names == ["mla_sparse_prefill_sm90_h16", "mla_sparse_prefill_sm90", "mla_sparse_prefill_sm80"]


def test_max_heads_limits_what_dispatch_may_choose_unasked():
    from types import SimpleNamespace

    h16 = spec.load("mla_sparse_prefill_sm90_h16")
    sm90 = spec.load("mla_sparse_prefill_sm90")
    assert dict(h16.problem)["max_heads"] == 16
    assert sp_compile.preferred(h16, SimpleNamespace(heads=16)) and not sp_compile.preferred(h16, SimpleNamespace(heads=17))
    assert sp_compile.preferred(sm90, SimpleNamespace(heads=128))


def test_preferred_kv_formats_limit_what_dispatch_may_choose_unasked():
    """The H <= 16 kernel reads FP8 caches (asked by name) but dispatch keeps the 64-head kernel for
    them (the in-place dequantization is slower so far); bf16 caches of <= 16 heads go to it."""
    from types import SimpleNamespace

    h16 = spec.load("mla_sparse_prefill_sm90_h16")
    sm90 = spec.load("mla_sparse_prefill_sm90")
    assert "fp8_v32" in dict(h16.specialize)["kv_format"] and dict(h16.problem)["preferred_kv_formats"] == "bf16"
    assert sp_compile.preferred(h16, SimpleNamespace(heads=16, kv_format="bf16"))
    assert not sp_compile.preferred(h16, SimpleNamespace(heads=16, kv_format="fp8_v32"))
    assert sp_compile.preferred(sm90, SimpleNamespace(heads=16, kv_format="fp8_v32"))


@pytest.mark.parametrize("value", ["\"\"", "fp8_v31", "bf16,fp8_v31", "[bf16]"])
def test_preferred_kv_formats_must_name_the_specs_formats(tmp_path, value):
    text = (paths.specs_dir() / "mla_sparse_prefill_sm90_h16.yaml").read_text().replace(
        "preferred_kv_formats: bf16", f"preferred_kv_formats: {value}")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    (tmp_path / "mla_sparse_prefill_sm90_h16.cu.j2").write_text("")
    with pytest.raises(SpecError, match="problem.preferred_kv_formats"):
        spec.load(bad)


@pytest.mark.parametrize("kv_format", ["fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0"])
def test_h16_fp8_variants_compile_without_spills(kv_format):
    """The H <= 16 kernel's FP8 producer (raw rows dequantized in the ring) for every quantized
    format, paged and flat: the dispatched default (the spec's constraint keeps one consumer
    warpgroup and five slots) compiles for sm_90a with no spills."""
    from mlagen import arch
    from mlagen.compiler import for_target

    sp = spec.load("mla_sparse_prefill_sm90_h16")
    for paged in (False, True):
        v = resources.feasible_default(sp, arch.TARGETS["sm_90a"], {"d_qk": 576, "paged": paged, "kv_format": kv_format})
        assert v["consumers"] == 1 and v["slots"] == 5
        b = for_target("sm_90a").compile(render.render(v), "sm_90a")
        assert b.resources.spill_stores == 0, b.log


def test_gather_tma_abi_adds_an_aligned_tensor_map_per_pool():
    plain, tma = sp_params.params_for("bf16"), sp_params.params_tma_for("bf16")
    assert tma.fields[:-2] == plain.fields and [f.name for f in tma.fields[-2:]] == ["kv_map", "extra_kv_map"]
    (offset, extra), = [(o, e) for (f, o), (g, e) in zip(tma.layout, tma.layout[1:]) if f.name == "kv_map"]
    assert offset % 64 == 0 and extra == offset + 128 and tma.alignment == 64 and tma.size == extra + 128
    assert "mlagen::TensorMap kv_map;" in tma.c_declaration()
    assert "mlagen::TensorMap extra_kv_map;" in tma.c_declaration()


@pytest.mark.parametrize("values, ok", [
    ({"gather": "tma", "row_pad": 0}, True), ({"gather": "bulk", "row_pad": 16}, True),
    ({"gather": "tma", "row_pad": 16}, False), ({"gather": "bulk", "row_pad": 0}, False)])
def test_h16_spec_pairs_the_gather_with_its_row_layout(values, ok):
    sp = spec.load("mla_sparse_prefill_sm90_h16")
    v = variant.make(sp, dict(values, d_qk=576, paged=False, kv_format="bf16"))
    assert all(c.require(v.env()) for c in sp.constraints) == ok


def test_max_heads_must_be_a_positive_integer(tmp_path):
    text = (paths.specs_dir() / "mla_sparse_prefill_sm90_h16.yaml").read_text().replace("max_heads: 16", "max_heads: 0")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    (tmp_path / "mla_sparse_prefill_sm90_h16.cu.j2").write_text("")
    with pytest.raises(SpecError, match="problem.max_heads"):
        spec.load(bad)


def test_problem_key_round_trip():
    k = sp_problem.ProblemKey(576, 128, 2048, "flat")
    assert str(k) == "d576/h128/k2048/flat" and sp_problem.ProblemKey.parse(str(k)) == k
    assert k.distance(sp_problem.ProblemKey(576, 64, 2048)) == 1
    assert k.distance(sp_problem.ProblemKey(512, 128, 2048)) == math.inf
    assert k.distance(sp_problem.ProblemKey(576, 128, 2048, "paged")) == math.inf
    with pytest.raises(ValueError):
        sp_problem.ProblemKey.parse("causal/h128/q1/k1")


def test_family_protocol_shapes():
    f = fam.FAMILY
    s = f.parse_shape("sq=4096,h=16,topk=2048,skv=32768", id="S5")
    assert (s.id, s.sq, s.heads, s.topk, s.s_kv, s.d_qk, s.sink) == ("S5", 4096, 16, 2048, 32768, 576, True)
    assert f.parse_shape(f.describe_shape(s)) == sp_problem.Shape(f.describe_shape(s), 4096, 16, 2048, 32768)
    assert f.problem_key(s) == "d576/h16/k2048/s32768/flat"
    assert f.problem_specialization(f.problem_key(s)) == f.specialization(s) == {"d_qk": 576, "paged": False,
                                                                                  "kv_format": "bf16"}
    assert f.flops(s) == sp_problem.flops(4096, 16, 2048)
    c = f.check_shape(s)
    assert c.topk % 64 and c.topk <= c.s_kv and c.heads == 16
    for bad in ("sq=1,h=1,topk=5,skv=4", "sq=1,h=1,topk=1", "sq=1,h=1,topk=1,skv=1,x=2", "sq=1,h=1,topk=1,skv=1,d=100"):
        with pytest.raises(ValueError):
            f.parse_shape(bad)


def test_compare_flags_coverage_and_empty_rows():
    ref = (torch.ones(2, 3, 512, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.float64),
           torch.tensor([[1.0, 2.0, math.inf]] * 2, dtype=torch.float64))
    ref[1][:, 2] = -math.inf
    good = (ref[0].to(torch.bfloat16), ref[1].float(), ref[2].float())
    assert sp_ref.compare(good, ref).ok
    nan_out = good[0].clone()
    nan_out[0, 0, 0] = math.nan
    assert not sp_ref.compare((nan_out, good[1], good[2]), ref).ok
    wrong_lse = good[2].clone()
    wrong_lse[0, 2] = 0.0
    assert "lse" in sp_ref.compare((good[0], good[1], wrong_lse), ref).problem


def test_flops_convention():
    assert sp_problem.flops(4096, 128, 2048) == 2 * 4096 * 128 * 2048 * (576 + 512)


def _brute(q, kv, idx, scale, length, sink):
    rows = kv.reshape(-1, kv.shape[-1]).double()
    n = rows.shape[0]
    sq, heads, _ = q.shape
    out = torch.zeros(sq, heads, 512, dtype=torch.float64)
    ml = torch.full((sq, heads), -math.inf, dtype=torch.float64)
    lse = torch.full((sq, heads), math.inf, dtype=torch.float64)
    for t in range(sq):
        keep = [int(i) for p, i in enumerate(idx[t].tolist()) if 0 <= i < n and (length is None or p < length[t])]
        if not keep:
            continue
        g = rows[keep]
        s = (q[t].double() @ g.T) * scale
        m = s.max(-1).values
        e = torch.exp(s - m[:, None])
        den = e.sum(-1) + (torch.exp(sink.double() - m) if sink is not None else 0)
        out[t] = (e @ g[:, :512]) / den[:, None]
        ml[t] = m
        lse[t] = m + torch.log(e.sum(-1))
    return out, ml, lse


@pytest.mark.parametrize("layout", ["flat", "n1d", "paged"])
def test_reference_semantics(layout):
    g = torch.Generator().manual_seed(3)
    sq, heads, topk = 6, 4, 9
    q = torch.randn(sq, heads, 576, generator=g).to(torch.bfloat16)
    if layout == "flat":
        kv = torch.randn(13, 576, generator=g).to(torch.bfloat16)
    elif layout == "n1d":
        kv = torch.randn(13, 1, 576, generator=g).to(torch.bfloat16)
    else:
        kv = torch.randn(4, 8, 576, generator=g).to(torch.bfloat16)[:, :4]  # strided pages of 4 rows
    n = sp_ref.kv_rows(kv).shape[0]
    idx = torch.randint(-3, n + 3, (sq, topk), generator=g, dtype=torch.int32)
    idx[0] = -1                      # a row with no valid entry
    idx[1, :3] = 2                   # duplicates count each time
    length = torch.tensor([9, 9, 0, 4, 20, 1], dtype=torch.int32)
    sink = torch.tensor([0.3, math.inf, -math.inf, -1.0])
    out, ml, lse = sp_ref.reference(q, kv, idx, softmax_scale=0.07, topk_length=length, attn_sink=sink)
    bo, bml, blse = _brute(q, kv, idx, 0.07, length.tolist(), sink)
    assert out.dtype == torch.float64
    assert torch.allclose(out, bo, atol=1e-12)
    assert torch.equal(torch.isinf(ml), torch.isinf(bml)) and torch.allclose(ml[~torch.isinf(ml)], bml[~torch.isinf(bml)])
    assert torch.equal(torch.isinf(lse), torch.isinf(blse))
    assert torch.allclose(lse[~torch.isinf(lse)], blse[~torch.isinf(blse)])
    assert (out[0] == 0).all() and (ml[0] == -math.inf).all() and (lse[0] == math.inf).all()
    assert (out[:, 1] == 0).all()    # sink +inf: out 0, lse unchanged
    assert torch.isfinite(lse[1, 1])


def test_sink_enters_the_denominator_only():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 512, generator=g).to(torch.bfloat16)
    kv = torch.randn(20, 512, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 20, (2, 7), generator=g, dtype=torch.int32)
    o0, m0, l0 = sp_ref.reference(q, kv, idx, softmax_scale=0.1)
    o1, m1, l1 = sp_ref.reference(q, kv, idx, softmax_scale=0.1, attn_sink=torch.zeros(3))
    assert torch.equal(m0, m1) and torch.equal(l0, l1)
    ratio = o1 / o0
    expect = torch.exp(l0) / (torch.exp(l0) + 1.0)
    assert torch.allclose(ratio, expect.unsqueeze(-1).expand_as(ratio), rtol=1e-9)


def test_arguments_need_cuda_and_name_the_argument():
    q = torch.zeros(2, 4, 576, dtype=torch.bfloat16)
    kv = torch.zeros(10, 576, dtype=torch.bfloat16)
    idx = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="q: must be a CUDA tensor"):
        sp_call.prepare(q, kv, idx, softmax_scale=0.1)
    with pytest.raises(TypeError, match="q: expected a torch.Tensor"):
        sp_call.prepare([1], kv, idx, softmax_scale=0.1)


@pytest.mark.parametrize("compute, kind, message", [
    ("fp8", ValueError, r"compute: the fp8 compute mode was removed .*compute='bf16', reads FP8 caches"),
    ("fp4", ValueError, r"compute: 'fp4': the only compute mode is 'bf16'"),
    (8, TypeError, r"compute: expected the string 'bf16', got 8"),
])
def test_the_removed_fp8_compute_mode_is_one_clear_error(compute, kind, message):
    torch = pytest.importorskip("torch")
    import mlagen

    q = torch.zeros((2, 4, 576), dtype=torch.bfloat16)
    kv = torch.zeros((8, 656), dtype=torch.uint8)
    idx = torch.zeros((2, 4), dtype=torch.int32)
    with pytest.raises(kind, match=message):
        mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=0.1, kv_format="fp8_v32", compute=compute)


def test_a_spec_with_problem_compute_is_refused(tmp_path):
    text = spec.resolve("mla_sparse_prefill_sm90").read_text().replace("  d_v: 512\n", "  d_v: 512\n  compute: fp8\n", 1)
    path = tmp_path / "fp8_compute.yaml"
    path.write_text(text)
    with pytest.raises(SpecError, match=r"problem.compute.*fp8 compute mode was removed"):
        spec.load(path)
