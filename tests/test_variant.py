"""mlagen.variant: one concrete choice of every axis; its symbol is a pure, readable, stable name."""

from __future__ import annotations

import math
import pickle
import re

import pytest

from mlagen import spec as spec_mod
from mlagen import variant
from mlagen.errors import SpecError

S80 = spec_mod.load("mla_prefill_sm80")
S90 = spec_mod.load("mla_prefill_sm90")
C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def fixed_except(s, *free):
    """Every axis held at its default except ``free`` (keeps sm90 enumerations small as the spec grows)."""
    return {k: v for k, v in variant.default(s).values if k not in free}


def space_size(s, fixed=()):
    """Written out here, to check variant.space_size and enumerate_space against."""
    return math.prod(1 if k in fixed else len(v) for k, v in
                     [*s.specialize, *((t.name, t.values) for t in s.tunables)])


# --- names ----------------------------------------------------------------------------------


def test_sm80_default_symbol():
    v = variant.default(S80)
    assert v.symbol == "mla_prefill_sm80_causal_m128_n64_w8_s2_swpad_qr1"
    assert v.describe() == "mask=causal block_m=128 block_n=64 warps=8 stages=2 swizzle=pad q_in_regs=1"


@pytest.mark.parametrize("values, symbol", [
    ({"mask": "none"}, "mla_prefill_sm80_none_m128_n64_w8_s2_swpad_qr1"),
    ({"block_m": 64, "warps": 4, "block_n": 32, "stages": 3}, "mla_prefill_sm80_causal_m64_n32_w4_s3_swpad_qr1"),
    ({"swizzle": "xor", "q_in_regs": False}, "mla_prefill_sm80_causal_m128_n64_w8_s2_swxor_qr0"),
])
def test_sm80_symbols(values, symbol):
    assert variant.make(S80, values).symbol == symbol


def test_sm90_default_symbol_is_readable():
    sym = variant.default(S90).symbol
    assert sym.startswith("mla_prefill_sm90_causal_n128r64v128_plain_c2_n128_s2_")
    # Every tunable appears once, as its abbreviation followed by its value, in spec order.
    parts = sym[len("mla_prefill_sm90_causal_n128r64v128_plain_"):].split("_")
    assert parts == [t.abbr + variant._fmt(t.default) for t in S90.tunables]


def test_symbol_is_a_pure_function_of_the_values():
    a = variant.make(S80, {"block_n": 32, "mask": "none"})
    b = variant.make(spec_mod.load("mla_prefill_sm80"), {"mask": "none", "block_n": 32})  # other order, new load
    assert a.symbol == b.symbol
    assert a == b and hash(a) == hash(b)
    assert a.symbol != variant.make(S80, {"block_n": 64, "mask": "none"}).symbol


def test_sm80_symbols_are_unique_identifiers():
    symbols = [v.symbol for v in variant.enumerate_space(S80)]
    assert len(symbols) == len(set(symbols)) == 256
    assert all(C_IDENT.match(s) for s in symbols)


def test_sm90_symbols_are_unique_identifiers():
    vs = list(variant.enumerate_space(S90, fixed_except(S90, "mask", "consumers", "block_n", "stages", "order",
                                                         "producer_regs", "consumer_regs", "swizzle_k")))
    symbols = {v.symbol for v in vs}
    assert len(symbols) == len(vs) > 1000
    assert all(C_IDENT.match(s) for s in symbols)


@pytest.mark.parametrize("value, text", [(True, "1"), (False, "0"), (64, "64"), (-2, "_2"), ("pad", "pad"),
                                         (1.5, "1p5"), ("a-b", "a_b")])
def test_fmt(value, text):
    assert variant._fmt(value) == text


# --- values ---------------------------------------------------------------------------------


def test_default_takes_first_specialisation_and_tunable_defaults():
    v = variant.default(S80)
    assert v.specialization == {"mask": "causal"}
    assert v.tunables == {"block_m": 128, "block_n": 64, "warps": 8, "stages": 2, "swizzle": "pad", "q_in_regs": True}
    assert [k for k, _ in v.values] == list(S80.axes)
    assert variant.default(S80, mask="none")["mask"] == "none"


def test_item_access():
    v = variant.default(S80)
    assert v["block_n"] == 64
    assert v.get("nope", 7) == 7
    with pytest.raises(KeyError):
        v["d_qk"]  # derived names live in env(), not in the values


def test_env_has_problem_values_and_derived():
    env = variant.make(S80, {"block_m": 128, "warps": 4, "q_in_regs": False, "swizzle": "xor"}).env()
    assert (env["d_nope"], env["d_rope"], env["d_v"], env["dtype"]) == (128, 64, 128, "bf16")
    assert env["d_qk"] == 192
    assert env["m_tiles"] == 2
    assert env["row_pad"] == 0
    assert variant.default(S80).env()["row_pad"] == 16
    env90 = variant.make(S90, {"consumers": 1, "order": "none"}).env()
    assert (env90["block_m"], env90["threads"]) == (64, 256)


