"""What every family's call path shares: argument checks with one-line errors that name the
argument, the 16-byte alignment rule of cp.async / TMA reads, the device a call launches on, and
the result of comparing an output with the reference, and how a shape description's numbers are read.

Families import this; it imports no family and no torch (the tensor checks take torch as an
argument, as the families' call modules already hold it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ArgumentError, ArgumentTypeError

#: Query heads per call: MLA.md requires every head count from 1 to 128 (H/TP heads of 128-head models).
MAX_HEADS = 128

_DECIMAL = re.compile(r"[0-9]+")


def decimal(text: str) -> int | None:
    """``text`` (stripped) as a plain decimal integer of ASCII digits, else None. ``int()`` also
    reads ``+5``, ``1_000`` and other scripts' digits (``\u0663``), which a shape description
    never means; ``0x10`` and ``1e3`` are no integers to either."""
    text = text.strip()
    return int(text) if _DECIMAL.fullmatch(text) else None


def fail(op: str, arg: str, message: str, kind=ArgumentError):
    """Raise ``kind`` (ArgumentError; ArgumentTypeError for a wrong type or dtype) as
    ``"<op>: <arg>: <message>"``."""
    raise kind(f"{op}: {arg}: {message}")


def check_tensor(torch, t, op: str, arg: str, dtype, ndims: tuple, device=None, last_contiguous: bool = False):
    """``t`` is a tensor of ``dtype`` with one of ``ndims`` dimensions, on ``device`` when given,
    and (``last_contiguous``) with a unit-stride last dimension; else one line naming ``arg``."""
    if not isinstance(t, torch.Tensor):
        fail(op, arg, f"expected a torch.Tensor, got {type(t).__name__}", ArgumentTypeError)
    if t.dtype != dtype:
        fail(op, arg, f"dtype must be {dtype}, got {t.dtype}", ArgumentTypeError)
    if t.dim() not in ndims:
        fail(op, arg, f"expected {' or '.join(map(str, ndims))} dimensions, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        fail(op, arg, f"must be on {device} (like q), got {t.device}")
    if last_contiguous and t.numel() > 0 and t.stride(-1) != 1:
        fail(op, arg, f"last dimension must be contiguous (stride 1), got stride {t.stride(-1)}")


def aligned(t) -> bool:
    """Whether t's base and its strides (but the last, and of dimensions of size 1) are multiples
    of 16 bytes: what cp.async and TMA need."""
    if t.data_ptr() % 16:
        return False
    elem = t.element_size()
    return not any(size > 1 and (stride * elem) % 16 for size, stride in zip(t.shape[:-1], t.stride()[:-1]))


def aligned_or_copy(t):
    """cp.async and TMA read 16-byte chunks: a view whose base or strides break that is copied."""
    return t if aligned(t) else t.contiguous()


def device_of(torch, t) -> int:
    """The CUDA device index a call on ``t`` launches on (the tensors' device, not the current one)."""
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def on_device(torch, device: int, fn, *args):
    """``fn(*args)`` with ``device`` current: a cheap check, and the costly switch only when the
    tensors live on another device than the current one."""
    if device == torch.cuda.current_device():
        return fn(*args)
    with torch.cuda.device(device):
        return fn(*args)


@dataclass(frozen=True)
class Check:
    """How one result compares with the reference; ``problem`` is None when it passes."""

    max_abs: float
    rel_l2: float
    lse_max_abs: float | None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def out_error(out, ref_out) -> tuple[float, float]:
    """(max |out - ref|, relative L2 error) in float64; the max where the reference is all zero."""
    diff = out.double() - ref_out.double()
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    norm = float(ref_out.double().norm()) if ref_out.numel() else 0.0
    if norm == 0.0:
        return max_abs, max_abs
    return max_abs, float(diff.norm()) / norm


def check_default_constraints(spec) -> None:
    """The spec's default variant meets the spec's own constraints (SpecError naming the
    constraint otherwise): a spec whose defaults it cannot build is a typo, caught at load time."""
    from .. import expr, variant
    from ..errors import SpecError

    env = variant.make(spec, {}).env()
    for i, c in enumerate(spec.constraints):
        try:
            ok = c.require(env)
        except expr.ExprError as exc:
            raise SpecError(spec.path, f"constraints[{i}].require", str(exc)) from None
        if not ok:
            raise SpecError(spec.path, "tune", f"the default variant breaks constraint {i}: {c.message} "
                            f"(requires {c.require.text})")


class ShapesOf:
    """The shape half of the Family protocol read from a family's problem module (``problem``:
    its ``SHAPES``, the BENCHMARKS.md shapes by id, ``parse_shape`` and ``describe_shape``)."""

    problem = None

    def parse_shape(self, text: str, id: str | None = None):
        return self.problem.parse_shape(text, id)

    def describe_shape(self, shape) -> str:
        return self.problem.describe_shape(shape)

    def shapes(self) -> dict:
        """The shapes of BENCHMARKS.md of this family, by id."""
        return dict(self.problem.SHAPES)
