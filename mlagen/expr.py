"""A small, safe expression language for spec constraints and resource formulas.

Specs say things like ``block_m % (warps * 16) == 0`` or
``smem: block_m * d_qk * 2 + stages * block_n * (d_qk + d_v) * 2``. These are parsed with
Python's ``ast`` and evaluated by walking a whitelist of node types: numbers, strings, booleans,
names bound by the caller, arithmetic, comparisons, ``and``/``or``/``not``, conditional
expressions, ``in`` over literal lists, and the functions in ``FUNCTIONS``. Attribute access,
subscripts, calls to anything else, lambdas and comprehensions are rejected when parsed, so a
spec can never run arbitrary Python.

Evaluation is bounded in size and so in time: an expression has at most ``MAX_NODES`` nodes and
``MAX_TEXT`` characters, every intermediate integer fits in ``MAX_INT_BITS`` bits and every string
or list in ``MAX_LEN`` items, and an operation that would exceed a bound (``(10**64)**64``,
``'a' * 10**9``) is refused before it is computed. Without loops, that bounds the work too.
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from dataclasses import dataclass, field
from typing import Any, Mapping

FUNCTIONS = {
    "min": min,
    "max": max,
    "abs": abs,
    "ceil_div": lambda a, b: -(-a // b),
    "round_up": lambda a, b: -(-a // b) * b,
    "log2": lambda a: int(math.log2(a)),
    "is_pow2": lambda a: a > 0 and (a & (a - 1)) == 0,
}

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.truediv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
_CMPOPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}


MAX_TEXT = 2000       # characters of one expression
MAX_NODES = 400       # syntax-tree nodes of one expression
MAX_INT_BITS = 256    # any intermediate integer (shared memory bytes need 20)
MAX_LEN = 1024        # items of any intermediate string or list
MAX_EXPONENT = 64


class ExprError(ValueError):
    """An expression is not in the allowed language, or names something undefined."""


@dataclass(frozen=True)
class Expr:
    """A parsed expression; ``names`` lists the free variables it reads."""

    text: str
    # Both follow from ``text``; an expression (and so a spec) is equal to one parsed from the
    # same text, which ast nodes (compared by identity) would prevent.
    tree: ast.Expression = field(compare=False)
    names: frozenset[str] = field(compare=False)

    def __call__(self, env: Mapping[str, Any]) -> Any:
        missing = self.names - env.keys()
        if missing:
            raise ExprError(f"{self.text!r} uses undefined name(s) {', '.join(sorted(missing))}")
        try:
            return _eval(self.tree.body, env)
        except ExprError:
            raise
        except (ArithmeticError, TypeError, ValueError) as exc:  # e.g. ceil_div(a, 0), 'pad' + 1
            raise ExprError(f"{self.text!r}: {type(exc).__name__}: {exc}") from None
        except (MemoryError, RecursionError) as exc:  # not expected within the bounds; never a crash
            raise ExprError(f"{self.text!r}: too large to evaluate ({type(exc).__name__})") from None


def parse(text: str | int | float | bool) -> Expr:
    """Parse ``text``; raise ExprError if it uses anything outside the language. An expression
    is parsed once per process (the resource model evaluates the same few thousand times per
    tuning batch)."""
    if isinstance(text, (str, int, float)):   # bool is an int
        return _parse_cached(text)
    return _parse(text)


@functools.lru_cache(maxsize=4096, typed=True)
def _parse_cached(text: str | int | float | bool) -> Expr:
    return _parse(text)


def _parse(text) -> Expr:
    if isinstance(text, bool) or isinstance(text, (int, float)):
        text = repr(text)
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"expected an expression string, got {_short(text)}")
    if len(text) > MAX_TEXT:
        raise ExprError(f"{_short(text)}: {len(text)} characters, an expression may have at most {MAX_TEXT}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"{_short(text)} is not a valid expression: {exc.msg}") from None
    except (MemoryError, RecursionError, ValueError) as exc:  # nesting too deep for the parser; NUL bytes
        raise ExprError(f"{_short(text)} is not a valid expression: {type(exc).__name__}") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ExprError(f"{_short(text)}: {len(nodes)} syntax nodes, an expression may have at most {MAX_NODES}")
    names: set[str] = set()
    for node in nodes:
        _check(node, text)
        if isinstance(node, ast.Name) and node.id not in FUNCTIONS and node.id not in ("True", "False"):
            names.add(node.id)
    return Expr(text=text.strip(), tree=tree, names=frozenset(names))


def _check(node: ast.AST, text: str) -> None:
    allowed = (
        ast.Expression, ast.Constant, ast.Name, ast.Load, ast.BinOp, ast.UnaryOp, ast.BoolOp,
        ast.Compare, ast.IfExp, ast.Call, ast.List, ast.Tuple, ast.And, ast.Or,
        *_BINOPS, *_UNARY, *_CMPOPS,
    )
    if not isinstance(node, allowed):
        raise ExprError(f"{_short(text)}: {type(node).__name__} is not allowed in spec expressions")
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ExprError(
                f"{text!r}: only these functions may be called: {', '.join(sorted(FUNCTIONS))}"
            )
        if node.keywords:
            raise ExprError(f"{text!r}: keyword arguments are not allowed")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, bool)):
        raise ExprError(f"{text!r}: constant {node.value!r} is not allowed")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def _is_int(x: Any) -> bool:
    return isinstance(x, int)  # bools too: True ** 9 is an int


def _precheck(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse an operation whose result would exceed the bounds, before computing it."""
    if isinstance(op, ast.Pow) and _is_int(left) and _is_int(right):
        if abs(right) > MAX_EXPONENT:
            raise ExprError(f"exponent too large ({right}; at most {MAX_EXPONENT})")
        if right > 0 and abs(left).bit_length() * right > MAX_INT_BITS + 1:
            raise ExprError(f"result too large ({left} ** {right} exceeds {MAX_INT_BITS} bits)")
    if isinstance(op, ast.Mult):
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, tuple)) and _is_int(n) and len(seq) * max(n, 0) > MAX_LEN:
                raise ExprError(f"result too large (a sequence of {len(seq)} times {n}; at most {MAX_LEN} items)")


def _bounded(value: Any) -> Any:
    """``value`` if it is within the bounds, else an ExprError."""
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ExprError(f"result too large (an integer of {value.bit_length()} bits; at most {MAX_INT_BITS})")
    if isinstance(value, (str, tuple)) and len(value) > MAX_LEN:
        raise ExprError(f"result too large ({len(value)} items; at most {MAX_LEN})")
    return value


def _eval(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        if node.id in FUNCTIONS:
            raise ExprError(f"{node.id} is a function; call it")
        raise ExprError(f"undefined name {node.id}")
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        _precheck(node.op, left, right)
        try:
            return _bounded(_BINOPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ExprError("division by zero") from None
    if isinstance(node, ast.UnaryOp):
        return _bounded(_UNARY[type(node.op)](_eval(node.operand, env)))
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            value = True
            for item in node.values:
                value = _eval(item, env)
                if not value:
                    return value
            return value
        value = False
        for item in node.values:
            value = _eval(item, env)
            if value:
                return value
        return value
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, env)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body, env) if _eval(node.test, env) else _eval(node.orelse, env)
    if isinstance(node, (ast.List, ast.Tuple)):
        return tuple(_eval(item, env) for item in node.elts)
    if isinstance(node, ast.Call):
        return _bounded(FUNCTIONS[node.func.id](*(_eval(arg, env) for arg in node.args)))
    raise ExprError(f"{type(node).__name__} is not allowed")  # unreachable after _check
