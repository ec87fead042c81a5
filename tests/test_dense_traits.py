"""Dense MLA prefill's traits without a GPU (MLA.md section 1b): the geometry, mask and score
specialisations of the sm90 spec render and compile for sm_90a without spills, the shape grammar
and problem keys name them, the public call checks their arguments, and the float32 reference
implements each trait consistently (against brute force, and against the identities the traits
must keep). tests/gpu/test_dense_traits_gpu.py runs the kernels."""

from __future__ import annotations

import itertools
import math

import pytest

from mlagen import render, resources, variant
from mlagen import arch
from mlagen import spec as spec_mod
from mlagen.errors import ArgumentError, ArgumentTypeError, ShapeError
from mlagen.families.mla_prefill import problem

S90 = spec_mod.load("mla_prefill_sm90")
SM90A = arch.target("sm_90a")
AXES = dict(S90.specialize)


# --- specs and kernels -------------------------------------------------------------------------


def test_the_spec_names_the_geometries_masks_and_scores_of_the_family():
    assert AXES["mask"] == problem.MASKS
    assert AXES["geometry"] == tuple(problem.GEOMETRIES)
    assert AXES["score"] == problem.SCORES


@pytest.mark.parametrize("geometry", list(problem.GEOMETRIES))
def test_geometry_widths_and_a_fitting_default(geometry):
    v = resources.feasible_default(S90, SM90A, {"mask": "causal", "geometry": geometry})
    env = v.env()
    assert (env["d_nope"], env["d_rope"], env["d_v"]) == problem.GEOMETRIES[geometry]
    assert resources.check(v, SM90A).ok
    assert resources.estimate(v).smem_bytes <= 227 * 1024
    if geometry == "n192r64v256":   # 256-wide V: FlashAttention-3's tile for 256 (128 x 80, two stages)
        assert (v["block_n"], v["consumers"], v["stages"], v["consumer_regs"]) == (80, 2, 2, 240)


def test_old_kernels_keep_their_tunables_and_render_the_same_config():
    old = variant.make(S90, {"mask": "causal"})
    assert old.specialization == {"mask": "causal", "geometry": "n128r64v128", "score": "plain"}
    text = render.render(old).text
    assert "kMask = mlagen::MaskKind::kCausal" in text and "kSoftcap = false" in text and "kSink = false" in text
    assert "kDNope = 128" in text and "kDRope = 64" in text and "kDV = 128" in text


@pytest.mark.parametrize("mask,geometry,score", list(itertools.product(AXES["mask"], AXES["geometry"], AXES["score"])))
def test_every_specialisation_renders_its_traits(mask, geometry, score):
    v = resources.feasible_default(S90, SM90A, {"mask": mask, "geometry": geometry, "score": score})
    assert v is not None
    text = render.render(v).text
    camel = "".join(p.capitalize() for p in mask.split("_"))
    assert f"kMask = mlagen::MaskKind::k{camel};" in text
    assert f"kSoftcap = {'true' if 'softcap' in score else 'false'};" in text
    assert f"kSink = {'true' if 'sink' in score else 'false'};" in text
    d_nope, d_rope, d_v = problem.GEOMETRIES[geometry]
    assert f"kDNope = {d_nope};" in text and f"kDRope = {d_rope};" in text and f"kDV = {d_v};" in text
    assert v.symbol.startswith(f"mla_prefill_sm90_{mask}_{geometry}_{score}_")
    assert variant.from_symbol(S90, v.symbol) == v


def test_window_and_chunked_refuse_clusters():
    v = variant.make(S90, {"mask": "window", "cluster": 2, "scheduler": "static"})
    assert not resources.check(v, SM90A).ok
    assert resources.check(variant.make(S90, {"mask": "causal", "cluster": 2, "scheduler": "static"}), SM90A).ok


def test_glm5_register_budget_constraint():
    big = variant.make(S90, {"geometry": "n192r64v256", "block_n": 80, "consumer_regs": 224})
    assert any("d_v 256" in r for r in resources.check(big, SM90A).reasons)


