"""The sparse prefill's "fp8" compute mode (``compute="fp8"``: FP8 tensor cores on the cache's
e4m3 values, served only by specs with ``problem.compute: fp8``), without a GPU: the spec and
its validation, NVRTC compilation of its variants, the argument errors, problem keys (the bf16
mode's keys and the shipped records read as before), spec matching (no spec serves both
modes), shapes, the tuner's inputs / reference / tolerances and the torch op's schema.
tests/gpu/test_sparse_fp8_compute_gpu.py runs the kernel."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlagen import arch, render, resources, spec, variant
from mlagen.errors import LaunchError, SpecError

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen import bench_sparse  # noqa: E402
from mlagen.dispatch import family_specs  # noqa: E402
from mlagen.families import mla_sparse_prefill as fam  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FP8_SPEC = "mla_sparse_prefill_sm90_fp8"
SM90A = arch.TARGETS["sm_90a"]


# --- the spec ---------------------------------------------------------------------------------


def test_the_fp8_spec_loads_and_serves_the_fp8_mode_only():
    s = spec.load(FP8_SPEC)
    assert (s.family, s.abi, s.targets) == ("mla_sparse_prefill", "gather", ("sm_90a",))
    assert fam.spec_compute(s) == "fp8" and dict(s.problem)["dtype"] == "bf16"
    assert dict(s.specialize) == {"d_qk": (576,), "paged": (False, True),
                                  "kv_format": ("fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0")}
    # Every other spec of the family is a bf16-mode spec (no problem.compute).
    others = [x for x in family_specs("mla_sparse_prefill") if x.name != FP8_SPEC]
    assert others and all("compute" not in dict(x.problem) and fam.spec_compute(x) == "bf16" for x in others)
    assert fam.compute_kv_formats("fp8") == ("fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0")
    assert fam.compute_kv_formats("bf16") == ("bf16", "fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0")
    assert fam.kv_format_targets("fp8_v32", "fp8") == ["sm_90a"] and fam.kv_format_targets("fp8_b32", "fp8") == ["sm_90a"]
    assert fam.kv_format_targets("bf16", "fp8") == [] and "sm_80" in fam.kv_format_targets("bf16")


def _spec_text(**replace):
    text = spec.resolve(FP8_SPEC).read_text()
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize("old, new, key", [
    ("compute: fp8 ", "compute: fp16 ", "problem.compute"),
    ("compute: fp8 ", "compute: [fp8] ", "problem.compute"),
    ("kv_format: [fp8_v32, fp8_b64, fp8_b32, fp8_b0]", "kv_format: [bf16, fp8_v32, fp8_b0]", "specialize.kv_format"),
])
def test_validate_spec_checks_the_compute_mode(tmp_path, old, new, key):
    bad = tmp_path / f"{FP8_SPEC}.yaml"
    bad.write_text(_spec_text(**{old: new}))
    with pytest.raises(SpecError, match=key.replace(".", r"\.")) as info:
        spec.load(bad)
    assert "\n" not in str(info.value)


def test_a_bf16_mode_spec_may_say_so(tmp_path):
    text = spec.resolve("mla_sparse_prefill_sm90").read_text().replace("  dtype: bf16\n", "  dtype: bf16\n  compute: bf16\n", 1)
    ok = tmp_path / "mla_sparse_prefill_sm90.yaml"
    ok.write_text(text)
    assert fam.spec_compute(spec.load(ok)) == "bf16"


def test_the_fp8_spec_keeps_its_gather_in_one_half_and_the_bf16_spec_in_two():
    s = spec.load(FP8_SPEC)
    for paged in (False, True):
        for fmt in ("fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0"):
            v = resources.feasible_default(s, SM90A, {"d_qk": 576, "paged": paged, "kv_format": fmt})
            assert v is not None and resources.check(v, SM90A).ok, resources.check(v, SM90A).reasons
    assert not resources.check(variant.default(s), arch.TARGETS["sm_80"]).ok
    assert resources.check(variant.default(spec.load("mla_sparse_prefill_sm90")), SM90A).ok


def test_existing_specs_keep_their_symbols_and_axes():
    # No compute axis was added to the bf16-mode specs: their kernels, symbols and records stay.
    s = spec.load("mla_sparse_prefill_sm90")
    assert [k for k, _ in s.specialize] == ["d_qk", "paged", "kv_format"]
    assert variant.default(s).symbol.startswith("mla_sparse_prefill_sm90_576_0_bf16_")
    call = SimpleNamespace(d_qk=576, page_size=64, kv_format="fp8_v32", compute="fp8", heads=64, topk=2048)
    assert fam.specialization(call) == {"d_qk": 576, "paged": True, "kv_format": "fp8_v32"}


@pytest.mark.parametrize("values", [{}, {"kv_format": "fp8_b0"}, {"paged": True}, {"paged": True, "kv_format": "fp8_b0"},
                                    {"kv_format": "fp8_b64"}, {"paged": True, "kv_format": "fp8_b32"}])
def test_fp8_spec_variants_render_and_compile_without_spills(values):
    """The default variant and the fp8_b0 / b64 / b32 / paged specialisations, rendered and compiled for
    sm_90a with NVRTC: no spills, the resource model's shared memory (the template asserts it)."""
    from mlagen.compiler import for_target

    s = spec.load(FP8_SPEC)
    v = resources.feasible_default(s, SM90A, {"d_qk": 576, "paged": False, "kv_format": "fp8_v32", **values})
    src = render.render(v)
    assert src.text == render.render(v).text and "struct Params" in src.text
    assert "const mlagen::u8* kv;" in src.text
    fmt = fam.kv_format_of(v["kv_format"])
    assert f"kKvRowBytes = {fmt.row_bytes};" in src.text
    b = for_target("sm_90a").compile(src, "sm_90a")
    assert b.resources.spill_stores == 0 and b.resources.spill_loads == 0, b.log


