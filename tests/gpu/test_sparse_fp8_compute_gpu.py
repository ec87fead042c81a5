"""The sparse prefill's "fp8" compute mode on the GPU: ``mla_sparse_prefill(..., kv_format=fmt,
compute="fp8")``, the FP8 tensor-core kernel (``mla_sparse_prefill_sm90_fp8``).

Every case runs with its outputs poisoned with NaN and is checked (bench_sparse.check_fp8_compute_case)
against the float32 reference with Q as the kernel rounds it (``fam.quantize_q_fp8``) on
fp32-dequantized rows at the fp8 mode's tolerances (``fam.FP8_REL_TOL`` relative L2 on out;
``fam.FP8_STAT_TOL * (1 + |ref|)`` on lse and max_logits where finite; exactly the reference's
infinities: rows with no valid key give out 0, lse +inf, max_logits -inf), and its lse and
max_logits against the exact-Q reference within Q's rounding bound (``fam.fp8_q_logit_bound``): the cases of bench_sparse.fp8_cases whose format the fp8 mode reads (fp8_v32,
fp8_b64, fp8_b32, fp8_b0), then H in {1, 5, 16, 64, 128} x topk in {1, 33, 640, 2048} over page sizes 1 and 64
(flat, 4-D and strided pools), every sink mode (none, finite, +inf, -inf, mixed), topk_length
(rows of length 0 among them), all-invalid rows, per-block scales 10**+-2 and 2^-40..2^20 apart
(bench_sparse.fp8_compute_cases). Then CUDA graph capture, torch.compile(fullgraph=True) and the
op's opcheck with compute="fp8", dispatch (the fp8 spec serves compute="fp8" only), the argument
errors, a tune of the fp8 spec, ``mlagen bench`` and ``bench_sparse bench-fp8`` on a small shape.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen import bench_sparse, operands  # noqa: E402
from mlagen.families import mla_sparse_prefill as fam  # noqa: E402

FP8_SPEC = "mla_sparse_prefill_sm90_fp8"
CASES = bench_sparse.fp8_compute_cases()


def _no_fp8_kernel_reason() -> str | None:
    if not torch.cuda.is_available():
        return None   # the gpu marker skips these with the suite's reason
    from mlagen.runtime import device_info

    target = device_info(torch.cuda.current_device()).target
    have = fam.kv_format_targets("fp8_v32", "fp8")
    if target is None or target.name not in have:
        return (f"no fp8-mode sparse kernel targets this GPU ({target.name if target else 'unknown target'}); "
                f"the FP8 tensor-core kernel targets {', '.join(have) or 'nothing'}")
    return None


_REASON = _no_fp8_kernel_reason()
needs_fp8_kernel = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def _case_id(case: dict) -> str:
    return (f"h{case['heads']}-k{case['topk']}-{case.get('kv', 'p64')}-{case.get('kv_format', 'fp8_v32')}"
            f"-sink{case.get('sink', 'none')}")


@needs_fp8_kernel
@pytest.mark.parametrize("i", range(len(CASES)), ids=[f"{i}-{_case_id(c)}" for i, c in enumerate(CASES)])
def test_fp8_compute_matches_the_fp32_dequantized_reference(i):
    ok, msg = bench_sparse.check_fp8_compute_case(torch, CASES[i], seed=3000 + i)
    assert ok, f"{CASES[i]}: {msg}"


@needs_fp8_kernel
@pytest.mark.parametrize("sink", ["none", "finite", "+inf", "-inf", "mixed"])
@pytest.mark.parametrize("kv", ["p64", "p1", "p64_strided", "p1_4d"])
def test_sinks_and_page_sizes(sink, kv):
    case = {"sq": 6, "heads": 64, "topk": 640, "n": 2000, "kv": kv, "kv_format": "fp8_v32", "sink": sink,
            "topk_length": "short", "scales": "ue8m0"}
    ok, msg = bench_sparse.check_fp8_compute_case(torch, case, seed=11)
    assert ok, f"{case}: {msg}"


@needs_fp8_kernel
@pytest.mark.parametrize("spread", [0.0, 2.0, 4.0, 6.0])
@pytest.mark.parametrize("scales", ["fp32", "ue8m0"])
@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_b64", "fp8_b32"])
def test_scales_orders_of_magnitude_apart_between_blocks(spread, scales, fmt):
    # Scales per 128, 64 and 32 values (the last two exchange P as f16 between the consumers).
    case = {"sq": 7, "heads": 128, "topk": 2048, "n": 5000, "kv": "p64", "kv_format": fmt, "sink": "finite",
            "scales": scales, "spread": spread}
    ok, msg = bench_sparse.check_fp8_compute_case(torch, case, seed=12)
    assert ok, f"{case}: {msg}"


def _poisoned(sq, heads):
    return (torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device="cuda"),
            torch.full((sq, heads), math.nan, device="cuda"), torch.full((sq, heads), math.nan, device="cuda"))


@needs_fp8_kernel
@pytest.mark.parametrize("how", ["topk_length_0", "all_invalid", "past_n"])
@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_b64", "fp8_b32", "fp8_b0"])
def test_empty_rows_give_zero_and_infinities(how, fmt):
    f = operands.get(fmt)
    g = torch.Generator(device="cuda").manual_seed(5)
    sq, heads, topk = 4, 20, 300
    cache = bench_sparse.make_fp8_kv(torch, "p64", 500, f, g, "cuda")
    n = cache.shape[0] * cache.shape[1]
    q = torch.randn((sq, heads, 576), generator=g, device="cuda").to(torch.bfloat16)
    idx = torch.randint(0, n, (sq, topk), generator=g, device="cuda", dtype=torch.int32)
    length = None
    if how == "topk_length_0":
        length = torch.zeros(sq, dtype=torch.int32, device="cuda")
    elif how == "all_invalid":
        idx.fill_(-1)
    else:
        idx.fill_(n)
    sink = torch.randn((heads,), generator=g, device="cuda")
    out, ml, lse = _poisoned(sq, heads)
    mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=576 ** -0.5, topk_length=length, attn_sink=sink, out=out,
                              max_logits=ml, lse=lse, kv_format=fmt, compute="fp8")
    torch.cuda.synchronize()
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(lse, torch.full_like(lse, math.inf)) and torch.equal(ml, torch.full_like(ml, -math.inf))


@needs_fp8_kernel
def test_a_call_with_no_key_at_all_launches_nothing():
    inp = _inputs()
    out, ml, lse = mlagen.mla_sparse_prefill(inp["q"], inp["kv"], inp["indices"][..., :0], softmax_scale=0.04,
                                             kv_format="fp8_v32", compute="fp8")
    torch.cuda.synchronize()
    assert not out.any() and torch.isinf(lse).all() and (lse > 0).all() and torch.isinf(ml).all() and (ml < 0).all()


def _inputs(seed=4, heads=64, fmt="fp8_v32"):
    return fam.make_inputs({"sq": 16, "heads": heads, "topk": 256, "s_kv": 1000, "kv_format": fmt,
                            "compute": "fp8"}, "cuda", seed=seed)


@needs_fp8_kernel
def test_dispatch_takes_the_fp8_spec_for_compute_fp8_only():
    inp = _inputs()
    assert inp["compute"] == "fp8"
    args = (inp["q"], inp["kv"], inp["indices"])
    kw = {"softmax_scale": inp["softmax_scale"], "attn_sink": inp["attn_sink"], "kv_format": "fp8_v32"}
    _, sel = fam.select(fam.prepare(*args, **kw, compute="fp8"))
    assert sel.spec.name == FP8_SPEC and fam.spec_compute(sel.spec) == "fp8"
    assert sel.variant.symbol.startswith(FP8_SPEC + "_")
    _, sel16 = fam.select(fam.prepare(*args, **kw))   # the default mode on the same cache
    assert sel16.spec.name != FP8_SPEC and fam.spec_compute(sel16.spec) == "bf16"
    for heads in (1, 16):   # the H <= 16 bf16 kernel never takes an fp8-mode call
        small = _inputs(heads=heads)
        _, s = fam.select(fam.prepare(small["q"], small["kv"], small["indices"], softmax_scale=0.04,
                                      kv_format="fp8_v32", compute="fp8"))
        assert s.spec.name == FP8_SPEC


@needs_fp8_kernel
@pytest.mark.parametrize("fmt", ["fp8_v32", "fp8_b32", "fp8_b0"])
def test_fp8_compute_cuda_graph_capture_and_replay(fmt):
    inp = _inputs(fmt=fmt)
    mlagen.mla_sparse_prefill(**inp)   # builds the kernel outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, ml, lse = mlagen.mla_sparse_prefill(**inp)
    new = _inputs(seed=5, fmt=fmt)
    for k in ("q", "kv", "indices", "attn_sink"):
        inp[k].copy_(new[k])
    g.replay()
    ro, rml, rlse = mlagen.mla_sparse_prefill(**new)
    torch.cuda.synchronize()
    assert torch.equal(o, ro) and torch.equal(lse, rlse) and torch.equal(ml, rml)
    ref = fam.FAMILY.reference(None, new)
    check = fam.FAMILY.compare((o, ml, lse), ref)
    assert ref.compute == "fp8" and check.ok, check.problem


@needs_fp8_kernel
def test_fp8_compute_through_torch_compile_fullgraph():
    inp = _inputs()

    def layer(q, kv, indices, sink):
        out, ml, lse = mlagen.mla_sparse_prefill(q * 0.5, kv, indices, softmax_scale=0.04, attn_sink=sink,
                                                 kv_format="fp8_v32", compute="fp8")
        return out, ml, lse

    args = (inp["q"], inp["kv"], inp["indices"], inp["attn_sink"])
    eager = layer(*args)
    torch._dynamo.reset()
    explain = torch._dynamo.explain(layer)(*args)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain
    torch._dynamo.reset()
    got = torch.compile(layer, fullgraph=True)(*args)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)
    # The mode reached the kernel: the bf16 mode on the same cache gives another result.
    bf16 = mlagen.mla_sparse_prefill(inp["q"] * 0.5, inp["kv"], inp["indices"], softmax_scale=0.04,
                                     attn_sink=inp["attn_sink"], kv_format="fp8_v32")
    assert not torch.equal(bf16[0], eager[0])


@needs_fp8_kernel
def test_fp8_compute_opcheck():
    from mlagen.families.mla_sparse_prefill import op

    inp = _inputs()
    args = (inp["q"], inp["kv"], inp["indices"], 0.04, None, inp["attn_sink"], None, "fp8_v32", "fp8")
    for name, result in torch.library.opcheck(op._op, args).items():
        assert result == "SUCCESS", (name, result)
    outs = (torch.empty(16, 64, 512, dtype=torch.bfloat16, device="cuda"),
            torch.empty(16, 64, dtype=torch.float32, device="cuda"), torch.empty(16, 64, dtype=torch.float32, device="cuda"))
    for name, result in torch.library.opcheck(op._op_out, args[:-1] + outs + ("fp8",)).items():
        assert result == "SUCCESS", (name, result)


def test_compute_fp8_with_a_bf16_cache_is_a_value_error():
    inp = fam.make_inputs({"sq": 4, "heads": 8, "topk": 16, "s_kv": 100}, "cuda", seed=1)
    with pytest.raises(ValueError, match=r"compute: 'fp8' needs an FP8 cache: kv_format one of \['fp8_v32', "
                                         r"'fp8_b64', 'fp8_b32', 'fp8_b0'\].*got kv_format 'bf16'"):
        mlagen.mla_sparse_prefill(**inp, compute="fp8")


@needs_fp8_kernel
@pytest.mark.parametrize("fmt", ["fp8_b64", "fp8_b32"])
def test_scale_blocks_of_64_and_32_take_the_fp8_spec(fmt):
    inp = _inputs(fmt=fmt)
    _, sel = fam.select(fam.prepare(inp["q"], inp["kv"], inp["indices"], softmax_scale=0.04, kv_format=fmt,
                                    compute="fp8"))
    assert sel.spec.name == FP8_SPEC and sel.variant["kv_format"] == fmt


@needs_fp8_kernel
def test_a_kernel_of_the_other_mode_is_refused():
    from mlagen import spec, variant

    inp = _inputs()
    with pytest.raises(ValueError, match=r"kernel: spec mla_sparse_prefill_sm90 computes in 'bf16' mode"):
        mlagen.mla_sparse_prefill(**inp, kernel="mla_sparse_prefill_sm90")
    bf16_variant = variant.make(spec.load("mla_sparse_prefill_sm90"), {"kv_format": "fp8_v32", "paged": False})
    with pytest.raises(ValueError, match=r"kernel: variant .* computes in 'bf16' mode"):
        mlagen.mla_sparse_prefill(**inp, kernel=bf16_variant)
    plain = {k: v for k, v in inp.items() if k != "compute"}
    with pytest.raises(ValueError, match=r"kernel: spec mla_sparse_prefill_sm90_fp8 computes in 'fp8' mode.*"
                                         r"compute='bf16'"):
        mlagen.mla_sparse_prefill(**plain, kernel=FP8_SPEC)
    # By name, in its own mode, it runs.
    out, _, _ = mlagen.mla_sparse_prefill(**inp, kernel=FP8_SPEC)
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all()


@needs_fp8_kernel
def test_a_tune_of_the_fp8_spec_is_dispatched_to(tmp_path, monkeypatch):
    """``mlagen tune mla_sparse_prefill_sm90_fp8 --shape ...,kv=fp8_v32,compute=fp8``: every trial
    checked at the fp8 mode's tolerances and right, the winner recorded under the fp8-mode class,
    and a compute="fp8" call of that class dispatches to it."""
    from mlagen import db
    from mlagen.dispatch import dispatcher
    from mlagen.tune import TuneConfig, tune

    path = tmp_path / "t.sqlite"
    fixed = {"consumer_regs": 224, "producer_regs": 56, "softmax_max": "lazy"}   # l2_evict_last on and off
    config = TuneConfig(spec=FP8_SPEC, shapes=("sq=64,h=64,topk=256,skv=1024,kv=fp8_v32,compute=fp8",),
                        strategy="exhaustive", fixed=fixed, timeout_s=120, iters=3, warmup=1, db_path=str(path))
    (result,) = tune(config, progress=lambda line: None)
    assert result.problem == "d576/h64/k256/flat/fp8_v32/fp8"
    assert [t.outcome for t in result.trials] == ["ok", "ok"], [(t.variant.symbol, t.detail) for t in result.trials]
    (best,) = db.TuningDB(path).bests()
    assert best.key.spec == FP8_SPEC and best.key.problem == "d576/h64/k256/flat/fp8_v32/fp8"
    monkeypatch.setenv("MLAGEN_TUNING_DB", str(path))
    monkeypatch.setenv("MLAGEN_NO_SHIPPED", "1")
    dispatcher().clear()
    try:
        x = fam.make_inputs(fam.parse_shape("sq=32,h=50,topk=200,skv=500,kv=fp8_v32,compute=fp8"), "cuda", seed=2)
        _, sel = fam.select(fam.prepare(x["q"], x["kv"], x["indices"], softmax_scale=x["softmax_scale"],
                                        attn_sink=x["attn_sink"], kv_format="fp8_v32", compute="fp8"))
        assert (sel.variant.symbol, sel.origin) == (result.best.variant.symbol, "user")
    finally:
        dispatcher().clear()


@needs_fp8_kernel
def test_mlagen_bench_runs_the_fp8_mode_as_a_user_calls_it():
    from mlagen import bench

    (result,) = bench.run("sq=128,h=64,topk=512,skv=4096,kv=fp8_v32,compute=fp8", peers=["mlagen"], iters=3,
                          rounds=1, warmup=1, progress=lambda line: None)
    p = result.peers["mlagen"]
    assert p.check.ok and p.timing is not None, p.error
    assert FP8_SPEC in p.note


@needs_fp8_kernel
def test_bench_fp8_tool_reports_the_fp8_mode(capsys):
    bench_sparse.bench_fp8(["sq=256,h=64,topk=512,skv=4096"], rounds=1, iters=2, scale_fmts=("ue8m0",))
    text = capsys.readouterr().out
    assert 'compute="fp8" (FP8 tensor cores)' in text and "| fp8 compute ms |" in text
    rows = [line for line in text.splitlines() if line.startswith("| sq=256")]
    assert len(rows) == 2 and rows[1].rstrip().endswith("| ok |"), text
    assert "'fp8_compute_ok': True" in text