# Every (mask, geometry) with the plain score, and each other score on the window mask (the most
# code: both bounds, the lower masked tiles) of each geometry.
COMPILED = ([(m, g, "plain") for m in AXES["mask"] for g in AXES["geometry"]]
            + [("window", g, s) for g in AXES["geometry"] for s in AXES["score"] if s != "plain"])


@pytest.fixture(scope="module")
def nvrtc(tmp_path_factory):
    from mlagen.backends import cuda

    tmp = tmp_path_factory.mktemp("traits")
    return cuda.NvrtcCompiler(cache_dir=tmp / "cache", source_dir=tmp / "src")


@pytest.mark.parametrize("mask,geometry,score", COMPILED)
def test_specialisations_compile_for_sm90a_without_spills(nvrtc, mask, geometry, score):
    v = resources.feasible_default(S90, SM90A, {"mask": mask, "geometry": geometry, "score": score})
    b = nvrtc.compile(render.render(v), "sm_90a")
    assert b.data[:4] == b"\x7fELF" and v.symbol.encode() in b.data
    r = b.resources
    assert not r.spills and r.stack_bytes == 0, (v.symbol, r)


# --- shapes and problem keys -------------------------------------------------------------------


@pytest.mark.parametrize("text,mask,geometry,score", [
    ("b=1,q=8192,h=64,d=192/64/256,causal", "causal", "n192r64v256", "plain"),
    ("b=1,q=16384,h=16,window=4095/0", "window", "n128r64v128", "plain"),
    ("b=4,q=4096,h=16,chunk=1000", "chunked", "n128r64v128", "plain"),
    ("b=1,q=4096,h=8,d=128/0/128,none,softcap=30,sink", "none", "n128r0v128", "softcap_sink"),
])
def test_descriptions_round_trip_with_traits(text, mask, geometry, score):
    shape = problem.parse_shape(text)
    assert (shape.mask, shape.geometry, shape.score) == (mask, geometry, score)
    assert problem.describe_shape(shape) == text
    assert problem.parse_shape(shape.describe_text()) == shape
    key = problem.shape_key(shape)
    assert problem.ProblemKey.parse(str(key)) == key
    assert key.specialization()["mask"] == mask


def test_description_mask_rules_follow_flash_attention():
    assert problem.parse_shape("q=100,h=2,window=10/5,causal").window == (10, 0)
    assert problem.parse_shape("q=100,h=2,window=-1/0").mask == "causal"
    assert problem.parse_shape("q=100,h=2,window=-1/-1").mask == "none"
    for bad, what in (("q=10,h=2,window=3", "window"), ("q=10,h=2,d=1/2/3", "d="), ("q=10,h=2,chunk=0", "chunk"),
                      ("q=10,h=2,softcap=-1", "softcap"), ("q=10,h=2,chunk=4,window=2/0", "exclude"),
                      ("q=10,h=2,sink,sink", "sink")):
        with pytest.raises(ShapeError, match=what):
            problem.parse_shape(bad)


def test_old_problem_keys_and_records_read_as_before():
    key = problem.ProblemKey.parse("causal/h128/q8192/k8192")
    assert (key.geometry, key.score) == ("n128r64v128", "plain")
    assert key.specialization() == {"mask": "causal"}
    glm = problem.ProblemKey.parse("causal+sink/h64/q8192/k8192/n192r64v256")
    assert str(glm) == "causal+sink/h64/q8192/k8192/n192r64v256"
    assert key.distance(glm) == math.inf and glm.distance(glm) == 0
    with pytest.raises(ValueError):
        problem.ProblemKey.parse("causal/h64/q8192/k8192/n1r2v3")


def test_flops_count_the_band():
    assert problem.band_pairs(5, 5, "window", (1, 0)) == 9
    assert problem.band_pairs(7, 7, "chunked", chunk=3) == 13
    assert problem.band_pairs(6, 9, "window", (-1, 0)) == problem.visible_pairs(6, 9, True)
    d8 = problem.parse_shape("q=8192,h=64,d=192/64/256")
    assert d8.flops() == 2 * 64 * (256 + 256) * 8192 * 8193 // 2