def test_mlagen_check_builds_the_fp8_spec():
    from mlagen import check

    items = [i for i in check.items(specs=[FP8_SPEC])]
    assert {(i.variant["kv_format"], i.variant["paged"]) for i in items} == {
        (f, paged) for f in ("fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0") for paged in (False, True)}
    assert all(i.target == "sm_90a" and "default" in i.why for i in items)


# --- matching: a spec serves one mode ----------------------------------------------------------


def _call(compute="bf16", kv_format="fp8_v32", heads=64, page_size=64, d_qk=576):
    return SimpleNamespace(d_qk=d_qk, page_size=page_size, kv_format=kv_format, compute=compute, heads=heads,
                           topk=2048)


def test_accepts_never_crosses_modes():
    specs = family_specs("mla_sparse_prefill")
    for s in specs:
        mode = fam.spec_compute(s)
        for fmt in dict(s.specialize)["kv_format"]:
            for page_size in (0, 64):
                same = _call(mode, fmt, page_size=page_size)
                other = _call("fp8" if mode == "bf16" else "bf16", fmt, page_size=page_size)
                assert fam.accepts(s, same), (s.name, fmt)
                assert not fam.accepts(s, other), (s.name, fmt)
    # A call without a compute attribute (older code, a bare Shape-like) is a bf16-mode call.
    legacy = SimpleNamespace(d_qk=576, page_size=0, kv_format="fp8_v32")
    assert [s.name for s in specs if fam.accepts(s, legacy)] == [
        s.name for s in specs if fam.spec_compute(s) == "bf16" and "fp8_v32" in dict(s.specialize)["kv_format"]]
    assert [s.name for s in specs if fam.accepts(s, _call("fp8", "fp8_v32"))] == [FP8_SPEC]
    assert [s.name for s in specs if fam.accepts(s, _call("fp8", "fp8_b64"))] == [FP8_SPEC]
    assert [s.name for s in specs if fam.accepts(s, _call("fp8", "bf16"))] == []


