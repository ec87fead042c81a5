"""mlagen.expr: the safe expression language of spec constraints and resource formulas."""

from __future__ import annotations

import pickle

import pytest

from mlagen import expr
from mlagen.expr import ExprError


def ev(text, **env):
    return expr.parse(text)(env)


@pytest.mark.parametrize("text, env, expected", [
    ("1 + 2 * 3", {}, 7),
    ("(1 + 2) * 3", {}, 9),
    ("7 // 2", {}, 3),
    ("7 / 2", {}, 3.5),
    ("7 % 4", {}, 3),
    ("2 ** 10", {}, 1024),
    ("-a + +b", {"a": 3, "b": 5}, 2),
    ("block_m * d_qk * 2", {"block_m": 64, "d_qk": 192}, 24576),
    ("1 < 2 <= 2 < 3", {}, True),
    ("1 < 2 > 3", {}, False),
    ("a == 3 and b != 4", {"a": 3, "b": 4}, False),
    ("a == 3 or b != 4", {"a": 3, "b": 4}, True),
    ("not flag", {"flag": False}, True),
    ("0 or 5", {}, 5),          # Python semantics: the deciding operand, not a bool
    ("3 and 0", {}, 0),
    ("16 if swizzle == 'pad' else 0", {"swizzle": "pad"}, 16),
    ("16 if swizzle == 'pad' else 0", {"swizzle": "xor"}, 0),
    ("x in [32, 64]", {"x": 64}, True),
    ("x not in (32, 64)", {"x": 64}, False),
    ("order in ['none', 'pingpong']", {"order": "pingpong"}, True),
    ("min(a, 4, 2)", {"a": 3}, 2),
    ("max(a, 4)", {"a": 3}, 4),
    ("abs(-7)", {}, 7),
    ("ceil_div(130, 64)", {}, 3),
    ("ceil_div(128, 64)", {}, 2),
    ("round_up(130, 64)", {}, 192),
    ("log2(1024)", {}, 10),
    ("is_pow2(64)", {}, True),
    ("is_pow2(96)", {}, False),
    ("is_pow2(0)", {}, False),
    ("True and x", {"x": 1}, 1),
    ("'a' == 'a'", {}, True),
])
def test_evaluates(text, env, expected):
    result = ev(text, **env)
    assert result == expected
    assert type(result) is type(expected)


def test_and_or_short_circuit():
    # The right operand would fail (division by zero) if it were evaluated.
    assert ev("x == 0 or 1 // x", x=0) is True
    assert ev("x != 0 and 1 // x > 0", x=0) is False
    assert ev("1 // x if x else -1", x=0) == -1


def test_names_lists_free_variables_only():
    e = expr.parse("min(block_m, 64) * warps + (1 if flag else 0) + True")
    assert e.names == frozenset({"block_m", "warps", "flag"})
    assert e.text == "min(block_m, 64) * warps + (1 if flag else 0) + True"


def test_literals_are_accepted_as_values():
    assert expr.parse(5)({}) == 5
    assert expr.parse(True)({}) is True
    assert expr.parse(2.5)({}) == 2.5


def test_undefined_name_is_named():
    with pytest.raises(ExprError, match=r"undefined name\(s\) stages, warps"):
        ev("warps * stages + 1")
    with pytest.raises(ExprError, match="stages"):
        ev("warps * stages", warps=2)


def test_function_name_without_call_is_an_error():
    with pytest.raises(ExprError, match="min is a function"):
        ev("min + 1")


@pytest.mark.parametrize("text, what", [
    ("a.b", "Attribute"),
    ("().__class__", "Attribute"),
    ("x[0]", "Subscript"),
    ("lambda: 1", "Lambda"),
    ("[i for i in x]", "ListComp"),
    ("{1: 2}", "Dict"),
    ("{1, 2}", "Set"),
    ("f'{x}'", "JoinedStr"),
    ("(y := 3)", "NamedExpr"),
    ("x << 2", "LShift"),
    ("x is None", "Is"),
    ("min(*x)", "Starred"),
])
def test_rejects_node(text, what):
    with pytest.raises(ExprError, match=what):
        expr.parse(text)