def test_family_check_shape_keeps_the_traits():
    from mlagen.families import mla_prefill

    shape = problem.parse_shape("q=4096,h=64,d=192/64/256,window=100/0,sink")
    check = mla_prefill.FAMILY.check_shape(shape)
    assert (check.mask, check.window, check.geometry, check.sink, check.heads) == ("window", (100, 0),
                                                                                    "n192r64v256", True, 16)
    assert [x.id for x in mla_prefill.FAMILY.check_shapes("causal/h64/q8192/k8192/n192r64v256")] == ["D8"]
    assert [x.id for x in mla_prefill.FAMILY.check_shapes("window/h16/q16384/k16384")] == ["D11"]
    described = mla_prefill.FAMILY.check_shapes("chunked+softcap/h16/q4096/k4096/n192r64v256")[0]
    assert (described.mask, described.geometry, described.score) == ("chunked", "n192r64v256", "softcap")


# --- arguments ---------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def _tensors(d_qk=192, d_v=128, d_nope=128, rope=64, heads=2, tq=5, tk=7):
    bf = torch.bfloat16
    q = torch.zeros(tq, heads, d_qk, dtype=bf)
    k = torch.zeros(tk, heads, d_nope, dtype=bf)
    kr = torch.zeros(tk, 1, rope, dtype=bf) if rope else None
    v = torch.zeros(tk, heads, d_v, dtype=bf)
    return q, k, kr, v


def test_geometry_follows_the_widths():
    from mlagen.families.mla_prefill.traits import geometry_of

    assert geometry_of(*_tensors()[:2], _tensors()[3], _tensors()[2]) == "n128r64v128"
    q, k, kr, v = _tensors(256, 256, 192)
    assert geometry_of(q, k, v, kr) == "n192r64v256"
    assert geometry_of(q, torch.cat([k, kr.expand(-1, 2, -1)], -1), v, None) == "n192r64v256"
    q, k, _, v = _tensors(128, 128, 128, 0)
    assert geometry_of(q, k, v, None) == "n128r0v128"
    with pytest.raises(ArgumentError, match="mla_prefill: q: last dimension 160"):
        geometry_of(torch.zeros(1, 1, 160), k, v, None)
    with pytest.raises(ArgumentError, match="mla_prefill: k_rope: "):
        geometry_of(*_tensors()[:2], _tensors()[3], torch.zeros(7, 1, 32))


def test_check_arguments_take_each_geometry():
    from mlagen.families.mla_prefill.call import DenseArgs, check_arguments

    q, k, kr, v = _tensors(256, 256, 192)
    assert check_arguments(torch, DenseArgs(q, k, v, kr))[4] == "shared"
    with pytest.raises(ArgumentError, match="mla_prefill: v: expected shape"):
        check_arguments(torch, DenseArgs(q, k, v[:1], kr))
    with pytest.raises(ArgumentError, match="mla_prefill: out: expected shape \\(5, 2, 256\\)"):
        check_arguments(torch, DenseArgs(q, k, v, kr, out=torch.zeros(5, 2, 128, dtype=torch.bfloat16)))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(window_size=(2,)), ArgumentTypeError, "window_size: expected a pair"),
    (dict(window_size=(2, -3)), ArgumentError, "window_size: each side"),
    (dict(window_size=(True, 0)), ArgumentTypeError, "window_size"),
    (dict(chunk_size=0), ArgumentError, "chunk_size: must be >= 1"),
    (dict(chunk_size=2.0), ArgumentTypeError, "chunk_size: expected an int"),
    (dict(chunk_size=4, window_size=(3, 0)), ArgumentError, "chunk_size: chunked attention excludes a window"),
    (dict(softcap=-1.0), ArgumentError, "softcap: must be"),
    (dict(softcap=math.inf), ArgumentError, "softcap: must be"),
    (dict(softcap="3"), ArgumentTypeError, "softcap: expected a float"),
    (dict(attn_sink=[1.0, 2.0]), ArgumentTypeError, "attn_sink: expected a float32"),
    (dict(attn_sink=torch.zeros(2, dtype=torch.float64)), ArgumentTypeError, "attn_sink: dtype"),
    (dict(attn_sink=torch.zeros(3)), ArgumentError, "attn_sink: expected shape \\[2\\]"),
])
def test_trait_arguments_are_checked(kwargs, error, match):
    from mlagen.families.mla_prefill.traits import check_traits

    with pytest.raises(error, match=f"mla_prefill: {match}"):
        check_traits(torch, torch.zeros(5, 2, 192), True, heads=2, **kwargs)