def test_the_bench_tools_bf16_twin_is_never_the_fp8_spec():
    # bench_sparse._spec_reading names the spec dispatch takes for compute="bf16" calls.
    names = [s.name for s in family_specs("mla_sparse_prefill")
             if fam.spec_compute(s) == "bf16" and "fp8_v32" in dict(s.specialize)["kv_format"]]
    assert FP8_SPEC not in names and "mla_sparse_prefill_sm90" in names


# --- argument errors ----------------------------------------------------------------------------


def _cpu_args(kv_format="fp8_v32"):
    q = torch.zeros(2, 4, 576, dtype=torch.bfloat16)
    kv = torch.zeros(4, 64, 656, dtype=torch.uint8) if kv_format != "bf16" else torch.zeros(300, 576, dtype=torch.bfloat16)
    idx = torch.zeros(2, 8, dtype=torch.int32)
    return q, kv, idx


@pytest.mark.parametrize("compute, kv_format, exc, pattern", [
    (1, "fp8_v32", TypeError, r"compute: expected a string, one of \['bf16', 'fp8'\], got 1"),
    (None, "fp8_v32", TypeError, r"compute: expected a string"),
    ("fp16", "fp8_v32", ValueError, r"compute: 'fp16' is not one of \['bf16', 'fp8'\]"),
    ("FP8", "fp8_v32", ValueError, r"compute: 'FP8' is not one of"),
    ("fp8", "bf16", ValueError, r"compute: 'fp8' needs an FP8 cache: kv_format one of \['fp8_v32', 'fp8_b64', "
                                r"'fp8_b32', 'fp8_b0'\].*got kv_format 'bf16'"),
])
def test_bad_compute_names_the_argument(compute, kv_format, exc, pattern):
    q, kv, idx = _cpu_args(kv_format)
    for call in (lambda: fam.prepare(q, kv, idx, softmax_scale=0.1, kv_format=kv_format, compute=compute),
                 lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=0.1, kv_format=kv_format, compute=compute)):
        with pytest.raises(exc, match=pattern) as info:
            call()
        assert "\n" not in str(info.value) and str(info.value).startswith("mla_sparse_prefill: compute: ")
        assert isinstance(info.value, LaunchError) or exc is TypeError


def test_a_format_no_fp8_mode_spec_reads_is_refused():
    # Every packaged quantized format has an fp8-mode kernel now; the check reads the specs, so a
    # format without one (here: the specs as if only V3.2's and unscaled rows were built) is named.
    only = lambda compute: ("fp8_v32", "fp8_b0")  # noqa: E731
    for fmt in ("fp8_b64", "fp8_b32"):
        with pytest.raises(ValueError, match=rf"compute: 'fp8' reads kv_format \['fp8_v32', 'fp8_b0'\], got "
                                             rf"kv_format '{fmt}' \(compute='bf16' reads it"):
            fam.check_compute("fp8", fmt, only)
    assert fam.check_compute("fp8", "fp8_v32", only) == "fp8"


def test_good_compute_passes_to_the_next_check():
    # Checked before the tensors (like kv_format), so a valid mode reaches the CUDA check.
    rows = {"fp8_b0": 640, "fp8_b64": 672, "fp8_b32": 704}
    for compute, kv_format in (("fp8", "fp8_v32"), ("fp8", "fp8_b0"), ("fp8", "fp8_b64"), ("fp8", "fp8_b32"),
                               ("bf16", "fp8_b64"), ("bf16", "bf16")):
        q, kv, idx = _cpu_args(kv_format)
        if kv_format in rows:
            kv = torch.zeros(4, 64, rows[kv_format], dtype=torch.uint8)
        with pytest.raises(ValueError, match="q: must be a CUDA tensor"):
            fam.prepare(q, kv, idx, softmax_scale=0.1, kv_format=kv_format, compute=compute)


