"""Host-side parts of mlagen.families.mla_prefill: shape classes, visible pairs, FLOPs, and the
reference implementation, checked on the CPU in float64 against a naive loop."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from mlagen.families.mla_prefill import problem as dense_problem
from mlagen.families.mla_prefill import reference as dense_reference
from mlagen.families.mla_prefill.problem import ProblemKey

torch = pytest.importorskip("torch")


# --- shape classes --------------------------------------------------------------------------


def test_problem_key_text_round_trip():
    k = ProblemKey.parse("causal/h128/q8192/k8192")
    assert (k.mask, k.heads, k.q_per_seq, k.k_per_seq) == ("causal", 128, 8192, 8192)
    assert str(k) == "causal/h128/q8192/k8192"
    assert str(ProblemKey("none", 16, 4096, 16384)) == "none/h16/q4096/k16384"
    assert ProblemKey.parse(str(ProblemKey("none", 1, 2, 4))) == ProblemKey("none", 1, 2, 4)


@pytest.mark.parametrize("text", ["", "causal", "causal/h128/q8192", "causal/h128/q8192/k8192/x",
                                  "sliding/h128/q8192/k8192", "causal/x128/q8192/k8192", "causal/h/q8192/k8192",
                                  "causal/hx/q1/k1", "causal/h128/k8192/q8192", "causal/h0/q1/k1",
                                  "causal/h-4/q1/k1"])
def test_problem_key_rejects(text):
    with pytest.raises(ValueError, match=r"is not a problem key like 'causal/h128/q8192/k8192'"):
        ProblemKey.parse(text)


@pytest.mark.parametrize("a, b, d", [
    ("causal/h128/q8192/k8192", "causal/h128/q8192/k8192", 0),
    ("causal/h128/q8192/k8192", "causal/h64/q8192/k8192", 1),
    ("causal/h128/q8192/k8192", "causal/h16/q2048/k16384", 3 + 2 + 1),
    ("none/h1/q1/k1", "none/h2/q4/k8", 6),
    ("causal/h128/q8192/k8192", "none/h128/q8192/k8192", math.inf),
])
def test_problem_key_distance(a, b, d):
    ka, kb = ProblemKey.parse(a), ProblemKey.parse(b)
    assert ka.distance(kb) == d
    assert kb.distance(ka) == d


@pytest.mark.parametrize("args, key", [
    ((128, 8192, 8192, 1, True), "causal/h128/q8192/k8192"),
    ((100, 3000, 5000, 2, False), "none/h128/q2048/k4096"),
    ((1, 1, 1, 1, True), "causal/h1/q1/k1"),
    ((16, 0, 0, 4, True), "causal/h16/q1/k1"),       # empty batch: smallest class, no log of zero
    ((3, 10, 10, 0, True), "causal/h4/q16/k16"),     # batch 0 counts as 1
    ((129, 8193, 2048, 1, True), "causal/h256/q16384/k2048"),
])
def test_problem_key_of_a_call(args, key):
    assert str(dense_problem.problem_key(*args)) == key


# --- visible pairs and FLOPs ----------------------------------------------------------------


def brute_pairs(lq, lk, causal):
    return sum(1 for i in range(lq) for j in range(lk) if not causal or j <= i + lk - lq)


def test_visible_pairs_against_brute_force():
    for lq, lk in itertools.product(range(0, 26), range(0, 26)):
        for causal in (True, False):
            assert dense_problem.visible_pairs(lq, lk, causal) == brute_pairs(lq, lk, causal), (lq, lk, causal)


def test_visible_pairs_random_larger_shapes():
    rng = random.Random(0)
    for _ in range(60):
        lq, lk = rng.randint(0, 300), rng.randint(0, 300)
        assert dense_problem.visible_pairs(lq, lk, True) == brute_pairs(lq, lk, True), (lq, lk)


@pytest.mark.parametrize("lq, lk, pairs", [
    (8192, 8192, 8192 * 8193 // 2),
    (2048, 16384, 2048 * 14336 + 2048 * 2049 // 2),   # a chunk after a cached prefix
    (100, 10, 55),                                    # only the last 10 rows see keys
    (5, 0, 0), (0, 5, 0),
])
def test_visible_pairs_closed_forms(lq, lk, pairs):
    assert dense_problem.visible_pairs(lq, lk, True) == pairs


def test_flops():
    lengths = [(0, 3, 0, 5), (3, 0, 5, 2), (3, 7, 7, 4)]
    heads = 16
    expect = sum(2 * heads * (192 + 128) * brute_pairs(lq, lk, True) for _, lq, _, lk in lengths)
    assert dense_problem.flops(lengths, heads, True) == expect
    assert dense_problem.flops(lengths, heads, False) == 2 * heads * 320 * (15 + 0 + 28)
    assert dense_problem.flops([(0, 8192, 0, 8192)], 128, True) == 2 * 128 * 320 * 8192 * 8193 // 2


def test_sequence_lengths():
    assert dense_problem.sequence_lengths(None, None, 7, 9) == [(0, 7, 0, 9)]
    assert dense_problem.sequence_lengths([0, 3, 3, 8], [0, 5, 7, 7], 8, 7) == [(0, 3, 0, 5), (3, 0, 5, 2), (3, 5, 7, 0)]
    cu_q = torch.tensor([0, 2, 6], dtype=torch.int32)
    cu_k = torch.tensor([0, 4, 4], dtype=torch.int32)
    assert dense_problem.sequence_lengths(cu_q, cu_k, 6, 4) == [(0, 2, 0, 4), (2, 4, 4, 0)]


# --- the reference --------------------------------------------------------------------------


def naive(q, k, v, cu_q, cu_k, causal, scale):
    """One (sequence, head, query row) at a time, in float64, straight from the definition.
    ``k`` holds all 192 columns per head. Returns (out, lse); lse is +inf where nothing is seen."""
    tq, h, _ = q.shape
    out = torch.zeros(tq, h, 128, dtype=torch.float64)
    lse = torch.full((tq, h), math.inf, dtype=torch.float64)
    cu_q = cu_q or [0, tq]
    cu_k = cu_k or [0, k.shape[0]]
    for b in range(len(cu_q) - 1):
        q0, lq, k0, lk = cu_q[b], cu_q[b + 1] - cu_q[b], cu_k[b], cu_k[b + 1] - cu_k[b]
        for head in range(h):
            for i in range(lq):
                seen = [j for j in range(lk) if not causal or j <= i + lk - lq]
                if not seen:
                    continue
                s = [float((q[q0 + i, head].double() * k[k0 + j, head].double()).sum()) * scale for j in seen]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                total = sum(w)
                lse[q0 + i, head] = m + math.log(total)
                for wj, j in zip(w, seen):
                    out[q0 + i, head] += (wj / total) * v[k0 + j, head].double()
    return out, lse


def inputs(lq, lk, heads, seed=0):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lq), sum(lk)
    q = torch.randn(tq, heads, 192, generator=g).to(torch.bfloat16)
    k = torch.randn(tk, heads, 128, generator=g).to(torch.bfloat16)
    rope = torch.randn(tk, 1, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(tk, heads, 128, generator=g).to(torch.bfloat16)
    cu = (lambda ls: [0] + list(itertools.accumulate(ls))) if len(lq) > 1 else (lambda ls: None)
    return q, k, rope, v, cu(lq), cu(lk)


def check(out, lse, ref_out, ref_lse):
    assert out.dtype == lse.dtype == torch.float64
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-10)
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=1e-10, atol=1e-10)
    assert (lse[~finite] == math.inf).all()
    assert (out[~finite] == 0).all()


CASES = [
    # (id, q lengths, k lengths, heads, causal)
    ("square causal", [5], [5], 2, True),
    ("square full", [5], [5], 2, False),
    ("chunk after prefix Lq<Lk", [3], [8], 2, True),
    ("Lq>Lk: first rows see nothing", [7], [3], 3, True),
    ("single query", [1], [6], 1, True),
    ("ragged with empty sequences", [3, 0, 2, 4, 2], [5, 2, 0, 4, 1], 2, True),
    ("ragged full", [3, 0, 2, 4], [5, 2, 0, 4], 2, False),
]


@pytest.mark.parametrize("lq, lk, heads, causal", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("rope", ["shared", "per_head", "folded"])
def test_reference_matches_naive_loops(lq, lk, heads, causal, rope):
    q, k, shared, v, cu_q, cu_k = inputs(lq, lk, heads)
    full_k = torch.cat([k, shared.expand(-1, heads, -1)], dim=-1)
    scale = 1 / math.sqrt(192)
    ref_out, ref_lse = naive(q, full_k, v, cu_q, cu_k, causal, scale)
    kwargs = {}
    if cu_q is not None:
        kwargs = {"cu_seqlens_q": torch.tensor(cu_q, dtype=torch.int32),
                  "cu_seqlens_k": torch.tensor(cu_k, dtype=torch.int32)}
    if rope == "shared":
        out, lse = dense_reference.reference(q, k, v, k_rope=shared, causal=causal, **kwargs)
    elif rope == "per_head":
        out, lse = dense_reference.reference(q, k, v, k_rope=shared.expand(-1, heads, -1).contiguous(), causal=causal, **kwargs)
    else:
        out, lse = dense_reference.reference(q, full_k, v, causal=causal, **kwargs)
    check(out, lse, ref_out, ref_lse)


def test_rows_that_see_nothing():
    q, k, shared, v, _, _ = inputs([6], [2], 2)
    out, lse = dense_reference.reference(q, k, v, k_rope=shared, causal=True)
    assert torch.isinf(lse[:4]).all() and (lse[:4] > 0).all()
    assert (out[:4] == 0).all()
    assert torch.isfinite(lse[4:]).all()


def test_reference_with_no_keys_at_all():
    q, k, shared, v, _, _ = inputs([4], [0], 2)
    out, lse = dense_reference.reference(q, k, v, k_rope=shared, causal=False)
    assert (out == 0).all() and (lse == math.inf).all()


def test_reference_scale_and_head_chunks():
    q, k, shared, v, cu_q, cu_k = inputs([4, 3], [6, 3], 5, seed=3)
    full_k = torch.cat([k, shared.expand(-1, 5, -1)], dim=-1)
    ref_out, ref_lse = naive(q, full_k, v, cu_q, cu_k, True, 0.3)
    out, lse = dense_reference.reference(q, k, v, k_rope=shared, cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32),
                             cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32), causal=True, softmax_scale=0.3,
                             head_chunk=2)
    check(out, lse, ref_out, ref_lse)


def test_reference_dtype():
    q, k, shared, v, _, _ = inputs([3], [3], 1)
    out, lse = dense_reference.reference(q, k, v, k_rope=shared, dtype=torch.float32)
    assert out.dtype == lse.dtype == torch.float32
    out64, _ = dense_reference.reference(q, k, v, k_rope=shared)
    torch.testing.assert_close(out.double(), out64, rtol=1e-5, atol=1e-5)


def test_causal_is_bottom_right_aligned():
    # With Lk = Lq + 2, the first query already sees three keys; the last sees all.
    q, k, shared, v, _, _ = inputs([2], [4], 1, seed=5)
    full_k = torch.cat([k, shared], dim=-1)
    out, lse = dense_reference.reference(q, k, v, k_rope=shared, causal=True)
    s = (q[0, 0].double() @ full_k[:3, 0].double().T) / math.sqrt(192)
    assert lse[0, 0].item() == pytest.approx(torch.logsumexp(s, 0).item(), rel=1e-12)


def test_sm90_lpt_order(monkeypatch):
    """The sm90 launcher asks for the longest-first sequence order on batches of 2 to 32 sequences
    (one per lane of the kernel's search) of 4096 keys or more on average, not on one sequence, past
    32, or on short sequences; MLAGEN_SEQ_ORDER=batch
    turns it off, and another value is refused naming the knob."""
    import types

    from mlagen.families.mla_prefill.tma import lpt_order

    monkeypatch.delenv("MLAGEN_SEQ_ORDER", raising=False)
    def call(batch, keys_per_seq=8192):
        return types.SimpleNamespace(batch=batch, total_k=batch * keys_per_seq)

    assert [lpt_order(call(b)) for b in (1, 2, 16, 32, 33)] == [0, 1, 1, 1, 0]
    assert lpt_order(call(32, 512)) == 0 and lpt_order(call(16, 4096)) == 1   # D6's short sequences: batch order
    monkeypatch.setenv("MLAGEN_SEQ_ORDER", "batch")
    assert lpt_order(call(16)) == 0
    monkeypatch.setenv("MLAGEN_SEQ_ORDER", "longest")
    with pytest.raises(ValueError, match="MLAGEN_SEQ_ORDER='longest'"):
        lpt_order(call(16))


def test_sm90_head_group(monkeypatch):
    """Heads per group of the sm90 tile order: 8 (at most the head count) on causal problems
    without a long prefix on the dynamic or static scheduler, else 1; MLAGEN_HEAD_GROUP overrides."""
    import types

    from mlagen.families.mla_prefill.tma import head_group

    monkeypatch.delenv("MLAGEN_HEAD_GROUP", raising=False)

    def call(heads, total_q, total_k, causal=True):
        return types.SimpleNamespace(heads=heads, total_q=total_q, total_k=total_k, causal=causal)

    assert head_group(call(128, 8192, 8192), "dynamic") == 8       # D1
    assert head_group(call(16, 16384, 16384), "static") == 8       # D2
    assert head_group(call(5, 300, 300), "dynamic") == 5           # fewer heads than a group
    assert head_group(call(16, 16384, 16384), "persistent") == 1   # D7's record: round-robin
    assert head_group(call(16, 16384, 16384, causal=False), "dynamic") == 1  # D3: tiles alike
    assert head_group(call(128, 2048, 16384), "dynamic") == 1      # D5: a long cached prefix
    monkeypatch.setenv("MLAGEN_HEAD_GROUP", "3")
    assert head_group(call(128, 8192, 8192, causal=False), "persistent") == 3
    monkeypatch.setenv("MLAGEN_HEAD_GROUP", "300")
    assert head_group(call(128, 8192, 8192), "dynamic") == 128


# --- section 1b: other head geometries and windows -------------------------------------------


def naive_1b(q, k, v, seqs, scale, causal, window):
    """The naive loop of any geometry and a window (left, right), -1 unbounded (MLA.md 1b)."""
    tq, h, _ = q.shape
    out = torch.zeros(tq, h, v.shape[-1], dtype=torch.float64)
    lse = torch.full((tq, h), math.inf, dtype=torch.float64)
    for q0, lq, k0, lk in seqs:
        for i in range(lq):
            p = i + lk - lq
            seen = [j for j in range(lk) if (window is not None or not causal or j <= p) and (
                window is None or ((window[0] < 0 or j >= p - window[0]) and (window[1] < 0 or j <= p + window[1])))]
            for head in range(h) if seen else ():
                s = torch.stack([(q[q0 + i, head].double() * k[k0 + j, head].double()).sum() * scale for j in seen])
                lse[q0 + i, head] = torch.logsumexp(s, 0)
                out[q0 + i, head] = (torch.softmax(s, 0)[:, None] * v[[k0 + j for j in seen], head].double()).sum(0)
    return out, lse


@pytest.mark.parametrize("text", [
    "q=[5,1,0,40],k=[9,1,3,40],h=2,d=192/64/256,window=6/1",   # ragged, a prefix, an empty sequence
    "q=[30],k=[30],h=3,d=128/0/128,window=-1/3",               # d_rope 0, unbounded left
    "q=[12,7],k=[4,7],h=2,window=2/-1",                        # Lq > Lk: rows before the keys
    "q=[9,33],k=[20,33],h=2,d=192/64/256,causal",              # another geometry, causal with a prefix
])
def test_reference_of_other_geometries_and_windows(text):
    """The family's reference (and its chunks of rows, at a tiny budget) against the naive loop."""
    from mlagen import families

    fam = families.get("mla_prefill")
    shape = dense_problem.parse_shape(text)
    x = fam.make_inputs(shape, "cpu", seed=1)
    d_nope, d_rope, d_v = shape.dims
    assert x["q"].shape[-1] == d_nope + d_rope and x["v"].shape[-1] == d_v and x["k"].shape[-1] == d_nope
    assert (x["k_rope"] is None) == (d_rope == 0)
    full_k = x["k"] if d_rope == 0 else torch.cat([x["k"], x["k_rope"].expand(-1, shape.heads, -1)], dim=-1)
    ref_out, ref_lse = naive_1b(x["q"], full_k, x["v"], shape.sequence_lengths(), 1 / math.sqrt(d_nope + d_rope),
                                shape.causal, None if shape.mask != "window" else shape.window)
    for budget in (2 << 30, 40000):   # one chunk, and chunks of a few rows
        out, lse = dense_reference.reference_heads(shape, x, None, budget_bytes=budget)
        torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) and (lse[torch.isinf(lse)] > 0).all()
        fin = torch.isfinite(ref_lse)
        torch.testing.assert_close(lse.double()[fin], ref_lse[fin], rtol=1e-5, atol=1e-5)
