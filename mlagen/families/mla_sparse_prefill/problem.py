"""The problem of sparse MLA prefill (MLA.md section 2): its constants, the tuning shape class
(:class:`ProblemKey`), the benchmark shapes S1-S6 of BENCHMARKS.md and their description grammar,
and the FLOP convention."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ... import operands
from ..kit import MAX_HEADS, decimal

NAME = "mla_sparse_prefill"
D_V = 512
D_QK_VALUES = (576, 512)
BLOCK_H = 64      # heads per CTA of the sm90 kernel (fewer are zero-padded)
MAX_ROWS = 2**31 - 1


def _pow2_ceil(x: int) -> int:
    """The least power of two >= x (1 for x <= 1); integers only (a call's sizes), exact for any size."""
    return 1 if x <= 1 else 1 << (x - 1).bit_length()



#: The pool-size term of :meth:`ProblemKey.distance`: per log2 step between two keys' pool
#: buckets (a quarter of a head or topk step: the pool size moves the winner less than those), and
#: the fixed term for a key that names no pool size (written before 2026-12-02: tuned on some pool,
#: so it serves every size, after a key of the call's own bucket or its neighbours).
POOL_STEP = 0.25
POOL_UNKNOWN = 0.5


@dataclass(frozen=True)
class ProblemKey:
    """Shape class of a call for tuning records: d_qk, heads and topk rounded up to powers of
    two, the KV rows the indices address as a power-of-two bucket (``pool``: whether the gathered
    rows stay in L2 decides which schedule wins; 0 for a key written before the pool was part
    of it), the KV layout (a flat table or a pool of strided pages: compiled separately), the KV
    format (``operands.NAMES``; written only when it is not bf16, so bf16 keys read as before)
    (``d576/h128/k2048/s8192/paged/fp8_v32``; the old form ``d576/h128/k2048/flat`` parses too)."""

    d_qk: int
    heads: int
    topk: int
    layout: str = "flat"
    kv_format: str = "bf16"
    pool: int = 0

    def __str__(self) -> str:
        fmt = "" if self.kv_format == "bf16" else f"/{self.kv_format}"
        pool = f"/s{self.pool}" if self.pool else ""
        return f"d{self.d_qk}/h{self.heads}/k{self.topk}{pool}/{self.layout}{fmt}"

    @classmethod
    def parse(cls, text: str) -> "ProblemKey":
        try:
            parts = text.split("/")
            pool = 0
            if len(parts) > 3 and parts[3][:1] == "s":
                pool = int(parts.pop(3)[1:])
                if pool < 1 or pool & (pool - 1) or str(pool) != text.split("/")[3][1:]:
                    raise ValueError   # a power of two in plain digits: one text per key
            if len(parts) == 4:
                parts.append("bf16")
            elif len(parts) == 5 and parts[4] == "bf16":
                raise ValueError   # bf16 is never written: one text per key
            d, h, k, layout, fmt = parts
            if d[0] != "d" or h[0] != "h" or k[0] != "k" or layout not in ("flat", "paged") \
                    or fmt not in operands.NAMES:
                raise ValueError
            key = cls(int(d[1:]), int(h[1:]), int(k[1:]), layout, fmt, pool)
            if key.d_qk not in D_QK_VALUES or min(key.heads, key.topk) < 1:
                raise ValueError
            return key
        except (ValueError, IndexError):
            raise ValueError(f"{text!r} is not a sparse problem key d<d_qk>/h<heads>/k<topk>[/s<pool rows, a power "
                             f"of two>]/<flat|paged>[/<kv format>] like 'd576/h128/k2048/s8192/flat' or "
                             f"'d576/h128/k2048/s65536/paged/fp8_v32'") from None

    def distance(self, other: "ProblemKey") -> float:
        """inf across d_qk, layout or format; else the log2 steps of heads and topk, plus
        :data:`POOL_STEP` per log2 step of pool, or :data:`POOL_UNKNOWN` when one key names no pool."""
        if self.d_qk != other.d_qk or self.layout != other.layout or self.kv_format != other.kv_format:
            return math.inf
        if not self.pool or not other.pool:
            pool = 0.0 if self.pool == other.pool else POOL_UNKNOWN
        else:
            pool = POOL_STEP * abs(math.log2(self.pool) - math.log2(other.pool))
        return abs(math.log2(self.heads) - math.log2(other.heads)) + abs(math.log2(self.topk) - math.log2(other.topk)) \
            + pool

    def covers(self, other: "ProblemKey") -> bool:
        """Whether a record of this class is one of ``other``'s: the same key, or this key names no
        pool and ``other`` is the same but for its pool."""
        return self == other or not self.pool and self == replace(other, pool=0)


def is_paged(call) -> bool:
    """Whether a Call's or Shape's cache is read as a pool of strided pages: a page size, or a
    format whose scales sit after each page's rows (fp8_v4: always a pool of pages)."""
    return getattr(call, "page_size", 0) > 0 or bool(operands.get(getattr(call, "kv_format", "bf16")).page_scales)


PAGE = 64   # tokens per page of a benchmark shape's pools of pages (a quantized cache, V4's raw pool)


def pool_rows(call) -> int:
    """The KV rows a Call's or Shape's indices address: a flat table's rows, a paged pool's pages
    x page size; a two-pool call's both pools together (the gather of one softmax reads both,
    so both compete for L2). A Shape's quantized cache and V4 raw pool are pages of :data:`PAGE`
    tokens (as its inputs are made). A Call holds its rows as ints (``num_kv``, from the tensors'
    shapes at argument checking): nothing is read from the device."""
    num_kv = getattr(call, "num_kv", None)
    if num_kv is not None:
        extra = getattr(call, "extra", None)
        return num_kv if extra is None else num_kv + extra.num_kv
    rows = -(-call.s_kv // PAGE) * PAGE if operands.get(call.kv_format).quantized else call.s_kv
    return rows + (-(-call.raw_kv // PAGE) * PAGE if getattr(call, "window", 0) else 0)


def problem_key(call) -> ProblemKey:
    """The shape class of a Call or a Shape; topk counts both pools' positions of a two-pool call,
    pool both pools' rows (:func:`pool_rows`)."""
    paged = is_paged(call)
    keys = getattr(call, "keys", call.topk)
    return ProblemKey(call.d_qk, _pow2_ceil(call.heads), _pow2_ceil(max(keys, 1)), "paged" if paged else "flat",
                      getattr(call, "kv_format", "bf16"), _pow2_ceil(pool_rows(call)))


@dataclass(frozen=True)
class Shape:
    """A benchmark / tuning problem: Sq query tokens, H heads, topk indices per token drawn
    without repetition from s_kv rows (BENCHMARKS.md), d_qk, whether the sink is on, the KV
    cache format (``operands.NAMES``; a quantized cache is a pool of 64-token pages).
    Text form: ``sq=4096,h=128,topk=2048,skv=8192[,d=576][,sink=1][,kv=fp8_v32]``.

    A DeepSeek-V4 shape (MLA.md 2b, V1-V5 of BENCHMARKS.md) has ``window`` > 0: the queries are
    the last Sq positions of one sequence of ``raw_kv`` tokens (a raw pool of 64-token pages),
    each attends to the ``window`` raw positions up to its own and, in a second pool of s_kv
    compressed entries (s_kv 0: none, a sliding layer), to topk entries chosen among those
    visible to it (``hca``: every visible entry, topk the pool's size, the rest -1). Text form:
    ``sq=4096,h=64,topk=512,skv=32768,d=512,window=128,raw=131072[,hca=1]``."""

    id: str
    sq: int
    heads: int
    topk: int
    s_kv: int
    d_qk: int = 576
    sink: bool = True
    kv_format: str = "bf16"
    window: int = 0
    raw_kv: int = 0
    hca: bool = False

    @property
    def keys(self) -> int:
        """Key positions per query (both pools; invalid entries counted)."""
        return self.topk + self.window


_SHAPE_KEYS = {"sq": "sq", "h": "heads", "topk": "topk", "skv": "s_kv", "d": "d_qk", "sink": "sink",
               "kv": "kv_format", "window": "window", "raw": "raw_kv", "hca": "hca"}


def _v4(id: str, heads: int, topk: int, s_kv: int, hca: bool = False) -> Shape:
    return Shape(id, 4096, heads, topk, s_kv, 512, True, "bf16", 128, 131072, hca)


#: The sparse shapes of BENCHMARKS.md: S1-S6 (d_qk 576, sink on), DeepSeek-V4's V1-V5 (window
#: 128 over a 131072-token raw pool + compressed entries), and FlashMLA's own MODEL1
#: performance cases (its tests/test_flash_mla_sparse_prefill.py: d_qk 512, Sq 4096, sink on) as
#: M1-M8: h 64 / topk 512 and h 128 / topk 1024 over s_kv 8192, 32768, 49152, 65536.
SHAPES: dict[str, Shape] = {s.id: s for s in (
    Shape("S1", 4096, 128, 2048, 8192),
    Shape("S2", 4096, 128, 2048, 32768),
    Shape("S3", 4096, 128, 2048, 131072),
    Shape("S4", 4096, 64, 2048, 32768),
    Shape("S5", 4096, 16, 2048, 32768),
    Shape("S6", 4096, 128, 1024, 65536),
    _v4("V1", 64, 512, 32768),
    _v4("V2", 128, 1024, 32768),
    _v4("V3", 64, 1024, 1024, hca=True),
    _v4("V4", 8, 512, 32768),
    _v4("V5", 64, 0, 0),
    *(Shape(f"M{i + 1}", 4096, h, k, s, 512) for i, (h, k, s) in enumerate(
        (h, k, s) for h, k in ((64, 512), (128, 1024)) for s in (8192, 32768, 49152, 65536))),
)}


def parse_shape(text: str, id: str | None = None) -> Shape:
    """A shape from an id of :data:`SHAPES` (any case) or
    ``sq=..,h=..,topk=..,skv=..[,d=..][,sink=..][,kv=..]`` (each key once, numbers in plain decimal
    digits, h from 1 to 128, sink 0 or 1); ValueError naming the bad item."""
    if text.strip().upper() in SHAPES:
        named = SHAPES[text.strip().upper()]
        return named if id is None else replace(named, id=id)
    values: dict = {}
    for item in text.replace(" ", "").split(","):
        if "=" not in item:
            raise ValueError(f"{text!r}: not a shape id ({', '.join(SHAPES)}) nor name=value items like "
                             "sq=4096,h=128,topk=2048,skv=8192[,d=576][,sink=1]")
        k, v = item.split("=", 1)
        if k not in _SHAPE_KEYS:
            raise ValueError(f"{text!r}: unknown item {k!r}; known: {', '.join(_SHAPE_KEYS)}")
        if _SHAPE_KEYS[k] in values:
            raise ValueError(f"{text!r}: {k} is given twice; give each of {', '.join(_SHAPE_KEYS)} once")
        if k == "kv":
            if v not in operands.NAMES:
                raise ValueError(f"{text!r}: kv must be one of {list(operands.NAMES)}, got {v!r}")
            values["kv_format"] = v
            continue
        number = decimal(v)
        if number is None:
            raise ValueError(f"{text!r}: {k} must be a decimal integer, got {v!r}")
        if k == "sink" and number not in (0, 1):
            raise ValueError(f"{text!r}: sink must be 0 (off) or 1 (on), got {v!r}")
        if k == "h" and not 1 <= number <= MAX_HEADS:
            raise ValueError(f"{text!r}: h must be a head count from 1 to {MAX_HEADS}, got {v}")
        values[_SHAPE_KEYS[k]] = number
    optional = ("d", "sink", "kv", "window", "raw", "hca")
    missing = [k for k, f in _SHAPE_KEYS.items() if f not in values and k not in optional]
    if missing:
        raise ValueError(f"{text!r}: missing {', '.join(missing)}")
    values["sink"] = bool(values.get("sink", 1))
    values["hca"] = bool(values.get("hca", 0))
    shape = Shape(id or text, **values)
    if shape.window:
        # A V4 shape: the window over raw_kv tokens, topk of s_kv compressed entries (0 and 0: none).
        if shape.d_qk not in D_QK_VALUES or min(shape.sq, shape.heads, shape.window) < 1 or min(shape.topk,
                                                                                                  shape.s_kv) < 0 \
                or shape.raw_kv < shape.sq or shape.topk > shape.s_kv or (shape.topk == 0) != (shape.s_kv == 0) \
                or shape.kv_format != "bf16" or (shape.hca and shape.topk != shape.s_kv):
            raise ValueError(f"{text!r}: a window shape needs d in {list(D_QK_VALUES)}, positive sq, h, window, "
                             "raw >= sq, 0 <= topk <= skv (both 0 for no compressed pool; hca: topk = skv), bf16")
    elif shape.d_qk not in D_QK_VALUES or min(shape.sq, shape.heads, shape.topk, shape.s_kv) < 1 \
            or shape.topk > shape.s_kv or shape.raw_kv or shape.hca:
        raise ValueError(f"{text!r}: needs d in {list(D_QK_VALUES)}, positive sizes and topk <= skv (raw and hca "
                         "come with window)")
    if shape.kv_format != "bf16" and shape.d_qk != operands.get(shape.kv_format).d_qk:
        raise ValueError(f"{text!r}: kv={shape.kv_format} holds d={operands.get(shape.kv_format).d_qk} rows")
    return shape


def describe_shape(shape: Shape) -> str:
    fmt = "" if shape.kv_format == "bf16" else f",kv={shape.kv_format}"
    if shape.window:
        fmt += f",window={shape.window},raw={shape.raw_kv}" + (",hca=1" if shape.hca else "")
    return (f"sq={shape.sq},h={shape.heads},topk={shape.topk},skv={shape.s_kv},d={shape.d_qk},"
            f"sink={int(shape.sink)}{fmt}")



def flops(sq: int, heads: int, topk: int, d_qk: int = 576, d_v: int = D_V) -> int:
    """BENCHMARKS.md convention: 2 * Sq * H * topk * (d_qk + d_v), invalid entries counted."""
    return 2 * sq * heads * topk * (d_qk + d_v)

