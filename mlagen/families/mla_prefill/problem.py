"""Shapes and shape classes of dense MLA prefill; FLOPs by the BENCHMARKS.md convention.

Pure Python (no torch): the tuner, the benchmark, dispatch and the shape recorder all use it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

D_NOPE, D_ROPE, D_V = 128, 64, 128
D_QK = D_NOPE + D_ROPE
MASKS = ("causal", "none")


def _pow2_ceil(x: float) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


@dataclass(frozen=True)
class ProblemKey:
    """The shape class a tuning record applies to (host-known values only, bucketed)."""

    mask: str
    heads: int       # power of two at or above the head count
    q_per_seq: int   # power of two at or above the mean query length
    k_per_seq: int

    def __str__(self) -> str:
        return f"{self.mask}/h{self.heads}/q{self.q_per_seq}/k{self.k_per_seq}"

    @classmethod
    def parse(cls, text: str) -> "ProblemKey":
        try:
            mask, h, q, k = text.split("/")
            if mask not in MASKS or h[0] != "h" or q[0] != "q" or k[0] != "k":
                raise ValueError
            key = cls(mask, int(h[1:]), int(q[1:]), int(k[1:]))
            if min(key.heads, key.q_per_seq, key.k_per_seq) < 1:  # distance() takes their log2
                raise ValueError
            return key
        except (ValueError, IndexError):
            raise ValueError(f"{text!r} is not a problem key like 'causal/h128/q8192/k8192'") from None

    def distance(self, other: "ProblemKey") -> float:
        """How far apart two shape classes are, in powers of two (inf across masks)."""
        if self.mask != other.mask:
            return math.inf
        return sum(abs(math.log2(a) - math.log2(b)) for a, b in (
            (self.heads, other.heads), (self.q_per_seq, other.q_per_seq), (self.k_per_seq, other.k_per_seq)))


def problem_key(heads: int, total_q: int, total_k: int, batch: int, causal: bool) -> ProblemKey:
    """The shape class of a call: mask, and head count, mean query and key length per sequence,
    each rounded up to a power of two."""
    batch = max(batch, 1)
    return ProblemKey("causal" if causal else "none", _pow2_ceil(heads), _pow2_ceil(total_q / batch),
                      _pow2_ceil(total_k / batch))


# --- shapes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One dense problem: a packed batch of sequences with one head count and one mask.

    ``q_lens[b]`` / ``k_lens[b]`` are the query / key lengths of sequence b; with ``causal`` the
    mask is bottom-right aligned (MLA.md section 1), so ``k_lens[b] - q_lens[b]`` keys are a
    cached prefix every query sees. (``mlagen.bench.Shape`` has the same fields; every function
    of this family takes either.)
    """

    id: str
    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    heads: int
    causal: bool

    def __post_init__(self):
        if not self.q_lens or len(self.q_lens) != len(self.k_lens):
            raise ValueError(f"shape {self.id}: q_lens and k_lens must list the same sequences, "
                             f"got {len(self.q_lens)} and {len(self.k_lens)}")

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def total_k(self) -> int:
        return sum(self.k_lens)

    @property
    def packed(self) -> bool:
        """Whether the kernel gets cu_seqlens (a batch of one is passed as a plain sequence)."""
        return self.batch > 1


def shape_key(shape) -> ProblemKey:
    return problem_key(shape.heads, sum(shape.q_lens), sum(shape.k_lens), len(shape.q_lens), shape.causal)


_ITEM = re.compile(r"\s*([a-z]+)\s*=\s*(\[[^\]]*\]|[^,\[\]]+)\s*(?:,|$)|\s*([a-z]+)\s*(?:,|$)")
_KEYS = ("b", "q", "k", "h")


def _lengths(text: str, key: str, where: str) -> tuple[int, ...] | int:
    body = text.strip()
    ragged = body.startswith("[")
    items = body[1:-1].split(",") if ragged else [body]
    try:
        values = tuple(int(x) for x in items if x.strip())
    except ValueError:
        raise ValueError(f"{where}: {key}={text}: expected a non-negative integer or a list like [128,4096]") from None
    if not values or any(v < 0 for v in values):
        raise ValueError(f"{where}: {key}={text}: expected a non-negative integer or a non-empty list of them")
    return values if ragged else values[0]