def test_with_values():
    v = variant.default(S80).with_values(block_n=32, mask="none")
    assert (v["block_n"], v["mask"], v["block_m"]) == (32, "none", 128)
    with pytest.raises(SpecError, match="tune.block_n"):
        variant.default(S80).with_values(block_n=33)


def test_unknown_tunable():
    with pytest.raises(SpecError) as info:
        variant.make(S80, {"block_k": 64})
    assert info.value.key == "tune.block_k"
    assert str(info.value).endswith(
        "tune.block_k: unknown tunable; known: mask, block_m, block_n, warps, stages, swizzle, q_in_regs")


@pytest.mark.parametrize("value, shown", [(48, "48"), ("96x", "'96x'"), (64.0, "64.0"), (True, "True")])
def test_value_outside_the_space(value, shown):
    with pytest.raises(SpecError) as info:
        variant.make(S80, {"block_n": value})
    assert str(info.value) == f"{S80.path}: tune.block_n: {shown} is not one of [32, 64, 96, 128]"


def test_bool_tunable_needs_a_bool_or_a_string():
    with pytest.raises(SpecError, match=r"tune.q_in_regs: 1 is not one of \[True, False\]"):
        variant.make(S80, {"q_in_regs": 1})


def test_bad_specialisation():
    with pytest.raises(SpecError, match=r"specialize.mask: 'sliding' is not one of \['causal', 'none'\]"):
        variant.make(S80, {"mask": "sliding"})


@pytest.mark.parametrize("strings, typed", [
    ({"block_n": "64"}, {"block_n": 64}),
    ({"q_in_regs": "true"}, {"q_in_regs": True}),
    ({"q_in_regs": "False"}, {"q_in_regs": False}),
    ({"q_in_regs": "0"}, {"q_in_regs": False}),
    ({"swizzle": "pad"}, {"swizzle": "pad"}),
    ({"swizzle": "XOR"}, {"swizzle": "xor"}),
    ({"mask": "none", "stages": "3"}, {"mask": "none", "stages": 3}),
])
def test_cli_strings_are_coerced(strings, typed):
    a, b = variant.make(S80, strings), variant.make(S80, typed)
    assert a == b
    for key, value in typed.items():
        assert type(a[key]) is type(value)


# --- the search space -----------------------------------------------------------------------


def test_enumerate_space_size_is_the_product_of_value_counts():
    vs = list(variant.enumerate_space(S80))
    assert len(vs) == space_size(S80) == 2 * 2 * 4 * 2 * 2 * 2 * 2
    assert len(set(vs)) == len(vs)
    assert vs[0].values == tuple((k, v) for k, v in zip(S80.axes, ("causal", 64, 32, 4, 2, "pad", True)))


def test_enumerate_space_yields_what_make_would():
    for v in variant.enumerate_space(S80):
        assert v == variant.make(S80, dict(v.values))


def test_fixed_restricts_the_space():
    fixed = {"block_n": 64, "mask": "none"}
    vs = list(variant.enumerate_space(S80, fixed))
    assert len(vs) == space_size(S80, fixed) == 32
    assert all(v["block_n"] == 64 and v["mask"] == "none" for v in vs)


def test_fixed_accepts_cli_strings_and_keeps_types():
    vs = list(variant.enumerate_space(S80, {"block_n": "64", "q_in_regs": "false"}))
    assert len(vs) == 32
    assert all(type(v["block_n"]) is int and v["q_in_regs"] is False for v in vs)


def test_fixed_is_validated():
    with pytest.raises(SpecError, match="tune.block_n: 48 is not one of"):
        list(variant.enumerate_space(S80, {"block_n": 48}))
    with pytest.raises(SpecError, match="tune.bogus: unknown tunable"):
        list(variant.enumerate_space(S80, {"bogus": 1}))


def test_sm90_space_size():
    fixed = fixed_except(S90, "block_n", "stages", "scheduler", "epilogue", "swizzle_q", "producer_regs")
    n = sum(1 for _ in variant.enumerate_space(S90, fixed))
    assert n == space_size(S90, fixed) == variant.space_size(S90, fixed)
    assert variant.space_size(S90) == space_size(S90) > 100_000


def test_space_size():
    assert variant.space_size(S80) == 256
    assert variant.space_size(S80, {"block_n": "64", "mask": "none"}) == 32
    with pytest.raises(SpecError, match="tune.block_n"):
        variant.space_size(S80, {"block_n": 48})


# --- command-line assignments ---------------------------------------------------------------


def test_parse_assignments():
    got = variant.parse_assignments(S80, ["block_n=64,stages=3", " swizzle = xor ", "mask=none,", "q_in_regs=false"])
    assert got == {"block_n": 64, "stages": 3, "swizzle": "xor", "mask": "none", "q_in_regs": False}
    assert type(got["block_n"]) is int and got["q_in_regs"] is False