def test_a_kernel_of_the_other_mode_is_refused_by_name():
    call = SimpleNamespace(compute="fp8")
    with pytest.raises(ValueError, match=r"kernel: spec mla_sparse_prefill_sm90 computes in 'bf16' mode.*"
                                         r"compute='fp8'"):
        fam._check_mode(spec.load("mla_sparse_prefill_sm90"), call, "spec mla_sparse_prefill_sm90")
    fam._check_mode(spec.load(FP8_SPEC), call, "x")
    with pytest.raises(ValueError, match=r"computes in 'fp8' mode.*compute='bf16'"):
        fam._check_mode(spec.load(FP8_SPEC), SimpleNamespace(compute="bf16"), "x")


def test_flash_mla_sparse_fwd_keeps_its_signature():
    import inspect

    params = list(inspect.signature(mlagen.flash_mla_sparse_fwd).parameters)
    assert params == ["q", "kv", "indices", "sm_scale", "d_v", "attn_sink", "topk_length"]
    sig = inspect.signature(mlagen.mla_sparse_prefill)
    assert sig.parameters["compute"].default == "bf16" and sig.parameters["compute"].kind is inspect.Parameter.KEYWORD_ONLY


def test_the_ops_take_compute_last_with_its_default():
    from mlagen.families.mla_sparse_prefill import op

    schema = str(op._op._opoverload._schema)
    assert schema.endswith('str kv_format, str compute="bf16") -> (Tensor, Tensor, Tensor)'), schema
    schema_out = str(op._op_out._opoverload._schema)
    assert 'Tensor(a10!) lse, str compute="bf16") -> ()' in schema_out, schema_out


# --- problem keys ------------------------------------------------------------------------------


def test_problem_keys_carry_the_mode_only_when_it_is_fp8():
    k = fam.ProblemKey(576, 128, 2048, "paged", "fp8_v32", "fp8")
    assert str(k) == "d576/h128/k2048/paged/fp8_v32/fp8" and fam.ProblemKey.parse(str(k)) == k
    for text in ("d576/h128/k2048/flat", "d512/h16/k64/paged", "d576/h128/k2048/paged/fp8_v32",
                 "d576/h1/k1/flat/fp8_b0", "d576/h128/k2048/flat/fp8_b0/fp8"):
        key = fam.ProblemKey.parse(text)
        assert str(key) == text
    assert fam.ProblemKey.parse("d576/h128/k2048/flat").compute == "bf16"
    assert fam.ProblemKey.parse("d576/h128/k2048/paged/fp8_v32").compute == "bf16"
    bf = fam.ProblemKey(576, 128, 2048, "paged", "fp8_v32")
    assert k.distance(bf) == bf.distance(k) == math.inf
    assert k.distance(fam.ProblemKey(576, 64, 2048, "paged", "fp8_v32", "fp8")) == 1
    for bad in ("d576/h128/k2048/paged/fp8_v32/bf16",   # the bf16 mode is never written
                "d576/h128/k2048/paged/bf16/fp8",       # no fp8 mode on bf16 rows
                "d576/h128/k2048/paged/fp8_v32/fp16", "d576/h128/k2048/paged/fp8_v32/fp8/x"):
        with pytest.raises(ValueError, match="not a sparse problem key"):
            fam.ProblemKey.parse(bad)


def test_problem_key_of_calls_and_shapes():
    assert str(fam.problem_key(_call("fp8", "fp8_v32", heads=100))) == "d576/h128/k2048/paged/fp8_v32/fp8"
    assert str(fam.problem_key(_call("bf16", "fp8_v32", heads=100))) == "d576/h128/k2048/paged/fp8_v32"
    legacy = SimpleNamespace(d_qk=576, heads=16, topk=2048, page_size=0)   # no kv_format, no compute
    assert str(fam.problem_key(legacy)) == "d576/h16/k2048/flat"
    f = fam.FAMILY
    assert f.problem_specialization("d576/h128/k2048/paged/fp8_v32/fp8") == {
        "d_qk": 576, "paged": True, "kv_format": "fp8_v32"}
    assert f.problem_distance("d576/h128/k2048/flat/fp8_v32/fp8", "d576/h128/k2048/flat/fp8_v32") == math.inf