def parse_shape(text: str, id: str | None = None) -> Shape:
    """A shape from its description: comma-separated ``key=value`` items and a bare mask word.

    ``b=<batch>``, ``q=<len>`` or ``q=[l1,l2,...]`` (ragged; the batch is the list's length),
    ``k=<len>`` or a list (default: like q), ``h=<heads>``, and ``causal`` (default) or ``none``.
    Example: ``b=4,q=4096,k=4096,h=16,causal``. Errors are ValueError naming the item.
    """
    where = f"shape {text!r}"
    values: dict[str, str] = {}
    mask = None
    pos, text_s = 0, text.strip()
    while pos < len(text_s):
        m = _ITEM.match(text_s, pos)
        if not m or m.end() == pos:
            raise ValueError(f"{where}: cannot read {text_s[pos:]!r}; expected items like b=4,q=4096,h=16,causal")
        pos = m.end()
        if m.group(3):
            word = m.group(3)
            if word not in MASKS:
                raise ValueError(f"{where}: {word!r} is not a mask ({', '.join(MASKS)}) or key=value")
            if mask is not None:
                raise ValueError(f"{where}: the mask is given twice")
            mask = word
            continue
        key, value = m.group(1), m.group(2)
        if key not in _KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; keys: b, q, k, h")
        if key in values:
            raise ValueError(f"{where}: {key} is given twice")
        values[key] = value
    if "q" not in values or "h" not in values:
        raise ValueError(f"{where}: needs q=<length> and h=<heads>")
    q = _lengths(values["q"], "q", where)
    k = _lengths(values["k"], "k", where) if "k" in values else q
    heads = _lengths(values["h"], "h", where)
    if isinstance(heads, tuple) or heads < 1:
        raise ValueError(f"{where}: h={values['h']}: expected a positive integer")
    batch = None
    if "b" in values:
        batch = _lengths(values["b"], "b", where)
        if isinstance(batch, tuple) or batch < 1:
            raise ValueError(f"{where}: b={values['b']}: expected a positive integer")
    lists = [x for x in (q, k) if isinstance(x, tuple)]
    n = len(lists[0]) if lists else (batch or 1)
    if any(len(x) != n for x in lists) or (batch is not None and batch != n):
        raise ValueError(f"{where}: the batch ({batch if batch is not None else 'b'}) and the q/k lists disagree "
                         f"on the number of sequences")
    q_lens = q if isinstance(q, tuple) else (q,) * n
    k_lens = k if isinstance(k, tuple) else (k,) * n
    return Shape(id or text.strip(), q_lens, k_lens, heads, (mask or "causal") == "causal")


def describe_shape(shape) -> str:
    """The description ``parse_shape`` reads back (lists only where lengths differ)."""
    def lens(xs):
        return str(xs[0]) if len(set(xs)) == 1 else "[" + ",".join(map(str, xs)) + "]"

    parts = [f"b={len(shape.q_lens)}", f"q={lens(shape.q_lens)}"]
    if tuple(shape.k_lens) != tuple(shape.q_lens):
        parts.append(f"k={lens(shape.k_lens)}")
    parts += [f"h={shape.heads}", "causal" if shape.causal else "none"]
    return ",".join(parts)


# --- visible pairs and FLOPs ----------------------------------------------------------------


def sequence_lengths(cu_q, cu_k, total_q: int, total_k: int) -> list[tuple[int, int, int, int]]:
    """(q_start, len_q, k_start, len_k) per sequence, from host-side (CPU or list) offsets."""
    if cu_q is None:
        return [(0, total_q, 0, total_k)]
    cq = [int(x) for x in (cu_q.tolist() if hasattr(cu_q, "tolist") else cu_q)]
    ck = [int(x) for x in (cu_k.tolist() if hasattr(cu_k, "tolist") else cu_k)]
    return [(cq[b], cq[b + 1] - cq[b], ck[b], ck[b + 1] - ck[b]) for b in range(len(cq) - 1)]


def shape_sequences(shape) -> list[tuple[int, int, int, int]]:
    """(q_start, len_q, k_start, len_k) per sequence of a shape."""
    out, qs, ks = [], 0, 0
    for lq, lk in zip(shape.q_lens, shape.k_lens):
        out.append((qs, lq, ks, lk))
        qs, ks = qs + lq, ks + lk
    return out


def visible_pairs(len_q: int, len_k: int, causal: bool) -> int:
    """(query, key) pairs a sequence computes: row i sees min(len_k, max(0, i + len_k - len_q + 1))
    keys when causal, all len_k otherwise."""
    if not causal:
        return len_q * len_k
    offset = len_k - len_q
    first_seeing = min(len_q, max(0, -offset))                        # rows before see nothing
    first_full = max(first_seeing, min(len_q, len_k - offset - 1))    # rows from here see all keys
    ramp = (first_seeing + offset + 1 + first_full + offset) * (first_full - first_seeing) // 2
    return ramp + (len_q - first_full) * len_k


def flops(lengths, heads: int, causal: bool) -> int:
    """BENCHMARKS.md convention: 2 * H * (d_qk + d_v) * visible pairs, summed over sequences."""
    return sum(2 * heads * (D_QK + D_V) * visible_pairs(lq, lk, causal) for _, lq, _, lk in lengths)