def test_trait_normalisation():
    from mlagen.families.mla_prefill.traits import check_traits

    q = torch.zeros(5, 2, 192)
    t = check_traits(torch, q, True, (10, 7), heads=2)
    assert (t.mask, t.window) == ("window", (10, 0))
    assert check_traits(torch, q, False, (-1, 0), heads=2).mask == "causal"
    assert check_traits(torch, q, False, (50, 50), heads=2, longest_k=40).mask == "none"
    assert check_traits(torch, q, True, chunk_size=64, heads=2, longest_k=64).mask == "causal"
    sink = check_traits(torch, q, False, softcap=3, attn_sink=torch.zeros(2), heads=2)
    assert sink.score == "softcap_sink" and sink.specialization() == {"mask": "none", "score": "softcap_sink"}


def test_public_call_refuses_bad_traits_before_any_launch():
    import mlagen

    q, k, kr, v = _tensors()
    with pytest.raises(ArgumentError, match="mla_prefill: window_size"):
        mlagen.mla_prefill(q, k, v, k_rope=kr, window_size=(0, -2))
    with pytest.raises(ArgumentError, match="mla_prefill: chunk_size"):
        mlagen.mla_prefill(q, k, v, k_rope=kr, chunk_size=-1)


def test_launch_values_of_the_traits():
    from mlagen.families.mla_prefill import tma
    from mlagen.families.mla_prefill.traits import Traits

    class C:
        scale = 0.125
        traits = Traits("n128r64v128", "window", (33, 4), 0, 10.0, None)

    values = tma.trait_values(C)
    assert (values["mask_left"], values["mask_right"], values["mask_chunk"]) == (33, 4, 1)
    assert values["softcap_scale"] == pytest.approx(0.0125)
    assert values["scale_log2"] == pytest.approx(10.0 / math.log(2))
    assert values["attn_sink"] == 0


def test_accepts_only_specs_with_the_traits():
    from mlagen.families.mla_prefill.compile import accepts
    from mlagen.families.mla_prefill.traits import Traits

    s80 = spec_mod.load("mla_prefill_sm80")

    class C:
        dtype = "bf16"
        traits = Traits()

        def tma_compatible(self):
            return None

    plain, window, glm = C(), C(), C()
    window.traits = Traits(mask="window", window=(3, 0))
    glm.traits = Traits(geometry="n192r64v256")
    assert accepts(s80, plain) and accepts(S90, plain)
    assert not accepts(s80, window) and accepts(S90, window)
    assert not accepts(s80, glm) and accepts(S90, glm)


# --- the reference -----------------------------------------------------------------------------

from mlagen.families.mla_prefill import reference as ref  # noqa: E402


def _brute(q, k, v, positions, visible_fn, scale, softcap=0.0, sink=None):
    """Row by row, key by key, in float64."""
    lq, heads, _ = q.shape
    out = torch.zeros(lq, heads, v.shape[2], dtype=torch.float64)
    lse = torch.full((lq, heads), math.inf, dtype=torch.float64)
    for i in range(lq):
        keys = [j for j in range(k.shape[0]) if visible_fn(int(positions[i]), j)]
        if not keys:
            continue
        for h in range(heads):
            s = torch.stack([(q[i, h].double() @ k[j, h].double()) * scale for j in keys])
            if softcap:
                s = softcap * torch.tanh(s / softcap)
            m = s.max()
            e = torch.exp(s - m)
            den = e.sum() + (math.exp(float(sink[h]) - float(m)) if sink is not None else 0.0)
            out[i, h] = (e.unsqueeze(1) * torch.stack([v[j, h].double() for j in keys])).sum(0) / den
            lse[i, h] = m + torch.log(e.sum())
    return out, lse


@pytest.mark.parametrize("mask,window,chunk", [
    ("causal", (-1, -1), 0), ("none", (-1, -1), 0), ("window", (3, 1), 0), ("window", (-1, 2), 0),
    ("window", (4, -1), 0), ("chunked", (-1, -1), 5)])