def test_shipped_records_parse_as_before():
    from mlagen import db

    shipped = [b for b in db.shipped_records() if b.key.family == "mla_sparse_prefill"]
    assert shipped
    for b in shipped:
        key = fam.ProblemKey.parse(b.key.problem)
        assert str(key) == b.key.problem and key.compute == "bf16"
    # check --gpu times an fp8-mode class on S1's sizes read from the format, in that mode.
    got = fam.FAMILY.check_shapes("d576/h128/k2048/flat/fp8_v32/fp8")
    assert [(s.id, s.kv_format, s.compute) for s in got] == [("S1", "fp8_v32", "fp8")]


# --- shapes, inputs, reference and tolerances -----------------------------------------------------


def test_shape_text_carries_compute():
    f = fam.FAMILY
    s = f.parse_shape("sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32,compute=fp8")
    assert (s.kv_format, s.compute) == ("fp8_v32", "fp8")
    text = f.describe_shape(s)
    assert text.endswith(",kv=fp8_v32,compute=fp8") and f.parse_shape(text) == fam.Shape(text, **{
        k: getattr(s, k) for k in ("sq", "heads", "topk", "s_kv", "d_qk", "sink", "kv_format", "compute")})
    assert f.problem_key(s) == "d576/h128/k2048/flat/fp8_v32/fp8"
    assert f.specialization(s) == {"d_qk": 576, "paged": False, "kv_format": "fp8_v32"}
    assert f.check_shape(s).compute == "fp8" and f.check_shape(s).kv_format == "fp8_v32"
    plain = f.parse_shape("sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32")
    assert plain.compute == "bf16" and "compute" not in f.describe_shape(plain)
    assert f.parse_shape("sq=1,h=1,topk=1,skv=1,compute=bf16").compute == "bf16"
    assert f.parse_shape("sq=1,h=1,topk=1,skv=64,kv=fp8_b0,compute=fp8").compute == "fp8"


@pytest.mark.parametrize("text, pattern", [
    ("sq=1,h=1,topk=1,skv=1,compute=fp8", r"compute=fp8 needs kv= one of \['fp8_v32', 'fp8_b64', 'fp8_b32', "
                                          r"'fp8_b0'\].*got kv=bf16"),
    ("sq=1,h=1,topk=1,skv=1,kv=fp8_v32,compute=fp4", r"compute must be one of \['bf16', 'fp8'\], got 'fp4'"),
    ("sq=1,h=1,topk=1,skv=1,d=512,compute=fp8", r"compute=fp8 needs kv="),
])
def test_bad_shape_text_is_refused(text, pattern):
    with pytest.raises(ValueError, match=pattern):
        fam.FAMILY.parse_shape(text)
    from mlagen.errors import ShapeError
    from mlagen.shapes import parse_shape

    with pytest.raises(ShapeError):
        parse_shape(text, "mla_sparse_prefill")