@pytest.mark.parametrize("text", [
    "__import__('os')",
    "__import__('os').system('true')",
    "eval('1')",
    "open('/etc/passwd')",
    "getattr(x, 'y')",
    "(min)(1, 2)" + ".real",
    "x(1)",
])
def test_rejects_calls_outside_the_whitelist(text):
    with pytest.raises(ExprError):
        expr.parse(text)


def test_rejected_call_lists_the_allowed_functions():
    with pytest.raises(ExprError, match="only these functions may be called: abs, ceil_div"):
        expr.parse("__import__('os')")


def test_rejects_keyword_arguments():
    with pytest.raises(ExprError, match="keyword arguments are not allowed"):
        expr.parse("min(1, 2, key=abs)")


@pytest.mark.parametrize("text", ["", "   ", "1 +", "a b", "1)"])
def test_rejects_non_expressions(text):
    with pytest.raises(ExprError):
        expr.parse(text)


def test_rejects_statements():
    with pytest.raises(ExprError):
        expr.parse("import os")
    with pytest.raises(ExprError):
        expr.parse("x = 1")


def test_rejects_non_string_input():
    with pytest.raises(ExprError, match="expected an expression string"):
        expr.parse(None)
    with pytest.raises(ExprError):
        expr.parse(["a"])


@pytest.mark.parametrize("text, env, match", [
    ("1 // x", {"x": 0}, "division by zero"),
    ("1 % x", {"x": 0}, "division by zero"),
    ("2 ** 1000", {}, "exponent too large"),
    # Failures inside whitelisted functions and type mix-ups are ExprErrors too, so a resource
    # model that fails to evaluate prunes a variant instead of crashing the tool.
    ("ceil_div(a, b)", {"a": 1, "b": 0}, "ceil_div"),
    ("log2(x)", {"x": 0}, "log2"),
    ("swizzle + 1", {"swizzle": "pad"}, "swizzle"),
])
def test_evaluation_errors_are_expr_errors(text, env, match):
    with pytest.raises(ExprError, match=match):
        ev(text, **env)


def test_expr_error_is_a_value_error():
    assert issubclass(ExprError, ValueError)


def test_equal_text_gives_equal_expressions():
    # Specs are compared and hashed (dispatch memoises on them); parsing twice must not matter.
    a, b = expr.parse("block_m * 2"), expr.parse("block_m * 2")
    assert a == b and hash(a) == hash(b)
    assert a != expr.parse("block_m * 3")


def test_parsed_expression_survives_pickle():
    e = expr.parse("ceil_div(a, 64) * 2")
    assert pickle.loads(pickle.dumps(e))({"a": 130}) == 6


@pytest.mark.parametrize("text, match", [
    ("(10**64)**64", "result too large"),
    ("((10**64)**64)**64", "result too large"),
    ("(((10**64)**64)**64)**64", "result too large"),
    ("'a' * 10**9", "result too large (a sequence of 1 times 1000000000"),
    ("10**9 * 'a'", "result too large"),
    ("(1, 2) * 10**8", "result too large"),
    ("x * x * x", "result too large (an integer of"),
    ("2 ** 65", "exponent too large"),
    ("1 + " * 300 + "1", "syntax nodes, an expression may have at most 400"),
    ("(" * 300 + "1" + ")" * 300, "is not a valid expression"),
    ("1" * 3000, "characters, an expression may have at most 2000"),
])
def test_evaluation_is_bounded_in_size_and_time(text, match):
    # Nested powers and repetitions are refused before they are computed: no hang, no MemoryError.
    import time

    t0 = time.perf_counter()
    with pytest.raises(ExprError) as info:
        ev(text, x=2 ** 100)
    assert match in str(info.value) and len(str(info.value)) < 300
    assert time.perf_counter() - t0 < 1.0


def test_values_within_the_bounds_still_evaluate():
    assert ev("10 ** 64 * 10 ** 10") == 10 ** 74
    assert ev("'ab' * 512") == "ab" * 512
    assert ev("2 ** -1") == 0.5
