"""The family protocol and registry: families are found by name, and the dense family offers
everything tune and bench need through it."""

from __future__ import annotations

import pytest

from mlagen import families
from mlagen.errors import SpecError
from mlagen.families.base import Family


def test_families_are_found_by_package_name():
    assert "mla_prefill" in families.names()
    fam = families.get("mla_prefill")
    assert isinstance(fam, Family) and fam.name == "mla_prefill"
    assert families.get("mla_prefill") is fam


def test_unknown_family_names_the_spec_and_the_known_ones():
    with pytest.raises(SpecError, match=r"specs/x.yaml: family: 'dense_mha' is not one of \[.*'mla_prefill'"):
        families.get("dense_mha", "specs/x.yaml")


def test_a_family_must_implement_the_whole_protocol():
    class Half(Family):
        name = "half"

        def validate_spec(self, spec):
            pass

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_dense_family_through_the_protocol():
    fam = families.get("mla_prefill")
    shape = fam.parse_shape("b=4,q=4096,h=16,causal", id="D2")
    assert shape.id == "D2" and shape.batch == 4
    assert fam.problem_key(shape) == "causal/h16/q4096/k4096"
    assert fam.specialization(shape) == {"mask": "causal"}
    assert fam.problem_distance("causal/h16/q4096/k4096", "causal/h32/q4096/k2048") == 2
    assert fam.flops(shape) == 4 * 2 * 16 * 320 * (4096 * 4097 // 2)
    assert fam.describe_shape(shape) == "b=4,q=4096,h=16,causal"


def test_dense_family_inputs_reference_and_compare_on_cpu():
    torch = pytest.importorskip("torch")
    fam = families.get("mla_prefill")
    shape = fam.parse_shape("q=[5,0,9],k=[7,3,9],h=3,causal")
    inputs = fam.make_inputs(shape, torch.device("cpu"), seed=1)
    assert inputs["cu_seqlens_q"].tolist() == [0, 5, 5, 14] and inputs["cu_seqlens_k"].tolist() == [0, 7, 10, 19]
    ref = fam.reference(shape, inputs, heads=None)
    assert ref[0].shape == (14, 3, 128) and ref[1].shape == (14, 3)
    assert fam.compare((ref[0].to(torch.bfloat16), ref[1]), ref).ok
    bad = ref[0].clone()
    bad[3] += 1
    check = fam.compare((bad, ref[1]), ref)
    assert not check.ok and "relative L2 error" in check.problem


def test_check_shape_and_outputs():
    torch = pytest.importorskip("torch")
    fam = families.get("mla_prefill")
    shape = fam.parse_shape("b=2,q=4096,h=128,none", id="D3")
    small = fam.check_shape(shape)
    assert small.heads == 16 and not small.causal and 0 in small.q_lens and 1 in small.q_lens
    out, lse = fam.make_outputs(small, torch.device("cpu"))
    assert out.shape == (sum(small.q_lens), 16, 128) and out.dtype == torch.bfloat16 and torch.isnan(out).all()
    assert lse.shape == (sum(small.q_lens), 16) and torch.isnan(lse).all()
    inputs = fam.make_inputs(small, torch.device("cpu"))
    ref = fam.reference(small, inputs, heads=None)
    check = fam.compare((out, lse), ref)
    assert not check.ok and "NaN" in check.problem
