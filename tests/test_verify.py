"""mlagen.verify on the CPU, and the dense family's inputs, chunked reference and comparison it relies on."""

from __future__ import annotations

import math

import pytest

from mlagen import verify
from mlagen.families.mla_prefill import problem as shapes
from mlagen.families import get as get_family

torch = pytest.importorskip("torch")
DENSE = get_family("mla_prefill")

TINY = {
    "ragged": shapes.Shape("R", (5, 9, 3), (5, 9, 3), 3, True),
    "prefix": shapes.Shape("P", (6,), (11,), 3, True),
    "prefix_batch": shapes.Shape("B", (4, 4), (7, 7), 2, True),
    "ragged_prefix": shapes.Shape("RP", (5, 2), (8, 6), 2, True),
    "no_mask": shapes.Shape("N", (6, 9), (7, 5), 2, False),
}


def test_make_inputs_shapes_and_values():
    shape = TINY["ragged_prefix"]
    x = DENSE.make_inputs(shape, "cpu", seed=3)
    assert tuple(x["q"].shape) == (7, 2, 192) and x["q"].dtype == torch.bfloat16
    assert tuple(x["k"].shape) == (14, 2, 128) and tuple(x["k_rope"].shape) == (14, 1, 64)
    assert tuple(x["v"].shape) == (14, 2, 128)
    assert x["cu_seqlens_q"].tolist() == [0, 5, 7] and x["cu_seqlens_k"].tolist() == [0, 8, 14]
    assert x["cu_seqlens_q"].dtype == torch.int32
    assert all(float(x[n].float().std()) > 0.5 for n in ("q", "k", "k_rope", "v"))
    again = DENSE.make_inputs(shape, "cpu", seed=3)
    assert torch.equal(x["q"], again["q"])
    single = DENSE.make_inputs(TINY["prefix"], "cpu")
    assert single["cu_seqlens_q"] is None and single["cu_seqlens_k"] is None


@pytest.mark.parametrize("name", sorted(TINY))
def test_reference_heads_chunked_equals_whole(name):
    shape = TINY[name]
    x = DENSE.make_inputs(shape, "cpu", seed=1)
    out, lse = __import__('mlagen.families.mla_prefill.reference', fromlist=['x']).reference_heads(shape, x, heads=2, budget_bytes=6 * 4 * 2 * max(shape.k_lens) * 2)  # 2 rows
    from mlagen.families.mla_prefill.reference import reference

    want_out, want_lse = reference(x["q"][:, :2], x["k"][:, :2], x["v"][:, :2], k_rope=x["k_rope"],
                                   cu_seqlens_q=x["cu_seqlens_q"], cu_seqlens_k=x["cu_seqlens_k"],
                                   causal=shape.causal, dtype=torch.float32)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)


def _ref_as_bf16(shape, x):
    out, lse = DENSE.reference(shape, x, heads=shape.heads)
    return out.to(torch.bfloat16), lse


def test_compare_accepts_the_reference_and_rejects_wrong_outputs():
    shape = TINY["ragged"]   # 3 heads: one outside the CHECK_HEADS compared with the reference
    x = DENSE.make_inputs(shape, "cpu")
    ref = DENSE.reference(shape, x, 2)
    out, lse = _ref_as_bf16(shape, x)
    check = DENSE.compare((out, lse), ref)
    assert check.ok and check.rel_l2 < 5e-3 and check.lse_max_abs < 1e-5

    poisoned = out.clone()
    poisoned[3, 1, 7] = math.nan
    assert "1 of" in DENSE.compare((poisoned, lse), ref).problem

    uncovered = out.clone()
    uncovered[:, 2] = math.nan   # a head outside the compared ones, never written
    assert "NaN or inf" in DENSE.compare((uncovered, lse), ref).problem

    nan_lse = lse.clone()
    nan_lse[1, 2] = math.nan
    assert "lse values are NaN" in DENSE.compare((out, nan_lse), ref).problem

    bad_lse = lse.clone()
    bad_lse[0, 0] += 1.0
    assert "lse error" in DENSE.compare((out, bad_lse), ref).problem

    shuffled = out[torch.randperm(out.shape[0])]
    assert "relative L2 error" in DENSE.compare((shuffled, None), ref).problem


def test_compare_rows_that_see_no_key():
    shape = shapes.Shape("E", (4,), (2,), 2, True)   # causal, Lk < Lq: rows 0 and 1 see nothing
    x = DENSE.make_inputs(shape, "cpu")
    ref = DENSE.reference(shape, x, 2)
    out, lse = _ref_as_bf16(shape, x)
    assert torch.isinf(lse[:2]).all() and DENSE.compare((out, lse), ref).ok
    finite_lse = lse.clone()
    finite_lse[0] = 0.0
    assert "+inf" in DENSE.compare((out, finite_lse), ref).problem




# --- the Verifier -------------------------------------------------------------------------------


