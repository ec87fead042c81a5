"""Launch plans (mlagen/plans.py) on the GPU: a call repeated with the same signature takes its
plan, and the plan's launch gives bit for bit what the full path (MLAGEN_PLANS=0) gives, on new
buffers (new pointers) as on the first ones, for every launcher: the sm90 TMA launcher (maps
re-encoded per pointer, the dynamic scheduler's counter), its FP8 sibling (V mapped as stored), the
simt one, the sparse gather, the H <= 16 kernel's TMA gather (its KV map) and the FP8-cache modes."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen import dispatch  # noqa: E402
from mlagen.families.mla_sparse_prefill import entry as sp_entry, reference as sp_ref  # noqa: E402
from mlagen.families.mla_prefill import entry as dense_entry  # noqa: E402


def _rnd(g, *shape):
    return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)


def _dense_args(case: str, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    lq, lk, h = [300, 77, 1], [300, 100, 640], 8
    cu = lambda xs: torch.tensor([0] + [sum(xs[:i + 1]) for i in range(len(xs))], dtype=torch.int32, device="cuda")
    tq, tk = sum(lq), sum(lk)
    args = {"q": _rnd(g, tq, h, 192), "k": _rnd(g, tk, h, 128), "v": _rnd(g, tk, h, 128),
            "k_rope": _rnd(g, tk, 1, 64), "cu_seqlens_q": cu(lq), "cu_seqlens_k": cu(lk)}
    if case == "folded":      # k holds nope and rope: the rope is a view of k
        args["k"], args["k_rope"] = _rnd(g, tk, h, 192), None
    elif case == "single":    # one sequence, not causal, a strided (aligned) q
        args = {"q": _rnd(g, 200, h, 256)[:, :, :192], "k": _rnd(g, 333, h, 128), "v": _rnd(g, 333, h, 128),
                "k_rope": _rnd(g, 333, h, 64), "causal": False}
    elif case == "out":       # preallocated outputs
        args["out"] = torch.full((tq, h, 128), float("nan"), device="cuda").to(torch.bfloat16)
        args["lse"] = torch.full((tq, h), float("nan"), device="cuda")
    elif case == "sm80":      # the simt launcher
        args["kernel"] = "mla_prefill_sm80"
    elif case == "fp8":       # e4m3 operands with descales: V's map, the descale pointers
        from mlagen.families import get

        fam = get("mla_prefill")
        args = fam.make_inputs(fam.parse_shape("b=3,q=[300,77,1],k=[300,100,640],h=8,causal"), "cuda", seed,
                               dtype="fp8_e4m3")
    return args


def _sparse_args(case: str, seed: int) -> dict:
    shape = {"sq": 37, "heads": 64, "topk": 300, "s_kv": 1000}
    if case == "h16":         # the H <= 16 kernel: a TMA gather with a KV tensor map
        shape["heads"] = 16
    elif case == "h128":
        shape["heads"] = 128
    elif case == "fp8_v32":
        shape["kv_format"] = "fp8_v32"
    args = sp_ref.make_inputs(shape, "cuda", seed=seed)
    if case == "topk_length":
        args["topk_length"] = torch.randint(0, 301, (37,), device="cuda", dtype=torch.int32)
        args["attn_sink"] = None
    elif case == "paged":     # a strided pool of pages of 16 rows
        pool = torch.randn(80, 16 * 2, 576, device="cuda").to(torch.bfloat16)[:, :16]
        args["kv"] = pool
        args["indices"] = torch.randint(-3, 80 * 16 + 3, (37, 300), device="cuda", dtype=torch.int32)
    return args


def _run(fn, args, plans_on, monkeypatch):
    monkeypatch.setenv("MLAGEN_PLANS", "1" if plans_on else "0")
    out = fn(**args)
    torch.cuda.synchronize()
    return [t.clone() for t in out]


def _check(fn, make, cache, monkeypatch):
    a, b = make(1), make(2)
    want_a, want_b = _run(fn, a, False, monkeypatch), _run(fn, b, False, monkeypatch)
    hits = cache.hits
    got = [_run(fn, x, True, monkeypatch) for x in (a, b, a)]   # a: the full path, then plans
    assert cache.hits - hits >= 2, "the repeated calls did not take a plan"
    for g, w in zip(got, (want_a, want_b, want_a)):
        for x, y in zip(g, w):
            assert torch.equal(x, y)


@pytest.mark.parametrize("case", ["varlen", "folded", "single", "out", "sm80", "fp8"])
def test_dense_plans_match_the_full_path(case, monkeypatch):
    _check(mlagen.mla_prefill, lambda seed: _dense_args(case, seed), dense_entry._plans, monkeypatch)


@pytest.mark.parametrize("case", ["flat", "h16", "h128", "topk_length", "paged", "fp8_v32"])
def test_sparse_plans_match_the_full_path(case, monkeypatch):
    _check(mlagen.mla_sparse_prefill, lambda seed: _sparse_args(case, seed), sp_entry._plans, monkeypatch)


def test_plans_follow_the_dispatcher_and_the_knobs(monkeypatch):
    args = _sparse_args("flat", 3)
    monkeypatch.setenv("MLAGEN_PLANS", "1")
    mlagen.mla_sparse_prefill(**args)
    hits = sp_entry._plans.hits
    mlagen.mla_sparse_prefill(**args)
    assert sp_entry._plans.hits == hits + 1
    dispatch.dispatcher().clear()              # a new tuning record, say: plan again
    mlagen.mla_sparse_prefill(**args)
    assert sp_entry._plans.hits == hits + 1
    mlagen.mla_sparse_prefill(**args)
    assert sp_entry._plans.hits == hits + 2
    monkeypatch.setenv("MLAGEN_FAMILY", "mla_sparse_prefill_sm80")   # a knob the call reads
    mlagen.mla_sparse_prefill(**args)
    assert sp_entry._plans.hits == hits + 2


def test_bad_arguments_never_take_a_plan(monkeypatch):
    monkeypatch.setenv("MLAGEN_PLANS", "1")
    args = _sparse_args("flat", 4)
    mlagen.mla_sparse_prefill(**args)
    mlagen.mla_sparse_prefill(**args)
    with pytest.raises(ValueError, match="softmax_scale"):
        mlagen.mla_sparse_prefill(**{**args, "softmax_scale": -1.0})
    with pytest.raises(ValueError, match="indices: has"):
        mlagen.mla_sparse_prefill(**{**args, "indices": args["indices"][:5]})
    d = _dense_args("varlen", 4)
    mlagen.mla_prefill(**d)
    mlagen.mla_prefill(**d)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        mlagen.mla_prefill(**d, max_seqlen_q=3)
    with pytest.raises(TypeError, match="check_seqlens"):   # an int where a bool is asked
        mlagen.mla_prefill(**d, check_seqlens=0)


def test_graph_capture_of_a_planned_call(monkeypatch):
    monkeypatch.setenv("MLAGEN_PLANS", "1")
    d = _dense_args("out", 5)
    want = [t.clone() for t in mlagen.mla_prefill(**d)]
    mlagen.mla_prefill(**d)   # the plan exists now
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mlagen.mla_prefill(**d)
    torch.cuda.current_stream().wait_stream(s)
    hits = dense_entry._plans.hits
    with torch.cuda.graph(graph):
        mlagen.mla_prefill(**d)
    assert dense_entry._plans.hits == hits + 1
    d["out"].zero_()
    d["lse"].zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(d["out"], want[0]) and torch.equal(d["lse"], want[1])