def test_tune_inputs_call_the_fp8_mode_and_verify_at_its_tolerances():
    f = fam.FAMILY
    shape = f.parse_shape("sq=3,h=2,topk=5,skv=70,kv=fp8_v32,compute=fp8")
    inp = f.make_inputs(shape, "cpu", seed=1)
    assert inp["compute"] == "fp8" and inp["kv_format"] == "fp8_v32" and inp["kv"].dtype == torch.uint8
    assert "compute" not in f.make_inputs(f.parse_shape("sq=3,h=2,topk=5,skv=70,kv=fp8_v32"), "cpu", seed=1)
    ref = f.reference(shape, inp)
    assert isinstance(ref, fam.Reference) and ref.compute == "fp8"
    # The reference is the one with Q as the kernel rounds it, on fp32-dequantized rows (kv_format),
    # not on bf16-rounded ones.
    want = fam.reference(fam.quantize_q_fp8(inp["q"]), inp["kv"], inp["indices"], softmax_scale=inp["softmax_scale"],
                         attn_sink=inp["attn_sink"], kv_format="fp8_v32")
    assert all(torch.equal(a, b) for a, b in zip(ref, want))
    # 3% relative error in out: wrong for the bf16 mode, within the fp8 mode's tolerance.
    noisy = ref[0] * (1 + 0.03 * torch.randn(ref[0].shape, generator=torch.Generator().manual_seed(2), dtype=ref[0].dtype))
    got = (noisy.to(torch.bfloat16), ref[1].float(), ref[2].float())
    assert f.compare(got, ref).ok, f.compare(got, ref).problem
    bf16_ref = fam.Reference(tuple(ref), "bf16")
    assert not f.compare(got, bf16_ref).ok and "relative L2 error" in f.compare(got, bf16_ref).problem
    assert not fam.compare(got, tuple(ref)).ok           # a plain tuple: the bf16 tolerances
    assert fam.compare(got, tuple(ref), compute="fp8").ok
    # Beyond the fp8 tolerance, and an lse off by more than FP8_STAT_TOL * (1 + |lse|).
    worse = (ref[0] * 1.2).to(torch.bfloat16)
    assert "relative L2 error" in f.compare((worse, got[1], got[2]), ref).problem
    lse_off = ref[2] + 2 * fam.FP8_STAT_TOL * (1 + ref[2].abs())
    assert "lse error" in f.compare((got[0], got[1], lse_off.float()), ref).problem
    # The calls the tuner makes pass compute on (FAMILY.call reads it from the inputs).
    seen = {}
    real_run = fam.run
    try:
        fam.run = lambda *a, **kw: seen.update(kw)
        f.call(inp)
    finally:
        fam.run = real_run
    assert seen["compute"] == "fp8" and seen["kv_format"] == "fp8_v32"
    import pickle

    back = pickle.loads(pickle.dumps(ref))
    assert isinstance(back, fam.Reference) and back.compute == "fp8"


def test_the_fp8_tolerances_live_in_one_place():
    assert fam.TOLERANCES == {"bf16": (fam.REL_TOL, fam.STAT_TOL), "fp8": (fam.FP8_REL_TOL, fam.FP8_STAT_TOL)}
    # Tighter than the bf16-rounding-free claim would allow for lse: Q's rounding is in the reference.
    assert fam.REL_TOL < fam.FP8_REL_TOL and fam.STAT_TOL < fam.FP8_STAT_TOL < fam.FP8_REL_TOL


def test_quantize_q_fp8_is_e4m3_times_a_power_of_two_per_head():
    g = torch.Generator().manual_seed(3)
    q = (torch.randn((5, 7, 576), generator=g) * torch.logspace(-3, 3, 7)[None, :, None]).to(torch.bfloat16)
    q[1, 2] = 0  # an all-zero head: scale 1, zeros stay zeros
    got = fam.quantize_q_fp8(q)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    assert torch.equal(got[..., 512:], q[..., 512:])  # the rope is untouched
    lat, qlat = got[..., :512].float(), q[..., :512].float()
    amax = qlat.abs().amax(-1, keepdim=True)
    qs = torch.where(amax > 0, torch.exp2(torch.ceil(torch.log2(amax / 448))), torch.ones_like(amax))
    assert torch.all(torch.log2(qs) == torch.round(torch.log2(qs)))
    scaled = lat / qs
    assert scaled.abs().max() <= 448
    assert torch.equal(scaled.to(torch.float8_e4m3fn).float(), scaled)  # every value is an e4m3 value
    # Round to nearest: within half an e4m3 step (2^-4 relative, 2^-10 absolute below 2^-6).
    err = (scaled - qlat / qs).abs()
    assert torch.all(err <= torch.maximum(2.0 ** -4 * (qlat / qs).abs(), torch.full_like(err, 2.0 ** -10)) + 1e-6)
    assert torch.equal(got[1, 2], torch.zeros_like(got[1, 2]))