@pytest.mark.parametrize("lq,lk", [(9, 9), (6, 13), (11, 4)])
def test_reference_against_brute_force(mask, window, chunk, lq, lk):
    g = torch.Generator().manual_seed(lq * 31 + lk)
    q, k = torch.randn(lq, 2, 24, generator=g), torch.randn(lk, 2, 24, generator=g)
    v, sink = torch.randn(lk, 2, 16, generator=g), torch.randn(2, generator=g)
    left, right = window

    def visible(p, j):
        if mask == "causal":
            return j <= p
        if mask == "chunked":
            return j <= p and j // chunk == p // chunk
        if mask == "window":
            return (left < 0 or j >= p - left) and (right < 0 or j <= p + right)
        return True

    positions = torch.arange(lq) + lk - lq
    got = ref.reference(q, k, v, causal=mask == "causal", window_size=window, chunk_size=chunk or None, softcap=7.0,
                        attn_sink=sink, softmax_scale=0.3)
    want = _brute(q, k, v, positions, visible, 0.3, 7.0, sink)
    torch.testing.assert_close(got[0], want[0], atol=1e-9, rtol=1e-9)
    assert torch.equal(torch.isinf(got[1]), torch.isinf(want[1]))
    finite = torch.isfinite(want[1])
    torch.testing.assert_close(got[1][finite], want[1][finite], atol=1e-9, rtol=1e-9)