def test_parse_assignments_reads_symbol_spelling():
    # The symbol spells booleans 1/0 ("..._qr1"); the same spelling works on the command line.
    assert variant.parse_assignments(S80, ["q_in_regs=1"]) == {"q_in_regs": True}
    assert variant.parse_assignments(S80, ["q_in_regs=0"]) == {"q_in_regs": False}


def test_parse_assignments_errors():
    with pytest.raises(SpecError, match="'block_n': expected name=value"):
        variant.parse_assignments(S80, ["block_n"])
    with pytest.raises(SpecError, match=r"tune.block_n: '96x' is not one of \[32, 64, 96, 128\]"):
        variant.parse_assignments(S80, ["block_n=96x"])
    unknown = variant.parse_assignments(S80, ["bogus=3"])  # reported by make(), which knows the axes
    with pytest.raises(SpecError, match="tune.bogus: unknown tunable"):
        variant.make(S80, unknown)


def test_parse_assignments_empty():
    assert variant.parse_assignments(S80, []) == {}
    assert variant.parse_assignments(S80, [",", ""]) == {}


def test_variant_pickles():
    v = variant.make(S90, {"consumers": 1, "order": "none", "mask": "none"})
    back = pickle.loads(pickle.dumps(v))
    assert back == v and back.symbol == v.symbol and back.env() == v.env()


# --- symbols back to variants ---------------------------------------------------------------


@pytest.mark.parametrize("name", [p.stem for p in spec_mod.available()])
def test_from_symbol_inverts_symbol(name):
    """Every spec (values with '_' such as fp8_v32 included): 40 sampled variants and the default
    come back from their symbols."""
    s = spec_mod.load(name)
    for v in [variant.default(s), *variant.sample_space(s, 40, seed=1)]:
        assert variant.from_symbol(s, v.symbol) == v


def test_from_symbol_rejects_other_names():
    with pytest.raises(SpecError, match="is not a kernel of mla_prefill_sm80"):
        variant.from_symbol(S80, variant.default(S90).symbol)
    bad = variant.default(S90).symbol.replace("_n128_", "_n100_")
    with pytest.raises(SpecError, match="names no variant of mla_prefill_sm90"):
        variant.from_symbol(S90, bad)
    with pytest.raises(SpecError, match="names no variant"):
        variant.from_symbol(S90, variant.default(S90).symbol + "_x1")


def test_kernel_choice_spec_symbol_or_clear_error():
    from mlagen import dispatch

    assert dispatch.kernel_choice("mla_prefill", "mla_prefill_sm80") == "mla_prefill_sm80"
    fp8 = variant.default(spec_mod.load("mla_prefill_sm90_fp8"))
    assert dispatch.kernel_choice("mla_prefill", fp8.symbol) == fp8   # the longer spec name wins
    v = variant.make(S90, {"mask": "none", "block_n": 112, "order": "none"})
    assert dispatch.kernel_choice("mla_prefill", v.symbol) == v
    with pytest.raises(ValueError, match=r"kernel: 'sm90' is neither a spec of mla_prefill \(mla_prefill_sm90, "):
        dispatch.kernel_choice("mla_prefill", "sm90")
    with pytest.raises(ValueError, match="kernel: .* names no variant of mla_prefill_sm90"):
        dispatch.kernel_choice("mla_prefill", v.symbol.replace("_n112_", "_n7_"))


def test_parse_assignments_takes_a_kernel_symbol():
    """``--fixed <symbol>`` fixes every tunable of that variant (not its specialisation: the shape's
    mask decides that); later items still override."""
    v = variant.make(S90, {"mask": "none", "block_n": 112, "order": "none", "cluster": 2, "scheduler": "static"})
    fixed = variant.parse_assignments(S90, [v.symbol])
    assert fixed == v.tunables and "mask" not in fixed
    assert variant.parse_assignments(S90, [v.symbol + ",stages=3"])["stages"] == 3
    assert variant.make(S90, {**fixed, "mask": "none"}) == v
    with pytest.raises(SpecError, match="names no variant of mla_prefill_sm90"):
        variant.parse_assignments(S90, [v.symbol.replace("_n112_", "_n113_")])


def test_parse_assignments_refuses_a_name_given_twice():
    """Issue 42 point 15: only a name=value after a kernel symbol may override one of its tunables."""
    v = variant.make(S90, {"block_n": 112})
    assert variant.parse_assignments(S90, [v.symbol, "block_n=128"])["block_n"] == 128
    for items in (["block_n=64,block_n=128"], ["block_n=64", "block_n=64"], ["block_n=64", v.symbol],
                  [v.symbol, "block_n=128,block_n=96"]):
        with pytest.raises(SpecError, match="tune.block_n: given twice"):
            variant.parse_assignments(S90, items)
    with pytest.raises(SpecError, match="given twice"):
        variant.parse_assignments(S90, [v.symbol, v.symbol])