def test_fp8_q_logit_bound_covers_q_rounding():
    g = torch.Generator().manual_seed(4)
    q = torch.randn((6, 3, 576), generator=g).to(torch.bfloat16)
    rows = torch.randn((50, 576), generator=g) * torch.logspace(-2, 2, 50)[:, None]
    idx = torch.randint(-5, 60, (6, 17), generator=g, dtype=torch.int32)
    length = torch.tensor([17, 3, 0, 17, 9, 1], dtype=torch.int32)
    bound = fam.fp8_q_logit_bound(q, rows, idx, length, 0.1)
    qq = fam.quantize_q_fp8(q)
    ok = (idx >= 0) & (idx < 50) & (torch.arange(17)[None, :] < length[:, None])
    k = rows[idx.long().clamp(0, 49)]
    moved = (torch.einsum("shd,std->sht", (q.float() - qq.float()), k) * 0.1).abs().masked_fill(~ok[:, None, :], 0)
    assert torch.all(moved.amax(-1) <= bound + 1e-5)
    assert torch.all(bound[2] == 0) and torch.all(bound[0] > 0)


def test_the_tuner_refuses_a_spec_of_the_other_mode():
    f = fam.FAMILY
    fp8_shape = f.parse_shape("sq=64,h=64,topk=256,skv=1024,kv=fp8_v32,compute=fp8")
    bf16_shape = f.parse_shape("sq=64,h=64,topk=256,skv=1024,kv=fp8_v32")
    assert f.refuses(spec.load(FP8_SPEC), fp8_shape) is None
    assert f.refuses(spec.load("mla_sparse_prefill_sm90"), bf16_shape) is None
    why = f.refuses(spec.load("mla_sparse_prefill_sm90"), fp8_shape)
    assert "compute=fp8" in why and FP8_SPEC in why
    why = f.refuses(spec.load(FP8_SPEC), bf16_shape)
    assert "compute=bf16" in why and "'fp8' mode" in why and "mla_sparse_prefill_sm90" in why
    assert "kv_format" in f.refuses(spec.load("mla_sparse_prefill_sm80"), bf16_shape)

    from mlagen.errors import TuningError
    from mlagen.tune import TuneConfig, tune

    config = TuneConfig(spec=FP8_SPEC, shapes=("sq=64,h=64,topk=256,skv=1024,kv=fp8_v32",), target="sm_90a")
    with pytest.raises(TuningError, match=r"mla_sparse_prefill_sm90_fp8 cannot tune d576/h64/k256/flat/fp8_v32"):
        tune(config, progress=lambda line: None)


def test_the_fp8_compute_matrix():
    cases = bench_sparse.fp8_compute_cases()
    formats = set(fam.compute_kv_formats("fp8"))
    assert {c["kv_format"] for c in cases} == formats
    # The bf16 mode's FP8 matrix, restricted to the formats the fp8 mode reads, comes first.
    sub = [c for c in bench_sparse.fp8_cases() if c.get("kv_format", "fp8_v32") in formats]
    assert cases[:len(sub)] == sub
    grid = {(c["heads"], c["topk"]) for c in cases}
    assert grid >= {(h, k) for h in (1, 5, 16, 64, 128) for k in (1, 33, 640, 2048)}
    assert {c.get("sink", "none") for c in cases} >= {"none", "finite", "+inf", "-inf"}
    assert {bench_sparse.FP8_LAYOUTS[c.get("kv", "p64")][0] for c in cases} == {1, 64}
    assert any(c.get("invalid") == 1.0 for c in cases) and any(c.get("topk_length") for c in cases)
    assert any(c.get("spread", 2.0) >= 6 for c in cases) and {c.get("scales", "fp32") for c in cases} == {"fp32", "ue8m0"}


# --- the torch op traced with compute="fp8" (CPU kernel, no GPU) ----------------------------------