class Dense:
    """The dense family with its call replaced: 'kernels' that write the reference, or break it."""

    def __init__(self, how):
        self.how, self.calls = how, []

    def __getattr__(self, name):
        return getattr(DENSE, name)

    def call(self, inputs, *, variant=None, kernel=None, outputs=None, check=False):
        self.calls.append((variant, check))
        shape = shapes.Shape("x", *self._lens(inputs), inputs["q"].shape[1], inputs["causal"])
        out, lse = DENSE.reference(shape, inputs)
        if self.how == "wrong_small" and shape.batch == 5:
            out = out * 2
        outputs[0].copy_(out.to(torch.bfloat16))
        outputs[1].copy_(lse)
        if self.how == "skips_a_row" and shape.batch != 5:
            outputs[0][0, 0, 0] = math.nan
        return outputs

    @staticmethod
    def _lens(inputs):
        cq, ck = inputs["cu_seqlens_q"], inputs["cu_seqlens_k"]
        if cq is None:
            return (inputs["q"].shape[0],), (inputs["k"].shape[0],)
        cq, ck = cq.tolist(), ck.tolist()
        return tuple(b - a for a, b in zip(cq, cq[1:])), tuple(b - a for a, b in zip(ck, ck[1:]))


@pytest.mark.parametrize("how, verdict", [("right", None), ("wrong_small", "check problem: relative L2 error"),
                                          ("skips_a_row", "shape: 1 of")])
def test_verifier_checks_the_small_problem_then_the_shape(how, verdict):
    family = Dense(how)
    v = verify.Verifier(family, TINY["ragged_prefix"], "cpu", seed=0)
    assert v.small.batch == 5 and 0 in v.small.q_lens          # empty and length-1 pieces
    problem, err = v.verify("variant-x")
    if verdict is None:
        assert problem is None and err < 1e-2
        assert family.calls == [("variant-x", True), ("variant-x", True)]   # offsets read back when checking
    else:
        assert problem.startswith(verdict), problem
    out = v.outputs()
    v.call("variant-x", out)
    assert family.calls[-1] == ("variant-x", False)                          # timed calls do not read back
    assert v.flops() == TINY["ragged_prefix"].flops()


class BiasedFp8(Dense):
    """An FP8 'kernel' that writes the reference but loses a share of out when V has a channel mean, as an
    FP8 wgmma accumulator summing whole rows does (nineteenth session: 15% at 8192 keys, less on shorter rows)."""

    def __init__(self, how, factor=0.9):
        super().__init__(how)
        self.factor = factor

    def call(self, inputs, *, variant=None, kernel=None, outputs=None, check=False):
        outputs = super().call(inputs, variant=variant, kernel=kernel, outputs=outputs, check=check)
        if float(inputs["v"].float().mean()) > 10.0:   # the stored e4m3 values (descaled) of V = 1 + noise
            outputs[0].copy_((outputs[0].float() * self.factor).to(outputs[0].dtype))
        return outputs


def test_verifier_checks_fp8_variants_on_v_with_a_channel_mean():
    """The family's stress inputs (FP8: V = 1 + 0.1 N, make_stress_inputs) catch what zero-mean data
    cannot; bf16 has none, so its verifier runs the two other checks only."""
    from mlagen.families.mla_prefill.reference import make_stress_inputs

    shape = TINY["ragged_prefix"]
    stress = make_stress_inputs(shape, "cpu", 0, "fp8_e4m3")
    v = stress["v"].float() * stress["v_descale"].reshape(1, -1, 1)
    assert abs(float(v.mean()) - 1.0) < 0.02 and 0.05 < float(v.std()) < 0.15
    assert make_stress_inputs(shape, "cpu", 0, "bf16") is None
    family = BiasedFp8("right")
    ver = verify.Verifier(family, shape, "cpu", seed=0, dtype="fp8_e4m3")
    problem, _ = ver.verify("variant-x", parts=("check problem", "shape"))
    assert problem is None, problem                     # zero-mean V hides the loss
    problem, err = ver.verify("variant-x")
    assert problem.startswith("stress: relative L2 error") and err > 0.05, problem
    # 1.5% low passes the FP8 tolerance on the relative L2 error (5e-2) but not the stress check's bias bound
    problem, err = verify.Verifier(BiasedFp8("right", 0.985), shape, "cpu", seed=0, dtype="fp8_e4m3").verify("v")
    assert err < 0.05 and problem.startswith("stress: out / reference 0.98") and "a bias" in problem, problem
    assert verify.Verifier(BiasedFp8("right", 0.998), shape, "cpu", seed=0, dtype="fp8_e4m3").verify("v")[0] is None
    bf = Dense("right")
    assert verify.Verifier(bf, shape, "cpu", seed=0).stress is None
    assert verify.Verifier(bf, shape, "cpu", seed=0).verify("variant-x")[0] is None
