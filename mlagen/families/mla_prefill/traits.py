"""The traits of a dense call beyond MLA.md section 1 (its section 1b): head geometry, mask, score.

:func:`check_traits` checks the public call's ``window_size``, ``chunk_size``, ``softcap`` and
``attn_sink`` arguments into a frozen :class:`Traits` (FlashAttention's conventions: a window side
of -1 is unbounded, causal with a window is the window (left, 0)); :func:`geometry_of` finds the
head geometry from the tensors' widths. Reads shapes only, never values, so the fake (meta)
implementation of the torch op can run it. Pure Python apart from the tensors it is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...errors import ArgumentError, ArgumentTypeError
from .problem import DEFAULT_GEOMETRY, GEOMETRIES, geometry_name, normalize_mask, score_name, specialization_of


@dataclass(frozen=True)
class Traits:
    """A call's geometry, mask and score traits, canonical (normalize_mask)."""

    geometry: str = DEFAULT_GEOMETRY
    mask: str = "causal"                 # causal, none, window or chunked
    window: tuple[int, int] = (-1, -1)
    chunk: int = 0
    softcap: float = 0.0
    attn_sink: Any = None                # fp32 [H] on q's device, or None

    @property
    def dims(self) -> tuple[int, int, int]:
        return GEOMETRIES[self.geometry]

    @property
    def score(self) -> str:
        return score_name(self.softcap > 0, self.attn_sink is not None)

    @property
    def default(self) -> bool:
        """Section 1's traits only (what every dense spec implements)."""
        return self.geometry == DEFAULT_GEOMETRY and self.mask in ("causal", "none") and self.score == "plain"

    def specialization(self) -> dict:
        """The spec axes these traits fix: the mask, and the others where they are not the default."""
        return specialization_of(self.mask, self.geometry, self.score)


def _fail(arg: str, message: str):
    raise ArgumentError(f"mla_prefill: {arg}: {message}")


def _fail_type(arg: str, message: str):
    raise ArgumentTypeError(f"mla_prefill: {arg}: {message}")


def _allowed_geometries() -> str:
    return ", ".join("/".join(map(str, g)) for g in GEOMETRIES.values())


def geometry_of(q, k, v, k_rope) -> str:
    """The geometry name of the tensors' last widths: (k, k_rope, v) when k_rope is given, else
    (q, v) (k then holds all d_qk columns; how they split into nope and rope does not matter).
    ArgumentError naming the tensors and the geometries there are."""
    d_qk, d_v = q.shape[-1], v.shape[-1]
    if k_rope is not None and k_rope.dim() == 3 and k.dim() == 3:
        name = geometry_name(k.shape[-1], k_rope.shape[-1], d_v)
        if name not in GEOMETRIES:
            _fail("k_rope", f"k's {k.shape[-1]} nope, k_rope's {k_rope.shape[-1]} rope and v's {d_v} value columns are "
                            f"no head geometry of this family (d_nope/d_rope/d_v: {_allowed_geometries()})")
        return name
    for name, (d_nope, d_rope, dv) in GEOMETRIES.items():
        if d_nope + d_rope == d_qk and dv == d_v:
            return name
    _fail("q", f"last dimension {d_qk} with v's {d_v} is no head geometry of this family "
               f"(d_nope/d_rope/d_v: {_allowed_geometries()}; q holds d_nope + d_rope)")


def _window(window_size) -> tuple[int, int]:
    if window_size is None:
        return -1, -1
    if isinstance(window_size, list):
        window_size = tuple(window_size)
    if (not isinstance(window_size, tuple) or len(window_size) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in window_size)):
        _fail_type("window_size", f"expected a pair of ints (left, right), got {window_size!r}")
    if any(x < -1 for x in window_size):
        _fail("window_size", f"each side is >= 0, or -1 for unbounded; got {window_size!r}")
    return window_size


def check_traits(torch, q, causal: bool, window_size=(-1, -1), chunk_size=None, softcap=0.0, attn_sink=None,
                 geometry: str = DEFAULT_GEOMETRY, heads: int | None = None, longest_k: int | None = None) -> Traits:
    """The checked traits of a call (``heads``: q's head count; ``longest_k``: a bound on any
    sequence's keys, such as total_k, which makes a window side or chunk past it unbounded).

    ``window_size`` (left, right): query i at p = i + Lk - Lq sees keys p - left .. p + right (-1:
    unbounded; with ``causal`` right is 0). ``chunk_size`` C: keys j <= p with j // C == p // C
    (excludes a window). ``softcap`` c > 0: s <- c tanh(s / c) before the mask. ``attn_sink``: fp32
    [H] on q's device, natural-log units; only the softmax's denominator changes.
    """
    left, right = _window(window_size)
    if chunk_size is not None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int):
            _fail_type("chunk_size", f"expected an int or None, got {chunk_size!r}")
        if chunk_size < 1:
            _fail("chunk_size", f"must be >= 1, got {chunk_size}")
        if (left, right) != (-1, -1):
            _fail("chunk_size", f"chunked attention excludes a window; got window_size {window_size!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        _fail_type("softcap", f"expected a float (0.0: none), got {softcap!r}")
    softcap = float(softcap)
    if not (math.isfinite(softcap) and softcap >= 0):
        _fail("softcap", f"must be a finite number >= 0 (0.0: none), got {softcap!r}")
    if attn_sink is not None:
        if not isinstance(attn_sink, torch.Tensor):
            _fail_type("attn_sink", f"expected a float32 torch.Tensor of shape [heads], got {type(attn_sink).__name__}")
        if attn_sink.dtype != torch.float32:
            _fail_type("attn_sink", f"dtype must be torch.float32, got {attn_sink.dtype}")
        if attn_sink.dim() != 1 or (heads is not None and attn_sink.shape[0] != heads):
            _fail("attn_sink", f"expected shape [{heads}] (one sink per head), got {tuple(attn_sink.shape)}")
        if attn_sink.device != q.device:
            _fail("attn_sink", f"must be on {q.device} (like q), got {attn_sink.device}")
    mask, window, chunk = normalize_mask(causal, (left, right), chunk_size or 0, longest_k)
    return Traits(geometry, mask, window, chunk, softcap, attn_sink)
