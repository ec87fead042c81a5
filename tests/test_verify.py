"""mlagen.verify on the CPU: inputs, the chunked reference, and the comparison."""

from __future__ import annotations

import math

import pytest

from mlagen import shapes, verify

torch = pytest.importorskip("torch")

TINY = {
    "ragged": shapes.Shape("R", (5, 9, 3), (5, 9, 3), 3, True),
    "prefix": shapes.Shape("P", (6,), (11,), 3, True),
    "prefix_batch": shapes.Shape("B", (4, 4), (7, 7), 2, True),
    "ragged_prefix": shapes.Shape("RP", (5, 2), (8, 6), 2, True),
    "no_mask": shapes.Shape("N", (6, 9), (7, 5), 2, False),
}


def test_make_inputs_shapes_and_values():
    shape = TINY["ragged_prefix"]
    x = verify.make_inputs(shape, "cpu", seed=3)
    assert tuple(x["q"].shape) == (7, 2, 192) and x["q"].dtype == torch.bfloat16
    assert tuple(x["k"].shape) == (14, 2, 128) and tuple(x["k_rope"].shape) == (14, 1, 64)
    assert tuple(x["v"].shape) == (14, 2, 128)
    assert x["cu_seqlens_q"].tolist() == [0, 5, 7] and x["cu_seqlens_k"].tolist() == [0, 8, 14]
    assert x["cu_seqlens_q"].dtype == torch.int32
    assert all(float(x[n].float().std()) > 0.5 for n in ("q", "k", "k_rope", "v"))
    again = verify.make_inputs(shape, "cpu", seed=3)
    assert torch.equal(x["q"], again["q"])
    single = verify.make_inputs(TINY["prefix"], "cpu")
    assert single["cu_seqlens_q"] is None and single["cu_seqlens_k"] is None


@pytest.mark.parametrize("name", sorted(TINY))
def test_reference_heads_chunked_equals_whole(name):
    shape = TINY[name]
    x = verify.make_inputs(shape, "cpu", seed=1)
    out, lse = verify.reference_heads(shape, x, heads=2, budget_bytes=6 * 4 * 2 * max(shape.k_lens) * 2)  # 2 rows
    from mlagen.families.mla_prefill import reference

    want_out, want_lse = reference(x["q"][:, :2], x["k"][:, :2], x["v"][:, :2], k_rope=x["k_rope"],
                                   cu_seqlens_q=x["cu_seqlens_q"], cu_seqlens_k=x["cu_seqlens_k"],
                                   causal=shape.causal, dtype=torch.float32)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)


def _ref_as_bf16(shape, x):
    out, lse = verify.reference_heads(shape, x, heads=shape.heads)
    return out.to(torch.bfloat16), lse


def test_compare_accepts_the_reference_and_rejects_wrong_outputs():
    shape = TINY["ragged"]   # 3 heads: one outside the CHECK_HEADS compared with the reference
    x = verify.make_inputs(shape, "cpu")
    ref = verify.reference_heads(shape, x)
    out, lse = _ref_as_bf16(shape, x)
    check = verify.compare(out, lse, *ref)
    assert check.ok and check.rel_l2 < 5e-3 and check.lse_max_abs < 1e-5

    poisoned = out.clone()
    poisoned[3, 1, 7] = math.nan
    assert "1 of" in verify.compare(poisoned, lse, *ref).problem

    uncovered = out.clone()
    uncovered[:, 2] = math.nan   # a head outside the compared ones, never written
    assert "NaN or inf" in verify.compare(uncovered, lse, *ref).problem

    nan_lse = lse.clone()
    nan_lse[1, 2] = math.nan
    assert "lse values are NaN" in verify.compare(out, nan_lse, *ref).problem

    bad_lse = lse.clone()
    bad_lse[0, 0] += 1.0
    assert "lse error" in verify.compare(out, bad_lse, *ref).problem

    shuffled = out[torch.randperm(out.shape[0])]
    assert "relative L2 error" in verify.compare(shuffled, None, *ref).problem


def test_compare_rows_that_see_no_key():
    shape = shapes.Shape("E", (4,), (2,), 2, True)   # causal, Lk < Lq: rows 0 and 1 see nothing
    x = verify.make_inputs(shape, "cpu")
    ref = verify.reference_heads(shape, x)
    out, lse = _ref_as_bf16(shape, x)
    assert torch.isinf(lse[:2]).all() and verify.compare(out, lse, *ref).ok
    finite_lse = lse.clone()
    finite_lse[0] = 0.0
    assert "+inf" in verify.compare(out, finite_lse, *ref).problem