def test_reference_heads_chunks_rows_like_the_whole():
    shape = problem.parse_shape("q=[5,17,0,33],k=[9,17,4,40],h=3,d=192/64/256,window=6/2,softcap=20,sink")
    inputs = ref.make_inputs(shape, "cpu", 0)
    part = ref.reference_heads(shape, inputs, None, budget_bytes=4000)
    whole = ref.reference(inputs["q"], inputs["k"], inputs["v"], k_rope=inputs["k_rope"],
                          cu_seqlens_q=inputs["cu_seqlens_q"], cu_seqlens_k=inputs["cu_seqlens_k"], causal=False,
                          window_size=(6, 2), softcap=20.0, attn_sink=inputs["attn_sink"], dtype=torch.float32)
    torch.testing.assert_close(part[0], whole[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(part[1], whole[1], atol=1e-5, rtol=1e-5)


def test_reference_identities():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(10, 2, 8, generator=g), torch.randn(14, 2, 8, generator=g), torch.randn(14, 2, 4, generator=g)
    causal = ref.reference(q, k, v, causal=True)
    # A window unbounded on the left and 0 on the right is causal; a chunk as long as the keys too.
    assert torch.equal(ref.reference(q, k, v, causal=False, window_size=(-1, 0))[0], causal[0])
    assert torch.equal(ref.reference(q, k, v, causal=True, chunk_size=14)[0], causal[0])
    # A sink changes only the denominator: lse is unchanged, out is scaled per row.
    sink = torch.tensor([0.5, -1.0], dtype=torch.float64)
    with_sink = ref.reference(q, k, v, causal=True, attn_sink=sink)
    torch.testing.assert_close(with_sink[1], causal[1])
    factor = 1 / (1 + torch.exp(sink.reshape(1, 2) - causal[1]))
    torch.testing.assert_close(with_sink[0], causal[0] * factor.unsqueeze(-1))
    # A huge softcap is no cap.
    torch.testing.assert_close(ref.reference(q, k, v, causal=True, softcap=1e6)[0], causal[0], atol=1e-6, rtol=1e-6)
    # A row whose window misses every key: out 0, lse +inf, no NaN.
    out, lse = ref.reference(q[:3], k[:2], v[:2], causal=False, window_size=(0, 0), attn_sink=sink)
    assert torch.isinf(lse[:1]).all() and (out[:1] == 0).all() and torch.isfinite(lse[1:]).all()
    assert not torch.isnan(out).any()


# --- the tuner ---------------------------------------------------------------------------------


def test_a_glm5_description_tunes_as_its_own_class():
    """``mlagen tune --shapes "b=1,q=8192,h=64,d=192/64/256"``: the class carries the geometry, the
    search holds it fixed, and its first batch fits the device."""
    from mlagen.families import mla_prefill
    from mlagen.tune.loop import shape_classes
    from mlagen.tune.search import make_search

    fam = mla_prefill.FAMILY
    classes = shape_classes(["b=1,q=8192,h=64,d=192/64/256", "D1", "b=1,q=16384,h=16,window=4095/0"], fam)
    problems = [c.problem for c in classes]
    assert problems == ["causal/h64/q8192/k8192/n192r64v256", "causal/h128/q8192/k8192", "window/h16/q16384/k16384"]
    fixed = fam.specialization(classes[0].shape)
    assert fixed == {"mask": "causal", "geometry": "n192r64v256"}
    batch = make_search("global", S90, fixed, SM90A, 40, 0).next_batch()
    assert batch
    for v in (b for b in batch if isinstance(b, variant.Variant)):
        assert v["geometry"] == "n192r64v256" and v.env()["d_v"] == 256
        assert resources.check(v, SM90A).ok
    # The record the tune writes reads back as the class it was tuned for.
    assert fam.problem_specialization(problems[0]) == fixed
    assert fam.problem_specialization(problems[2]) == {"mask": "window"}


# --- the key-tile ranges of mask.cuh, transcribed ----------------------------------------------


def _band(mask, left, right, chunk, p, len_k):
    """(lo, hi_raw, hi) of Band<K> (mask.cuh) for position p."""
    if mask == "none":
        return 0, len_k, len_k
    if mask == "window":
        hi_raw = len_k if right < 0 else p + 1 + min(right, len_k - p - 1)
        lo = p - left if left >= 0 and p > left else 0
    else:
        hi_raw = p + 1
        lo = p // chunk * chunk if mask == "chunked" and p > 0 else 0
    return lo, hi_raw, min(len_k, hi_raw)


def _range(mask, left, right, chunk, row0, bm, bn, len_q, len_k):
    """set_band_range (and set_key_range for causal / none): n_begin, n_blocks, first_masked, lo_masked_end."""
    off = len_k - len_q
    lower = mask in ("window", "chunked")
    _, _, hi_last = _band(mask, left, right, chunk, row0 + bm - 1 + off, len_k)
    lo_first, hi_raw_first, _ = _band(mask, left, right, chunk, row0 + off, len_k)
    lo_last = _band(mask, left, right, chunk, row0 + bm - 1 + off, len_k)[0]
    n_end = -(-hi_last // bn) if hi_last > 0 else 0
    n_begin = min(lo_first // bn, n_end) if lower else 0
    first = len_k // bn
    if mask != "none":
        first = min(first, max(0, hi_raw_first // bn))
    lo_masked = -(-lo_last // bn) if lower else 0
    return n_begin, n_end - n_begin, first, lo_masked


@pytest.mark.parametrize("mask,left,right,chunk", [
    ("causal", -1, -1, 0), ("none", -1, -1, 0), ("window", 5, 0, 0), ("window", 200, 0, 0), ("window", 33, 17, 0),
    ("window", -1, 40, 0), ("window", 300, -1, 0), ("window", 0, 0, 0), ("chunked", -1, -1, 1),
    ("chunked", -1, -1, 100), ("chunked", -1, -1, 64)])
def test_visited_key_tiles_hold_every_visible_key_and_unmasked_tiles_only_visible_ones(mask, left, right, chunk):
    bm, bn = 128, 80
    for len_q, len_k in ((1, 1), (300, 333), (129, 129), (200, 150), (77, 500), (5, 0)):
        for row0 in range(0, len_q, bm):
            rows = min(bm, len_q - row0)
            n_begin, n_blocks, first, lo_masked = _range(mask, left, right, chunk, row0, bm, bn, len_q, len_k)
            assert n_blocks >= 0
            visited = range(n_begin, n_begin + n_blocks)
            for i in range(row0, row0 + rows):
                p = i + len_k - len_q
                lo, _, hi = _band(mask, left, right, chunk, p, len_k)
                for j in range(len_k):
                    seen = lo <= j < hi
                    want = {"causal": j <= p, "none": True,
                            "window": (left < 0 or j >= p - left) and (right < 0 or j <= p + right),
                            "chunked": j <= p and chunk and j // chunk == p // chunk}[mask]
                    assert seen == bool(want), (mask, len_q, len_k, i, j)
                    if seen:
                        assert j // bn in visited, (mask, len_q, len_k, row0, i, j)
                    elif j // bn in visited and not (j // bn >= first or j // bn < lo_masked):
                        pytest.fail(f"unmasked tile {j // bn} holds invisible key {j} of row {i} ({mask})")


@pytest.mark.parametrize("target,traits,match", [
    ("sm_80", dict(mask="window", window=(3, 0)), "window_size: mask window has bf16 kernels for sm_90a "
                                                  "\\(mla_prefill_sm90\\), not for sm_80"),
    ("sm_80", dict(geometry="n192r64v256"), "q: mask causal, geometry n192r64v256 has bf16 kernels for sm_90a"),
    ("sm_90a", dict(mask="chunked", chunk=8), None),
])
def test_traits_without_a_kernel_for_the_device_name_the_argument(monkeypatch, target, traits, match):
    import types

    from mlagen.families.mla_prefill import entry
    from mlagen.families.mla_prefill.traits import Traits

    monkeypatch.setattr(entry.runtime, "device_info", lambda device: types.SimpleNamespace(target=arch.target(target)))
    call = types.SimpleNamespace(dtype="bf16", traits=Traits(**traits))
    if match is None:
        entry.check_traits_supported(call, 0)
        return
    with pytest.raises(ArgumentError, match=f"mla_prefill: {match}"):
        entry.check_traits_supported(call, 0)
    with pytest.raises(ArgumentError, match="in mla_prefill_sm80"):
        entry.check_traits_supported(call, 0, spec_mod.load("mla_prefill_sm80"))


def test_traced_calls_carry_the_traits_through_the_op():
    """FakeTensors (what torch.compile traces with): the op's fake implementation gives GLM-5's
    256-wide output and checks the trait arguments like the eager call."""
    import mlagen
    from torch._subclasses.fake_tensor import FakeTensorMode

    bf = torch.bfloat16
    with FakeTensorMode():
        q = torch.empty(10, 4, 256, dtype=bf, device="cuda")
        k = torch.empty(12, 4, 192, dtype=bf, device="cuda")
        k_rope = torch.empty(12, 1, 64, dtype=bf, device="cuda")
        v = torch.empty(12, 4, 256, dtype=bf, device="cuda")
        sink = torch.empty(4, dtype=torch.float32, device="cuda")
        out, lse = mlagen.mla_prefill(q, k, v, k_rope=k_rope, window_size=(5, 0), softcap=3.0, attn_sink=sink)
        assert tuple(out.shape) == (10, 4, 256) and tuple(lse.shape) == (10, 4)
        with pytest.raises(ArgumentError, match="mla_prefill: attn_sink: expected shape \\[4\\]"):
            mlagen.mla_prefill(q, k, v, k_rope=k_rope, attn_sink=torch.empty(3, dtype=torch.float32, device="cuda"))
        with pytest.raises(ArgumentError, match="mla_prefill: chunk_size"):
            mlagen.mla_prefill(q, k, v, k_rope=k_rope, chunk_size=0)


def test_a_variant_of_other_traits_is_refused():
    """The tuner's explicit variants must compute the call's traits: a sink kernel run without
    sinks would read a null pointer (three D1 trials crashed so on the H200 before the tuner held
    every specialisation fixed)."""
    import types

    from mlagen.families.mla_prefill import entry
    from mlagen.families.mla_prefill.traits import Traits

    call = types.SimpleNamespace(traits=Traits(mask="causal"))
    entry.check_variant_traits(call, variant.make(S90, {"mask": "causal"}))
    with pytest.raises(ArgumentError, match="mla_prefill: kernel: .* computes score sink; the call has score plain"):
        entry.check_variant_traits(call, variant.make(S90, {"mask": "causal", "score": "sink"}))
    with pytest.raises(ArgumentError, match="computes mask none; the call has mask causal"):
        entry.check_variant_traits(call, variant.make(S90, {"mask": "none"}))
    glm = types.SimpleNamespace(traits=Traits(geometry="n192r64v256"))
    with pytest.raises(ArgumentError, match="computes geometry -; the call has geometry n192r64v256"):
        entry.check_variant_traits(glm, variant.make(spec_mod.load("mla_prefill_sm80"), {}))
