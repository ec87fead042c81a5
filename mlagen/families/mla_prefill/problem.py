"""Shapes and shape classes of dense MLA prefill; FLOPs by the BENCHMARKS.md convention.

A shape (:class:`Shape`) is a packed batch of sequences with one head count and one mask, written
as an id of ``../shared/BENCHMARKS.md`` (:data:`SHAPES`: ``D1`` ... ``D7``) or as a description
(:func:`parse_shape` has the grammar)::

    b=4,q=4096,k=4096,h=16,causal     # 4 sequences of 4096 queries and keys, 16 heads, causal
    q=[300,1200,77],h=128             # ragged: one sequence per length (b = 3), k = q, causal
    q=2048,k=16384,h=128              # 2048 new tokens after a 14336-token cached prefix
    b=2,q=8192,h=16,none              # no mask
    q=8192,h=64,d=192/64/256          # GLM-5's head geometry (d_nope / d_rope / d_v), causal
    q=16384,h=16,window=4095/0        # a sliding window (FlashAttention's window_size; -1 unbounded)
    b=4,q=4096,h=16,chunk=1000        # chunked attention (keys of the query's own chunk, causal)
    q=4096,h=8,softcap=30,sink        # score traits: softcap c, a per-head attention sink

Pure Python (no torch): the tuner (through the family protocol), the benchmark, dispatch and the
shape recorder all use it.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, replace
from typing import Iterable

from ...errors import ShapeError
from ..kit import MAX_HEADS, decimal

D_NOPE, D_ROPE, D_V = 128, 64, 128   # the default geometry (DeepSeek-V3 / Kimi-K2)
D_QK = D_NOPE + D_ROPE
#: Masks (MLA.md section 1b), bottom-right aligned; window and chunked take run-time sizes.
MASKS = ("causal", "none", "window", "chunked")
#: Score traits: plain, softcap (s <- c tanh(s / c)), a per-head sink, or both.
SCORES = ("plain", "softcap", "sink", "softcap_sink")
#: Head geometries by name, n<d_nope>r<d_rope>v<d_v> (the sm90 spec's ``geometry`` values).
GEOMETRIES = {"n128r64v128": (128, 64, 128), "n192r64v256": (192, 64, 256), "n128r0v128": (128, 0, 128)}
DEFAULT_GEOMETRY = "n128r64v128"
_GEOMETRY_NAME = re.compile(r"^n(\d+)r(\d+)v(\d+)$")


def geometry_name(d_nope: int, d_rope: int, d_v: int) -> str:
    return f"n{d_nope}r{d_rope}v{d_v}"


def geometry_dims(name: str) -> tuple[int, int, int]:
    """(d_nope, d_rope, d_v) of a geometry name such as ``n192r64v256``; ValueError if it is none."""
    m = _GEOMETRY_NAME.match(name) if isinstance(name, str) else None
    if not m:
        raise ValueError(f"{name!r} is not a head geometry like 'n192r64v256' (n<d_nope>r<d_rope>v<d_v>)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def score_name(softcap: bool, sink: bool) -> str:
    return {(False, False): "plain", (True, False): "softcap", (False, True): "sink", (True, True): "softcap_sink"}[
        (bool(softcap), bool(sink))]


def normalize_mask(causal: bool, window: tuple[int, int] = (-1, -1), chunk: int = 0,
                   longest_k: int | None = None) -> tuple[str, tuple[int, int], int]:
    """(mask, window, chunk) in canonical form, FlashAttention's rules: causal with a window is the
    window (left, 0); (-1, 0) is causal, (-1, -1) none; a side at or past ``longest_k`` (every key
    a query can see) is unbounded; a chunk at or past it is causal."""
    left, right = window
    if longest_k is not None:
        left = -1 if left >= longest_k else left
        right = -1 if right >= longest_k else right
        if chunk and chunk >= longest_k:
            return "causal", (-1, -1), 0
    if chunk:
        return "chunked", (-1, -1), chunk
    if causal:
        right = 0
    if left < 0 and right < 0:
        return "none", (-1, -1), 0
    if left < 0 and right == 0:
        return "causal", (-1, -1), 0
    return "window", (left, right), 0


def _pow2_ceil(x: float) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


@dataclass(frozen=True)
class ProblemKey:
    """The shape class a tuning record applies to (host-known values only, bucketed)."""

    mask: str
    heads: int       # power of two at or above the head count
    q_per_seq: int   # power of two at or above the mean query length
    k_per_seq: int
    geometry: str = DEFAULT_GEOMETRY
    score: str = "plain"

    def __str__(self) -> str:
        """``causal/h128/q8192/k8192``; other score traits follow the mask (``causal+sink/...``), another
        geometry ends it (``.../k8192/n192r64v256``), so keys of the default classes read as before."""
        mask = self.mask if self.score == "plain" else f"{self.mask}+{self.score}"
        tail = "" if self.geometry == DEFAULT_GEOMETRY else f"/{self.geometry}"
        return f"{mask}/h{self.heads}/q{self.q_per_seq}/k{self.k_per_seq}{tail}"

    @classmethod
    def parse(cls, text: str) -> "ProblemKey":
        try:
            parts = text.split("/")
            if len(parts) not in (4, 5):
                raise ValueError
            mask, h, q, k = parts[:4]
            mask, _, score = mask.partition("+")
            score = score or "plain"
            geometry = parts[4] if len(parts) == 5 else DEFAULT_GEOMETRY
            if (mask not in MASKS or score not in SCORES or geometry not in GEOMETRIES or h[0] != "h" or q[0] != "q"
                    or k[0] != "k"):
                raise ValueError
            key = cls(mask, int(h[1:]), int(q[1:]), int(k[1:]), geometry, score)
            if min(key.heads, key.q_per_seq, key.k_per_seq) < 1:  # distance() takes their log2
                raise ValueError
            return key
        except (ValueError, IndexError):
            raise ValueError(f"{text!r} is not a problem key like 'causal/h128/q8192/k8192' (or "
                             "'window+sink/h16/q16384/k16384/n192r64v256')") from None

    def specialization(self) -> dict:
        """The spec axes this class fixes: the mask, and the geometry and score traits where they are
        not the default (specs without those axes implement only the defaults)."""
        return specialization_of(self.mask, self.geometry, self.score)

    def distance(self, other: "ProblemKey") -> float:
        """How far apart two shape classes are, in powers of two (inf across masks, geometries and
        score traits)."""
        if (self.mask, self.geometry, self.score) != (other.mask, other.geometry, other.score):
            return math.inf
        return sum(abs(math.log2(a) - math.log2(b)) for a, b in (
            (self.heads, other.heads), (self.q_per_seq, other.q_per_seq), (self.k_per_seq, other.k_per_seq)))


def specialization_of(mask: str, geometry: str = DEFAULT_GEOMETRY, score: str = "plain") -> dict:
    """The spec axes a class or a call's traits fix: the mask, and the geometry and score traits where
    they are not the default (specs without those axes implement only the defaults)."""
    out = {"mask": mask}
    if geometry != DEFAULT_GEOMETRY:
        out["geometry"] = geometry
    if score != "plain":
        out["score"] = score
    return out


def problem_key(heads: int, total_q: int, total_k: int, batch: int, causal: bool, mask: str | None = None,
                geometry: str = DEFAULT_GEOMETRY, score: str = "plain") -> ProblemKey:
    """The shape class of a call: mask (``mask``, else causal or none), head count, mean query and
    key length per sequence (each rounded up to a power of two), geometry and score traits."""
    batch = max(batch, 1)
    return ProblemKey(mask or ("causal" if causal else "none"), _pow2_ceil(heads), _pow2_ceil(total_q / batch),
                      _pow2_ceil(total_k / batch), geometry, score)


# --- shapes ---------------------------------------------------------------------------------

#: The description grammar, for error messages.
GRAMMAR = ("b=<batch>, q=<len> or [l1,...], k=<len> or list, h=<1 to 128>, causal or none; also "
           "d=<nope>/<rope>/<v>, window=<l>/<r>, chunk=<C>, softcap=<c>, sink")


@dataclass(frozen=True)
class Shape:
    """One dense problem: a packed batch of sequences with one head count and one mask.

    ``q_lens[b]`` / ``k_lens[b]`` are the query / key lengths of sequence b; with ``causal`` the
    mask is bottom-right aligned (MLA.md section 1), so ``k_lens[b] - q_lens[b]`` keys are a
    cached prefix every query sees. ``id`` names it in reports: a BENCHMARKS.md id or the
    canonical description (:meth:`describe_text`).

    MLA.md section 1b: ``geometry`` names (d_nope, d_rope, d_v) (:data:`GEOMETRIES`); ``window``
    is FlashAttention's ``window_size`` (left, right), -1 unbounded, with the same bottom-right
    alignment: query i at p = i + Lk - Lq sees keys p - left <= j <= p + right. Causal with a
    window is the window (left, 0); (-1, 0) is causal and (-1, -1) no window.
    """

    id: str
    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    heads: int
    causal: bool
    geometry: str = DEFAULT_GEOMETRY
    window: tuple[int, int] = (-1, -1)   # FlashAttention's window_size, canonical (normalize_mask)
    chunk: int = 0                       # chunked attention's chunk size (0: none)
    softcap: float = 0.0                 # 0: none
    sink: bool = False                   # a per-head attention sink

    def __post_init__(self):
        if not self.q_lens or len(self.q_lens) != len(self.k_lens):
            raise ShapeError(f"shape {self.id}: q_lens and k_lens must list the same sequences, "
                             f"got {len(self.q_lens)} and {len(self.k_lens)}")
        if self.geometry not in GEOMETRIES:
            raise ShapeError(f"shape {self.id}: geometry {self.geometry!r}; allowed: {', '.join(GEOMETRIES)}")
        mask, window, chunk = normalize_mask(self.causal, tuple(self.window), self.chunk)
        object.__setattr__(self, "causal", mask == "causal")
        object.__setattr__(self, "window", window)
        object.__setattr__(self, "chunk", chunk)

    @property
    def mask(self) -> str:
        """causal, none, window or chunked."""
        return "chunked" if self.chunk else "window" if self.window != (-1, -1) else (
            "causal" if self.causal else "none")

    @property
    def score(self) -> str:
        return score_name(self.softcap > 0, self.sink)

    @property
    def dims(self) -> tuple[int, int, int]:
        """(d_nope, d_rope, d_v)."""
        return GEOMETRIES[self.geometry]

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

    @property
    def uniform(self) -> bool:
        """Every sequence has the same lengths, so SDPA can take the batch in one [B, H, L, D] call."""
        return len(set(self.q_lens)) == 1 and len(set(self.k_lens)) == 1

    def cu_seqlens(self) -> tuple[list[int], list[int]]:
        """Offsets of the packed batch: ([0, q_0, q_0 + q_1, ...], [0, k_0, ...])."""
        cu_q, cu_k = [0], [0]
        for lq, lk in zip(self.q_lens, self.k_lens):
            cu_q.append(cu_q[-1] + lq)
            cu_k.append(cu_k[-1] + lk)
        return cu_q, cu_k

    def sequence_lengths(self) -> list[tuple[int, int, int, int]]:
        """(q_start, len_q, k_start, len_k) per sequence."""
        return shape_sequences(self)

    def flops(self) -> int:
        """FLOPs of one call by the BENCHMARKS.md convention (visible pairs only)."""
        return shape_flops(self)

    @property
    def description(self) -> str:
        """Human-readable: ``4 × 4096, H 16, causal``."""
        if self.uniform and self.q_lens[0] == self.k_lens[0]:
            lengths = f"{self.batch} × {self.q_lens[0]}"
        elif self.uniform:
            lq, lk = self.q_lens[0], self.k_lens[0]
            lengths = f"{self.batch} × {lq} new after {lk - lq} cached (Lk {lk})"
        elif len(set(self.q_lens)) == 1:
            prefixes = [lk - lq for lq, lk in zip(self.q_lens, self.k_lens)]
            lengths = f"{self.batch} × {self.q_lens[0]} new after {min(prefixes)}–{max(prefixes)} cached"
        else:
            lengths = (f"{self.batch} ragged, {min(self.q_lens)}–{max(self.q_lens)} "
                       f"(mean {self.total_q // self.batch})")
        mask = {"causal": "causal", "none": "no mask", "window": f"window {self.window[0]}/{self.window[1]}",
                "chunked": f"chunks of {self.chunk}"}[self.mask]
        traits = "".join((f", d {'/'.join(map(str, self.dims))}" if self.geometry != DEFAULT_GEOMETRY else "",
                          f", softcap {self.softcap:g}" if self.softcap else "", ", sink" if self.sink else ""))
        return f"{lengths}, H {self.heads}, {mask}{traits}"

    def describe_text(self) -> str:
        """The canonical description, which :func:`parse_shape` reads back into this shape."""
        return describe_shape(self)


def shape_key(shape) -> ProblemKey:
    return problem_key(shape.heads, sum(shape.q_lens), sum(shape.k_lens), len(shape.q_lens), shape.causal,
                       shape.mask, shape.geometry, shape.score)


def ragged_lengths(count: int, low: int, high: int, seed: int) -> tuple[int, ...]:
    """``count`` lengths drawn uniformly from [low, high] (inclusive) by ``random.Random(seed)``.

    Python's ``Random.randint`` with an integer seed gives the same sequence on every platform
    and Python version since 3.2, so the D4 lengths are stable.
    """
    rng = random.Random(seed)
    return tuple(rng.randint(low, high) for _ in range(count))


_D4_LENGTHS = ragged_lengths(16, 128, 4096, seed=0)
_D10_PREFIXES = ragged_lengths(16, 1024, 16384, seed=0)

#: The dense shapes of BENCHMARKS.md. D4 draws its 16 lengths (Lq = Lk per sequence) with
#: ``random.Random(0).randint(128, 4096)``, one call per sequence in order; D5 is a chunk of
#: 2048 new tokens after a 14336-token cached prefix; D7 is a TP8 slice (16 heads). D8 and D9
#: are GLM-5's geometry (192 / 64 / 256) at 64 heads and at TP8; D10 is chunked prefill at TP8,
#: 16 chunks of 1024 new tokens after cached prefixes drawn as D4's lengths are
#: (``random.Random(0).randint(1024, 16384)``); D11 a sliding window of 4096 keys (left 4095,
#: right 0) over 16384 tokens.
SHAPES: dict[str, Shape] = {s.id: s for s in (
    Shape("D1", (8192,), (8192,), 128, True),
    Shape("D2", (4096,) * 4, (4096,) * 4, 16, True),
    Shape("D3", (8192,) * 2, (8192,) * 2, 16, False),
    Shape("D4", _D4_LENGTHS, _D4_LENGTHS, 128, True),
    Shape("D5", (2048,), (14336 + 2048,), 128, True),
    Shape("D6", (512,) * 32, (512,) * 32, 128, True),
    Shape("D7", (2048,) * 8, (2048,) * 8, 16, True),
    Shape("D8", (8192,), (8192,), 64, True, geometry="n192r64v256"),
    Shape("D9", (2048,) * 8, (2048,) * 8, 8, True, geometry="n192r64v256"),
    Shape("D10", (1024,) * 16, tuple(p + 1024 for p in _D10_PREFIXES), 16, True),
    Shape("D11", (16384,), (16384,), 16, False, window=(4095, 0)),
)}


_ITEM = re.compile(r"\s*([a-z]+)\s*=\s*(\[[^\]]*\]|[^,\[\]]+)\s*(?:,|$)|\s*([a-z]+)\s*(?:,|$)")
_KEYS = ("b", "q", "k", "h", "d", "window", "chunk", "softcap")
_WORDS = ("causal", "none", "sink")


def _lengths(text: str, key: str, where: str) -> tuple[int, ...] | int:
    body = text.strip()
    ragged = body.startswith("[")
    items = body[1:-1].split(",") if ragged else [body]
    if ragged and not body[1:-1].strip():
        raise ValueError(f"{where}: {key}={text}: an empty list; expected lengths like [128,4096]")
    values = []
    for i, item in enumerate(items):
        if not item.strip():
            raise ValueError(f"{where}: {key}={text}: item {i} is empty; expected lengths like [128,4096]")
        value = decimal(item)
        if value is None:
            raise ValueError(f"{where}: {key}={text}: expected a non-negative integer or a list like [128,4096] "
                             f"({item.strip()!r} is not a decimal integer)")
        values.append(value)
    return tuple(values) if ragged else values[0]


def parse_shape(text: str, id: str | None = None) -> Shape:
    """One shape from an id of BENCHMARKS.md (``D1`` ... ``D7``, any case) or a description:
    comma-separated ``key=value`` items and a bare mask word.

    ``b=<batch>`` (default 1), ``q=<len>`` or ``q=[l1,l2,...]`` (ragged; the batch is the list's
    length), ``k=<len>`` or a list (default: like q; ``k > q`` is a cached prefix), ``h=<heads>``
    (required, 1 to 128), and ``causal`` (default) or ``none``; numbers in plain decimal digits.
    Example: ``b=4,q=4096,k=4096,h=16,causal``.
    Traits (MLA.md section 1b): ``d=<d_nope>/<d_rope>/<d_v>`` (a geometry of GEOMETRIES; default
    128/64/128), ``window=<left>/<right>`` (FlashAttention's window_size, -1 unbounded; alone it
    needs no mask word, with ``causal`` its right side is 0), ``chunk=<size>`` (chunked attention),
    ``softcap=<c>`` and the bare word ``sink``.
    ``id`` names the shape (default: the id given, or the canonical description, which
    :func:`describe_shape` writes and ``MLAGEN_RECORD_SHAPES`` files carry).

    Raises:
        ShapeError (a ValueError): naming the bad item and what is allowed.
    """
    if not isinstance(text, str):
        raise ShapeError(f"shape: expected a string, got {type(text).__name__}")
    raw = text.strip()
    if not raw:
        raise ShapeError(f"empty shape; give an id ({', '.join(SHAPES)}) or a description ({GRAMMAR})")
    if raw.upper() in SHAPES:
        named = SHAPES[raw.upper()]
        return named if id is None else replace(named, id=id)
    if "=" not in raw and raw.lower() not in _WORDS:
        raise ShapeError(f"unknown shape id {raw!r}; choose from {', '.join(SHAPES)}, or describe one like "
                         f"q=4096,h=16,causal (keys {' '.join(_KEYS)}; also sink)")
    try:
        q_lens, k_lens, heads, causal, traits = _parse_description(raw)
    except ValueError as exc:
        raise ShapeError(f"{exc}; allowed: {GRAMMAR}") from None
    if not sum(q_lens) or not sum(k_lens):
        raise ShapeError(f"shape {raw!r}: no {'query' if not sum(q_lens) else 'key'} rows; "
                         "lengths must add up to at least 1")
    shape = Shape("", q_lens, k_lens, heads, causal, **traits)
    return replace(shape, id=id or describe_shape(shape))


def _traits(values: dict, where: str) -> dict:
    """The Shape fields of the trait items (d, window, chunk, softcap) of a description."""
    out = {}
    if "d" in values:
        try:
            dims = tuple(int(x) for x in values["d"].split("/"))
            name = geometry_name(*dims)
        except (ValueError, TypeError):
            name = None
        if name not in GEOMETRIES:
            allowed = ", ".join("/".join(map(str, g)) for g in GEOMETRIES.values())
            raise ValueError(f"{where}: d={values['d']}: expected d_nope/d_rope/d_v, one of {allowed}")
        out["geometry"] = name
    if "window" in values:
        try:
            left, right = (int(x) for x in values["window"].split("/"))
        except ValueError:
            raise ValueError(f"{where}: window={values['window']}: expected <left>/<right>, integers >= -1 "
                             "(-1 unbounded), like 4095/0") from None
        if left < -1 or right < -1:
            raise ValueError(f"{where}: window={values['window']}: each side is >= 0, or -1 for unbounded")
        out["window"] = (left, right)
    if "chunk" in values:
        chunk = _lengths(values["chunk"], "chunk", where)
        if isinstance(chunk, tuple) or chunk < 1:
            raise ValueError(f"{where}: chunk={values['chunk']}: expected a positive integer")
        if "window" in values:
            raise ValueError(f"{where}: chunk and window exclude each other")
        out["chunk"] = chunk
    if "softcap" in values:
        try:
            cap = float(values["softcap"])
        except ValueError:
            cap = -1.0
        if not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"{where}: softcap={values['softcap']}: expected a positive number")
        out["softcap"] = cap
    return out


def _parse_description(text: str) -> tuple[tuple[int, ...], tuple[int, ...], int, bool, dict]:
    """(q_lens, k_lens, heads, causal, traits) of a description; ValueError naming the bad item."""
    where = f"shape {text!r}"
    values: dict[str, str] = {}
    mask = None
    sink = False
    pos, text_s = 0, text.strip()
    while pos < len(text_s):
        m = _ITEM.match(text_s, pos)
        if not m or m.end() == pos:
            raise ValueError(f"{where}: cannot read {text_s[pos:]!r}; expected items like b=4,q=4096,h=16,causal")
        pos = m.end()
        if m.group(3):
            word = m.group(3)
            if word == "sink":
                if sink:
                    raise ValueError(f"{where}: sink is given twice")
                sink = True
                continue
            if word not in ("causal", "none"):
                raise ValueError(f"{where}: {word!r} is not a mask (causal, none), 'sink' or key=value")
            if mask is not None:
                raise ValueError(f"{where}: the mask is given twice")
            mask = word
            continue
        key, value = m.group(1), m.group(2)
        if key not in _KEYS:
            raise ValueError(f"{where}: unknown key {key!r}; keys: {', '.join(_KEYS)}")
        if key in values:
            raise ValueError(f"{where}: {key} is given twice")
        values[key] = value
    if "q" not in values or "h" not in values:
        raise ValueError(f"{where}: needs q=<length> and h=<heads>")
    q = _lengths(values["q"], "q", where)
    k = _lengths(values["k"], "k", where) if "k" in values else q
    heads = decimal(values["h"])
    if heads is None or not 1 <= heads <= MAX_HEADS:
        raise ValueError(f"{where}: h={values['h'].strip()}: expected a positive integer, a head count from 1 "
                         f"to {MAX_HEADS}")
    batch = None
    if "b" in values:
        batch = decimal(values["b"])
        if batch is None or batch < 1:
            raise ValueError(f"{where}: b={values['b'].strip()}: expected a positive decimal integer")
    lists = [x for x in (q, k) if isinstance(x, tuple)]
    n = len(lists[0]) if lists else (batch or 1)
    if any(len(x) != n for x in lists) or (batch is not None and batch != n):
        raise ValueError(f"{where}: the batch ({batch if batch is not None else 'b'}) and the q/k lists disagree "
                         f"on the number of sequences")
    q_lens = q if isinstance(q, tuple) else (q,) * n
    k_lens = k if isinstance(k, tuple) else (k,) * n
    traits = _traits(values, where)
    if sink:
        traits["sink"] = True
    # A window or a chunk is a mask by itself; the default mask word is then none.
    default_mask = "none" if ("window" in traits or "chunk" in traits) else "causal"
    return q_lens, k_lens, heads, (mask or default_mask) == "causal", traits


def describe_shape(shape) -> str:
    """The description ``parse_shape`` reads back (lists only where lengths differ)."""
    def lens(xs):
        return str(xs[0]) if len(set(xs)) == 1 else "[" + ",".join(map(str, xs)) + "]"

    parts = [f"b={len(shape.q_lens)}", f"q={lens(shape.q_lens)}"]
    if tuple(shape.k_lens) != tuple(shape.q_lens):
        parts.append(f"k={lens(shape.k_lens)}")
    parts.append(f"h={shape.heads}")
    geometry = getattr(shape, "geometry", DEFAULT_GEOMETRY)
    if geometry != DEFAULT_GEOMETRY:
        parts.append("d=" + "/".join(map(str, GEOMETRIES[geometry])))
    mask = getattr(shape, "mask", "causal" if shape.causal else "none")
    if mask == "window":
        parts.append(f"window={shape.window[0]}/{shape.window[1]}")
    elif mask == "chunked":
        parts.append(f"chunk={shape.chunk}")
    else:
        parts.append(mask)
    if getattr(shape, "softcap", 0):
        parts.append(f"softcap={shape.softcap:g}")
    if getattr(shape, "sink", False):
        parts.append("sink")
    return ",".join(parts)


def parse_shapes(text: str | Iterable[str]) -> list[Shape]:
    """Shapes from a comma-separated list of ids (``"D1,D3"``; ``"all"`` for every id), or from an
    iterable whose items are ids or descriptions; in order, each once (``mlagen bench --shapes``).

    Raises:
        ShapeError (a ValueError): naming each unknown id and listing the known ones.
    """
    if isinstance(text, str):
        ids = [i.strip() for i in text.split(",") if i.strip()]
        if any("=" in i for i in ids) or any(i.lower() in _WORDS for i in ids):
            return [parse_shape(text)]  # one description, not a list of ids
    else:
        ids = [i.strip() for i in text if i.strip()]
    if not ids:
        raise ShapeError(f"no shape given; choose from {', '.join(SHAPES)} or 'all'")
    if any(i.lower() == "all" for i in ids):
        return list(SHAPES.values())
    unknown = [i for i in ids if i.upper() not in SHAPES and "=" not in i]
    if unknown:
        raise ShapeError(f"unknown shape id {', '.join(map(repr, unknown))}; choose from {', '.join(SHAPES)} "
                         f"or 'all', or describe one: {GRAMMAR}")
    out = [parse_shape(i) for i in ids]
    return list({s.id: s for s in out}.values())


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


def band_pairs(len_q: int, len_k: int, mask: str, window: tuple[int, int] = (-1, -1), chunk: int = 0) -> int:
    """Visible (query, key) pairs of one sequence under any mask (MLA.md section 1b): row i at
    p = i + len_k - len_q sees keys [lo(p), hi(p)) of [0, len_k) (mlagen/common/mask.cuh)."""
    if mask in ("causal", "none"):
        return visible_pairs(len_q, len_k, mask == "causal")
    total = 0
    for i in range(len_q):
        p = i + len_k - len_q
        if mask == "window":
            left, right = window
            lo = 0 if left < 0 else max(0, p - left)
            hi = len_k if right < 0 else min(len_k, p + right + 1)
        else:
            lo, hi = (max(p, 0) // chunk * chunk, min(len_k, p + 1))
        total += max(0, hi - lo)
    return total


def flops(lengths, heads: int, causal: bool, mask: str | None = None, window: tuple[int, int] = (-1, -1),
          chunk: int = 0, geometry: str = DEFAULT_GEOMETRY) -> int:
    """BENCHMARKS.md convention: 2 * H * (d_qk + d_v) * visible pairs, summed over sequences."""
    d_nope, d_rope, d_v = GEOMETRIES[geometry]
    mask = mask or ("causal" if causal else "none")
    return sum(2 * heads * (d_nope + d_rope + d_v) * band_pairs(lq, lk, mask, window, chunk)
               for _, lq, _, lk in lengths)


def shape_flops(shape) -> int:
    """:func:`flops` of a shape, with its mask and geometry."""
    return flops(shape_sequences(shape), shape.heads, shape.causal, shape.mask, shape.window, shape.chunk,
                 shape.geometry)