COMPILE_SCRIPT = textwrap.dedent("""
    import torch, mlagen
    from mlagen import operands
    from mlagen.families import mla_sparse_prefill as fam
    from mlagen.families.mla_sparse_prefill import op

    seen = []

    # A CPU kernel (the reference), registered in this process only, so the op runs here.
    @op._op.register_kernel("cpu")
    def _cpu(q, kv, indices, scale, length, sink, kernel, kv_format, compute="bf16"):
        seen.append(compute)
        o, m, l = fam.reference(q, kv, indices, softmax_scale=scale, topk_length=length, attn_sink=sink,
                                kv_format=kv_format, dtype=torch.float32)
        return o.to(torch.bfloat16), m, l

    @op._op_out.register_kernel("cpu")
    def _cpu_out(q, kv, indices, scale, length, sink, kernel, kv_format, out, max_logits, lse, compute="bf16"):
        o, m, l = _cpu(q, kv, indices, scale, length, sink, kernel, kv_format, compute)
        out.copy_(o)
        max_logits.copy_(m)
        lse.copy_(l)

    g = torch.Generator().manual_seed(0)
    fmt = operands.get("fp8_v32")
    cache = operands.quantize(torch.randn(128, 576, generator=g), fmt).view(2, 64, 656)
    q = torch.randn(5, 3, 576, generator=g).to(torch.bfloat16)
    idx = torch.randint(-1, 128, (5, 40), generator=g, dtype=torch.int32)

    def layer(q, cache, idx):
        out, ml, lse = mlagen.mla_sparse_prefill(q * 2, cache, idx, softmax_scale=0.05, kv_format="fp8_v32",
                                                 compute="fp8")
        return out.float().sum(-1) + lse

    def layer_out(q, cache, idx):
        out = torch.empty(5, 3, 512, dtype=torch.bfloat16)
        mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=0.05, kv_format="fp8_v32", compute="fp8", out=out)
        return out.float() * 3

    def eager(fn):
        traced = op._tracing
        op._tracing = lambda q: True
        try:
            return fn(q, cache, idx)
        finally:
            op._tracing = traced

    for fn in (layer, layer_out):
        explain = torch._dynamo.explain(fn)(q, cache, idx)
        assert explain.graph_break_count == 0 and explain.graph_count == 1, explain
        torch._dynamo.reset()
        seen.clear()
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        got = compiled(q, cache, idx)
        assert seen and set(seen) == {"fp8"}, seen
        assert torch.equal(got, eager(fn)), fn.__name__
    try:
        bf16_kv = torch.zeros(64, 576, dtype=torch.bfloat16)
        torch.compile(lambda q: mlagen.mla_sparse_prefill(q, bf16_kv, idx, softmax_scale=0.05, compute="fp8"),
                      fullgraph=True, backend="aot_eager")(q)
        raise SystemExit("no error")
    except Exception as exc:
        assert "compute: 'fp8' needs an FP8 cache" in str(exc), exc
    args = (q, cache, idx, 0.05, None, None, None, "fp8_v32", "fp8")
    for name, result in torch.library.opcheck(op._op, args).items():
        assert result == "SUCCESS", (name, result)
    print("ok")
""")


@pytest.mark.slow
def test_torch_compile_traces_compute_fp8_without_a_graph_break():
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-3000:] + proc.stderr[-5000:]


def test_the_bench_legend_quotes_each_shapes_tolerance():
    from types import SimpleNamespace

    from mlagen import bench

    f = fam.FAMILY
    bf16 = f.parse_shape("sq=3,h=2,topk=5,skv=70,kv=fp8_v32")
    fp8 = f.parse_shape("sq=3,h=2,topk=5,skv=70,kv=fp8_v32,compute=fp8")
    assert f.tolerance_for(bf16) == fam.REL_TOL and f.tolerance_for(fp8) == fam.FP8_REL_TOL
    one = [SimpleNamespace(shape=bf16, family=f)]
    assert bench._tolerances(one) == f"{fam.REL_TOL:g}"
    both = one + [SimpleNamespace(shape=fp8, family=f)]
    assert bench._tolerances(both) == f"{fam.REL_TOL:g} ({bf16.id}), {fam.FP8_REL_TOL:g} ({fp8.id})"
