"""Sparse MLA prefill (``../shared/MLA.md`` section 2, DeepSeek-V3.2 DSA): validation, launch,
reference, FLOPs and benchmark inputs.

Compile side: :class:`MlaSparsePrefillFamily` checks specs of the family (the ``gather`` ABI: raw
pointers and strides, since gathered rows cannot be described to TMA), adds the register-pool and
schedule checks to the resource model, and supplies the render context.

Run side, as functions that map onto a family protocol: :func:`prepare` (arguments -> :class:`Call`,
no host synchronisation), :func:`problem_key` (the tuning shape class), :func:`launch`,
:func:`reference`, :func:`flops` and :func:`make_inputs`. Bench peers (FlashMLA, a PyTorch gather
+ matmul, the public call): :mod:`.peers`.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass, replace
from typing import Any

from ... import abi, knobs, operands, plans
from ...errors import LaunchError, NoDeviceError, SpecError
from ..base import Family, register
from . import staging

D_V = 512
D_QK_VALUES = (576, 512)
BLOCK_H = 64      # heads per CTA of the sm90 kernel (fewer are zero-padded)
MAX_ROWS = 2**31 - 1


def params_for(kv_format: str = "bf16") -> abi.ParamStruct:
    """The kernel parameter struct; only the cache pointer's type depends on the KV format (its
    strides count elements of the cache tensor: bf16 values, or bytes of a quantized cache)."""
    return _params(operands.get(kv_format).c_pointer)


@functools.lru_cache(maxsize=None)
def _params(kv_pointer: str) -> abi.ParamStruct:
    return abi.ParamStruct("Params", (
        abi.Field("q", "const bf16*"),
        abi.Field("kv", kv_pointer),
        abi.Field("indices", "const int*"),
        abi.Field("topk_length", "const int*"),
        abi.Field("attn_sink", "float*"),
        abi.Field("out", "bf16*"),
        abi.Field("max_logits", "float*"),
        abi.Field("lse", "float*"),
        abi.Field("q_row_stride", "i64"),
        abi.Field("q_head_stride", "i64"),
        abi.Field("kv_row_stride", "i64"),
        abi.Field("kv_page_stride", "i64"),
        abi.Field("idx_row_stride", "i64"),
        abi.Field("o_row_stride", "i64"),
        abi.Field("o_head_stride", "i64"),
        abi.Field("ml_row_stride", "i64"),
        abi.Field("lse_row_stride", "i64"),
        abi.Field("sq", "int"),
        abi.Field("heads", "int"),
        abi.Field("topk", "int"),
        abi.Field("num_kv", "int"),
        abi.Field("page_size", "int"),
        abi.Field("scale_log2", "float"),
    ))


def params_tma_for(kv_format: str = "bf16") -> abi.ParamStruct:
    """The parameter struct of the ``gather_tma`` ABI: ``gather``'s plus a TMA descriptor of the
    KV rows (kv_tensor_map) for kernels that gather one row per TMA box."""
    return _params_tma(operands.get(kv_format).c_pointer)


@functools.lru_cache(maxsize=None)
def _params_tma(kv_pointer: str) -> abi.ParamStruct:
    return abi.ParamStruct("Params", _params(kv_pointer).fields + (abi.Field("kv_map", "tensormap"),))


PARAMS = params_for("bf16")
_ABIS = {"gather": params_for, "gather_tma": params_tma_for}
_SCHEDULE_KEYS = ("roles", "gather", "consumer_split")


class ArgumentError(LaunchError, ValueError):
    """A bad argument to the sparse prefill call (names the argument and what is allowed)."""


def _fail(arg: str, message: str, kind=ArgumentError):
    raise kind(f"mla_sparse_prefill: {arg}: {message}")


def _pow2_ceil(x: float) -> int:
    return 1 if x <= 1 else 1 << math.ceil(math.log2(x))


def check_compute(compute) -> str:
    """``compute`` of a call: only "bf16" (the default: an FP8 cache is read as bf16, dequantized
    in the kernel or staged first). The fp8 compute mode (FP8 tensor cores on the e4m3 values) was
    removed on 2026-12-01: it measured 0.77-0.93x the default call on the same cache, and less
    accurate (docs/notes-sparse.md)."""
    if not isinstance(compute, str):
        _fail("compute", f"expected the string 'bf16', got {compute!r}", TypeError)
    if compute == "fp8":
        _fail("compute", "the fp8 compute mode was removed (slower and less accurate than the default); the "
                         "default call, compute='bf16', reads FP8 caches (kv_format fp8_*) dequantized to bf16")
    if compute != "bf16":
        _fail("compute", f"{compute!r}: the only compute mode is 'bf16'")
    return compute


def _family_specs():
    """The family's packaged specs, highest priority first (dispatch's list)."""
    from ...dispatch import family_specs

    return family_specs(FAMILY.name)


@dataclass(frozen=True)
class ProblemKey:
    """Shape class of a call for tuning records: d_qk, heads and topk rounded up to powers of
    two, the KV layout (a flat table or a pool of strided pages: compiled separately), the KV
    format (``operands.NAMES``; written only when it is not bf16, so bf16 keys read as before)
    (``d576/h128/k2048/paged/fp8_v32``)."""

    d_qk: int
    heads: int
    topk: int
    layout: str = "flat"
    kv_format: str = "bf16"

    def __str__(self) -> str:
        fmt = "" if self.kv_format == "bf16" else f"/{self.kv_format}"
        return f"d{self.d_qk}/h{self.heads}/k{self.topk}/{self.layout}{fmt}"

    @classmethod
    def parse(cls, text: str) -> "ProblemKey":
        try:
            parts = text.split("/")
            if len(parts) == 4:
                parts.append("bf16")
            elif len(parts) == 5 and parts[4] == "bf16":
                raise ValueError   # bf16 is never written: one text per key
            d, h, k, layout, fmt = parts
            if d[0] != "d" or h[0] != "h" or k[0] != "k" or layout not in ("flat", "paged") \
                    or fmt not in operands.NAMES:
                raise ValueError
            key = cls(int(d[1:]), int(h[1:]), int(k[1:]), layout, fmt)
            if key.d_qk not in D_QK_VALUES or min(key.heads, key.topk) < 1:
                raise ValueError
            return key
        except (ValueError, IndexError):
            raise ValueError(f"{text!r} is not a sparse problem key like 'd576/h128/k2048/flat', "
                             f"or 'd576/h128/k2048/paged/fp8_v32'") from None

    def distance(self, other: "ProblemKey") -> float:
        if self.d_qk != other.d_qk or self.layout != other.layout or self.kv_format != other.kv_format:
            return math.inf
        return abs(math.log2(self.heads) - math.log2(other.heads)) + abs(math.log2(self.topk) - math.log2(other.topk))


def problem_key(call) -> ProblemKey:
    """The shape class of a Call or a Shape."""
    paged = getattr(call, "page_size", 0) > 0
    return ProblemKey(call.d_qk, _pow2_ceil(call.heads), _pow2_ceil(max(call.topk, 1)), "paged" if paged else "flat",
                      getattr(call, "kv_format", "bf16"))


@dataclass(frozen=True)
class Shape:
    """A benchmark / tuning problem: Sq query tokens, H heads, topk indices per token drawn
    without repetition from s_kv rows (BENCHMARKS.md), d_qk, whether the sink is on, the KV
    cache format (``operands.NAMES``; a quantized cache is a pool of 64-token pages).
    Text form: ``sq=4096,h=128,topk=2048,skv=8192[,d=576][,sink=1][,kv=fp8_v32]``."""

    id: str
    sq: int
    heads: int
    topk: int
    s_kv: int
    d_qk: int = 576
    sink: bool = True
    kv_format: str = "bf16"


_SHAPE_KEYS = {"sq": "sq", "h": "heads", "topk": "topk", "skv": "s_kv", "d": "d_qk", "sink": "sink",
               "kv": "kv_format"}

#: The sparse shapes of BENCHMARKS.md (d_qk 576, sink on).
SHAPES: dict[str, Shape] = {s.id: s for s in (
    Shape("S1", 4096, 128, 2048, 8192),
    Shape("S2", 4096, 128, 2048, 32768),
    Shape("S3", 4096, 128, 2048, 131072),
    Shape("S4", 4096, 64, 2048, 32768),
    Shape("S5", 4096, 16, 2048, 32768),
    Shape("S6", 4096, 128, 1024, 65536),
)}


def parse_shape(text: str, id: str | None = None) -> Shape:
    """A shape from an id of :data:`SHAPES` (any case) or
    ``sq=..,h=..,topk=..,skv=..[,d=..][,sink=..][,kv=..]``; ValueError naming the bad item."""
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
        if k == "kv":
            if v not in operands.NAMES:
                raise ValueError(f"{text!r}: kv must be one of {list(operands.NAMES)}, got {v!r}")
            values["kv_format"] = v
            continue
        try:
            values[_SHAPE_KEYS[k]] = int(v)
        except ValueError:
            raise ValueError(f"{text!r}: {k} must be an integer, got {v!r}") from None
    missing = [k for k, f in _SHAPE_KEYS.items() if f not in values and k not in ("d", "sink", "kv")]
    if missing:
        raise ValueError(f"{text!r}: missing {', '.join(missing)}")
    values["sink"] = bool(values.get("sink", 1))
    shape = Shape(id or text, **values)
    if shape.d_qk not in D_QK_VALUES or min(shape.sq, shape.heads, shape.topk, shape.s_kv) < 1 or shape.topk > shape.s_kv:
        raise ValueError(f"{text!r}: needs d in {list(D_QK_VALUES)}, positive sizes and topk <= skv")
    if shape.kv_format != "bf16" and shape.d_qk != operands.get(shape.kv_format).d_qk:
        raise ValueError(f"{text!r}: kv={shape.kv_format} holds d={operands.get(shape.kv_format).d_qk} rows")
    return shape


def describe_shape(shape: Shape) -> str:
    fmt = "" if shape.kv_format == "bf16" else f",kv={shape.kv_format}"
    return (f"sq={shape.sq},h={shape.heads},topk={shape.topk},skv={shape.s_kv},d={shape.d_qk},"
            f"sink={int(shape.sink)}{fmt}")


@dataclass
class Call:
    """One validated invocation: tensors checked, outputs allocated, nothing launched yet."""

    q: Any            # [Sq, H, d_qk]
    kv: Any           # the caller's tensor (2-D or 3-D)
    indices: Any      # [Sq, topk] view
    topk_length: Any  # [Sq] int32 or None
    attn_sink: Any    # [H] fp32 or None
    out: Any
    max_logits: Any
    lse: Any
    sq: int
    heads: int
    topk: int
    d_qk: int
    num_kv: int
    kv_row_stride: int
    kv_page_stride: int
    page_size: int    # 0: rows are kv_row_stride apart; else row r is (r // ps, r % ps) of a paged pool
    scale: float
    kv_format: str = "bf16"   # operands.NAMES; strides count elements of kv (bytes when quantized)

    @property
    def key(self) -> ProblemKey:
        return problem_key(self)

    @property
    def empty(self) -> bool:
        """Nothing to launch: no rows, or no row can see a key."""
        return self.sq == 0 or self.topk == 0 or self.num_kv == 0


def _check_tensor(torch, t, arg: str, dtype, ndims: tuple, device=None):
    if not isinstance(t, torch.Tensor):
        _fail(arg, f"expected a torch.Tensor, got {type(t).__name__}", TypeError)
    if t.dtype != dtype:
        _fail(arg, f"dtype must be {dtype}, got {t.dtype}", TypeError)
    if t.dim() not in ndims:
        _fail(arg, f"expected {' or '.join(map(str, ndims))} dimensions, got shape {tuple(t.shape)}")
    if device is not None and t.device != device:
        _fail(arg, f"must be on {device} (like q), got {t.device}")
    if t.numel() > 0 and t.stride(-1) != 1:
        _fail(arg, f"last dimension must be contiguous (stride 1), got stride {t.stride(-1)}")


def _aligned_or_copy(t):
    """cp.async reads 16-byte chunks: a view whose base or strides break that is copied."""
    ok = t.data_ptr() % 16 == 0 and all(
        (t.stride(d) * t.element_size()) % 16 == 0 for d in range(t.dim() - 1) if t.size(d) > 1)
    return t if ok else t.contiguous()


def kv_format_of(kv_format, d_qk: int = 576) -> operands.KvFormat:
    """The operand description of ``kv_format`` (ValueError / TypeError naming kv_format)."""
    if not isinstance(kv_format, str):
        _fail("kv_format", f"expected a string, one of {list(operands.NAMES)}, got {kv_format!r}", TypeError)
    if kv_format not in operands.NAMES:
        _fail("kv_format", f"{kv_format!r} is not one of {list(operands.NAMES)}")
    return operands.get(kv_format, d_qk)


def kv_layout(kv, fmt: operands.KvFormat, device=None):
    """Check the cache tensor against its format and map it onto rows: returns (kv as the kernel
    reads it, N rows, page_size, row stride, page stride), strides in elements of kv (bytes for a
    quantized cache). page_size 0 means rows are one stride apart (a flat table, or pages back
    to back); otherwise row ``r`` is page ``r // page_size``, offset ``r % page_size``.

    bf16: [N, d], [N, 1, d] or [blocks, page, d]. Quantized: uint8 [N, row_bytes],
    [blocks, page, row_bytes] or [blocks, page, 1, row_bytes] (FlashMLA's decode cache)."""
    import torch

    dtype = torch.uint8 if fmt.quantized else torch.bfloat16
    if isinstance(kv, torch.Tensor) and kv.dtype != dtype:
        _fail("kv", f"dtype must be {dtype} for kv_format {fmt.name!r}, got {kv.dtype}", TypeError)
    _check_tensor(torch, kv, "kv", dtype, (2, 3, 4) if fmt.quantized else (2, 3), device)
    if kv.dim() == 4:
        if kv.shape[2] != 1:
            _fail("kv", f"a 4-D cache must be [num_blocks, page_size, 1, {fmt.row_elems}], got {tuple(kv.shape)}")
        kv = kv[:, :, 0]
    if kv.shape[-1] != fmt.row_elems:
        if not fmt.quantized:
            _fail("kv", f"last dimension must match q's d_qk {fmt.d_qk}, got {kv.shape[-1]}")
        _fail("kv", f"last dimension must be {fmt.row_elems} (kv_format {fmt.name!r} rows are {fmt.row_bytes} bytes ("
                    f"{fmt.values} e4m3, {fmt.scales} fp32 scales, {fmt.rope} bf16)), got {kv.shape[-1]}")
    if kv.dim() == 2:
        num_kv, page_size, row_stride, page_stride = kv.shape[0], 0, kv.stride(0), 0
    else:
        blocks, ps = kv.shape[0], kv.shape[1]
        num_kv = blocks * ps
        if ps == 1:
            page_size, row_stride, page_stride = 0, kv.stride(0), 0
        elif blocks <= 1 or kv.stride(0) == ps * kv.stride(1):
            page_size, row_stride, page_stride = 0, kv.stride(1), 0   # pages back to back: a flat table
        else:
            page_size, row_stride, page_stride = ps, kv.stride(1), kv.stride(0)
    # The gather reads 16-byte chunks: a base or stride that breaks that is copied (rows packed).
    if kv.numel() and not (kv.data_ptr() % 16 == 0
                           and all((s * fmt.elem_bytes) % 16 == 0 for s in (row_stride, page_stride))):
        kv = kv.contiguous()
        page_size, page_stride, row_stride = 0, 0, fmt.row_elems
    return kv, num_kv, page_size, row_stride, page_stride


def prepare(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, out=None,
            max_logits=None, lse=None, kv_format="bf16", compute="bf16") -> Call:
    """Validate the arguments (errors name the argument) and allocate the outputs. Reads no
    device values, so it never synchronises the host and can run inside CUDA graph capture."""
    import torch

    kv_format_of(kv_format)
    check_compute(compute)
    if not isinstance(q, torch.Tensor):
        _fail("q", f"expected a torch.Tensor, got {type(q).__name__}", TypeError)
    if q.device.type != "cuda":
        _fail("q", f"must be a CUDA tensor, got device {q.device}")
    device = q.device
    _check_tensor(torch, q, "q", torch.bfloat16, (3,))
    sq, heads, d_qk = q.shape
    if d_qk not in D_QK_VALUES:
        _fail("q", f"last dimension (d_qk) must be 576 (512 latent + 64 rope) or 512, got {d_qk}")
    if heads < 1:
        _fail("q", "needs at least one head")
    if d_v != D_V:
        _fail("d_v", f"must be {D_V} (V is the first 512 columns of each KV row), got {d_v!r}")

    fmt = kv_format_of(kv_format, d_qk)
    if fmt.d_qk != d_qk:
        _fail("q", f"last dimension (d_qk) must be {fmt.d_qk} for kv_format {fmt.name!r} "
                   f"({fmt.values} latent + {fmt.rope} rope), got {d_qk}")
    kv, num_kv, page_size, row_stride, page_stride = kv_layout(kv, fmt, device)

    _check_tensor(torch, indices, "indices", torch.int32, (2, 3), device)
    if indices.dim() == 3:
        if indices.shape[1] != 1:
            _fail("indices", f"expected [Sq, topk] or [Sq, 1, topk], got {tuple(indices.shape)}")
        indices = indices[:, 0, :]
    if indices.shape[0] != sq:
        _fail("indices", f"has {indices.shape[0]} rows, q has {sq} query tokens")
    topk = indices.shape[1]

    if topk_length is not None:
        _check_tensor(torch, topk_length, "topk_length", torch.int32, (1,), device)
        if topk_length.shape[0] != sq:
            _fail("topk_length", f"expected shape ({sq},), got {tuple(topk_length.shape)}")
    if attn_sink is not None:
        _check_tensor(torch, attn_sink, "attn_sink", torch.float32, (1,), device)
        if attn_sink.shape[0] != heads:
            _fail("attn_sink", f"expected shape ({heads},) (one per head), got {tuple(attn_sink.shape)}")

    if isinstance(softmax_scale, bool):
        _fail("softmax_scale", f"expected a float, got {softmax_scale!r}", TypeError)
    try:
        scale = float(softmax_scale)
    except (TypeError, ValueError):
        _fail("softmax_scale", f"expected a float, got {softmax_scale!r}", TypeError)
    if not (math.isfinite(scale) and scale > 0):
        _fail("softmax_scale", f"must be a finite positive number, got {softmax_scale!r}")
    if sq * max(1, -(-heads // BLOCK_H)) > MAX_ROWS:
        _fail("q", "more than 2**31 - 1 (token, head group) blocks is not supported")

    if out is None:
        out = torch.empty((sq, heads, D_V), dtype=torch.bfloat16, device=device)
    else:
        _check_tensor(torch, out, "out", torch.bfloat16, (3,), device)
        if tuple(out.shape) != (sq, heads, D_V):
            _fail("out", f"expected shape ({sq}, {heads}, {D_V}), got {tuple(out.shape)}")
        if out.data_ptr() % 4 or any(out.stride(d) % 2 for d in range(2) if out.size(d) > 1):
            _fail("out", "base address and row/head strides must be multiples of 4 bytes")
    for name, t in (("max_logits", max_logits), ("lse", lse)):
        if t is not None:
            _check_tensor(torch, t, name, torch.float32, (2,), device)
            if tuple(t.shape) != (sq, heads):
                _fail(name, f"expected shape ({sq}, {heads}), got {tuple(t.shape)}")
    if max_logits is None:
        max_logits = torch.empty((sq, heads), dtype=torch.float32, device=device)
    if lse is None:
        lse = torch.empty((sq, heads), dtype=torch.float32, device=device)

    q = _aligned_or_copy(q)
    return Call(q, kv, indices, topk_length, attn_sink, out, max_logits, lse, sq, heads, topk, d_qk,
                min(num_kv, MAX_ROWS), row_stride, page_stride, page_size, scale, fmt.name)


def fill_empty(call: Call) -> None:
    """Outputs of a call in which no row sees a key: out 0, max_logits -inf, lse +inf."""
    call.out.zero_()
    call.max_logits.fill_(-math.inf)
    call.lse.fill_(math.inf)


_MAP_CACHE_SIZE = 256
_kv_maps: dict[tuple, bytes] = {}  # oldest first; read without the lock (dict reads are atomic)
_kv_maps_lock = threading.Lock()


_NO_MAP = bytes(128)


def _kv_map_key(call: Call) -> tuple:
    """(address, chunks, rows of a page, pages, row bytes, page bytes) of the KV tensor map."""
    row_bytes, chunks = 2 * call.kv_row_stride, call.d_qk // 64
    if call.page_size > 0:
        rows, pages, page_bytes = call.page_size, -(-call.num_kv // call.page_size), 2 * call.kv_page_stride
    else:
        rows, pages, page_bytes = max(call.num_kv, 1), 1, max(call.num_kv, 1) * row_bytes
    return (call.kv.data_ptr(), chunks, rows, pages, row_bytes, page_bytes)


def kv_tensor_map(call: Call) -> bytes:
    """TMA descriptor of a call's bf16 KV rows as a 4-D tensor (64 values, d_qk / 64 chunks, rows
    of a page, pages; a flat table is one page of N rows), 128-byte swizzled, box one row."""
    return _kv_map(_kv_map_key(call))


def _kv_map(key: tuple) -> bytes:
    from ...runtime import encode_tensor_map_bf16

    hit = _kv_maps.get(key)
    if hit is not None:
        return hit
    address, chunks, rows, pages, row_bytes, page_bytes = key
    encoded = encode_tensor_map_bf16(address, [64, chunks, rows, pages], [128, row_bytes, page_bytes],
                                     [64, chunks, 1, 1], 128, "kv")
    with _kv_maps_lock:
        if len(_kv_maps) >= _MAP_CACHE_SIZE:
            del _kv_maps[next(iter(_kv_maps))]
        _kv_maps[key] = encoded
    return encoded


def pack(call: Call, abi_name: str = "gather"):
    return _ABIS[abi_name](call.kv_format).pack(_pack_values(call, abi_name))


def _pack_values(call: Call, abi_name: str) -> dict:
    values = {
        "q": call.q.data_ptr(), "kv": call.kv.data_ptr(), "indices": call.indices.data_ptr(),
        "topk_length": call.topk_length.data_ptr() if call.topk_length is not None else 0,
        "attn_sink": call.attn_sink.data_ptr() if call.attn_sink is not None else 0,
        "out": call.out.data_ptr(), "max_logits": call.max_logits.data_ptr(), "lse": call.lse.data_ptr(),
        "q_row_stride": call.q.stride(0), "q_head_stride": call.q.stride(1),
        "kv_row_stride": call.kv_row_stride, "kv_page_stride": call.kv_page_stride,
        "idx_row_stride": call.indices.stride(0),
        "o_row_stride": call.out.stride(0), "o_head_stride": call.out.stride(1),
        "ml_row_stride": call.max_logits.stride(0), "lse_row_stride": call.lse.stride(0),
        "sq": call.sq, "heads": call.heads, "topk": call.topk, "num_kv": call.num_kv,
        "page_size": call.page_size, "scale_log2": call.scale * math.log2(math.e),
    }
    if abi_name == "gather_tma":
        # A quantized cache is bulk-copied row by row (no tensor map; the field is zeros).
        values["kv_map"] = kv_tensor_map(call) if call.kv_format == "bf16" else _NO_MAP
    return values


def grid(selection, call: Call) -> tuple[int, int, int]:
    rows = selection.env["block_h"]
    items = call.sq * -(-call.heads // rows)
    if dict(selection.spec.problem).get("persistent", False):
        # One CTA per SM loops over the items (the kernel strides by gridDim.x).
        from ...runtime import device_info

        return (max(1, min(items, device_info(call.q.device.index).sm_count)), 1, 1)
    return (items, 1, 1)


def launch(selection, call: Call, stream: int) -> None:
    """Launch the selected kernel on ``stream``; no host synchronisation."""
    res = selection.resources
    selection.kernel.launch(grid(selection, call), (res.threads, 1, 1), res.smem_bytes, stream,
                            pack(call, selection.spec.abi))


def specialization(call) -> dict:
    """The compile-time values a call (or Shape) needs: d_qk, whether kv is a pool of strided
    pages, and the KV format."""
    return {"d_qk": call.d_qk, "paged": getattr(call, "page_size", 0) > 0,
            "kv_format": getattr(call, "kv_format", "bf16")}


def accepts(spec, call: Call) -> bool:
    """Whether ``spec`` can serve ``call`` (a Call or a Shape): its ABI, and its specialisation
    axes hold the call's values."""
    axes = dict(spec.specialize)
    return spec.abi in _ABIS and all(v in axes.get(k, ()) for k, v in specialization(call).items())


def preferred(spec, call) -> bool:
    """Whether dispatch may choose ``spec`` for ``call`` unasked: a spec with ``problem.max_heads``
    (a kernel for few heads, correct for any count) is chosen only up to that many heads, and one
    with ``problem.preferred_kv_formats`` (comma-separated names) only for caches of those formats
    (it reads the others when asked by name)."""
    problem = dict(spec.problem)
    fmt = getattr(call, "kv_format", "bf16")
    formats = problem.get("preferred_kv_formats")
    return call.heads <= problem.get("max_heads", call.heads) and (formats is None or fmt in formats.split(","))


def kv_format_targets(kv_format: str) -> list[str]:
    """The targets of the family's specs that read ``kv_format`` caches."""
    return sorted({t for s in _family_specs() if kv_format in dict(s.specialize).get("kv_format", ())
                   for t in s.targets})


# --- the family (compile side) --------------------------------------------------------------


class MlaSparsePrefillFamily(Family):
    name = "mla_sparse_prefill"

    def validate_spec(self, spec) -> None:
        problem = dict(spec.problem)
        for key, value in {"d_v": D_V, "dtype": "bf16"}.items():
            if problem.get(key) != value:
                raise SpecError(spec.path, f"problem.{key}",
                                f"{problem.get(key)!r}: this family implements {key} = {value!r}")
        for key in ("max_heads",):
            if key in problem and not (isinstance(problem[key], int) and not isinstance(problem[key], bool)
                                       and problem[key] >= 1):
                raise SpecError(spec.path, f"problem.{key}", f"{problem[key]!r}: expected a positive integer")
        formats = problem.get("preferred_kv_formats")
        allowed = list(dict(spec.specialize).get("kv_format", ()))
        if formats is not None and (not isinstance(formats, str) or not set(formats.split(",")) <= set(allowed)):
            raise SpecError(spec.path, "problem.preferred_kv_formats", f"{formats!r}: expected comma-separated "
                            f"names of the spec's kv_format values {allowed}")
        if "persistent" in problem and not isinstance(problem["persistent"], bool):
            raise SpecError(spec.path, "problem.persistent", f"{problem['persistent']!r}: expected true or false")
        if "compute" in problem:
            raise SpecError(spec.path, "problem.compute", "the fp8 compute mode was removed (2026-12-01): every "
                            "spec of this family computes in bf16; drop the key")
        if spec.abi not in _ABIS:
            raise SpecError(spec.path, "abi", f"{spec.abi!r} is not one of {sorted(_ABIS)}")
        axes = dict(spec.specialize)
        if set(axes) != {"d_qk", "paged", "kv_format"} or not set(axes["d_qk"]) <= set(D_QK_VALUES) \
                or not set(axes["paged"]) <= {False, True} or not set(axes["kv_format"]) <= set(operands.NAMES):
            raise SpecError(spec.path, "specialize", f"this family specialises on d_qk (values from "
                            f"{list(D_QK_VALUES)}), paged (false, true) and kv_format (from {list(operands.NAMES)})")
        if spec.schedule is not None:
            _validate_schedule(spec)
        from ... import expr, variant

        env = variant.make(spec, {}).env()
        for i, c in enumerate(spec.constraints):
            try:
                ok = c.require(env)
            except expr.ExprError as exc:
                raise SpecError(spec.path, f"constraints[{i}].require", str(exc)) from None
            if not ok:
                raise SpecError(spec.path, "tune", f"the default variant breaks constraint {i}: {c.message} "
                                f"(requires {c.require.text})")

    def check_variant(self, variant, target, resources) -> list[str]:
        fmt = operands.get(variant["kv_format"], variant["d_qk"])
        if fmt.d_qk != variant["d_qk"]:
            return [f"kv_format {fmt.name} rows hold {fmt.values} latent + {fmt.rope} rope values: d_qk must be "
                    f"{fmt.d_qk}"]
        if variant.spec.schedule is None:
            return []
        if not target.has("wgmma") or not target.has("setmaxnreg"):
            return [f"{target.name} has no wgmma/setmaxnreg; this schedule needs sm_90a"]
        s = evaluate_schedule(variant)
        reasons = []
        pool = resources.threads * min(255, 65536 // resources.threads // 8 * 8)
        total = sum(128 * wgs * regs for wgs, regs in s["roles"].values())
        if total > pool:
            reasons.append(f"register budget: roles need {total} registers, the CTA holds {pool} at launch "
                           f"({resources.threads} threads); setmaxnreg would wait forever")
        for name, (wgs, regs) in s["roles"].items():
            if not (24 <= regs <= 256 and regs % 8 == 0):
                reasons.append(f"{name} registers {regs}: setmaxnreg takes a multiple of 8 in [24, 256]")
        if s["roles"]["consumer"][0] != 2 or s["roles"]["producer"][0] != 1:
            reasons.append("this kernel has one gathering warpgroup and two consumer warpgroups")
        # Each buffer is gathered in two halves with their own barriers.
        if s["gather"]["rows"] != 64 or s["gather"]["buffers"] != 2 or s["gather"]["halves"] != 2 \
                or s["gather"]["threads_per_row"] != 8:
            reasons.append("the gather is 64 rows into 2 buffers of 2 halves, 8 threads per 128-byte row")
        return reasons

    def render_context(self, variant) -> dict:
        from ...resources import estimate

        fmt = operands.get(variant["kv_format"], variant["d_qk"])
        # The operand as data for the template: its device loader and row layout.
        kv = {"format": fmt.name, "quantized": fmt.quantized, "row_bytes": fmt.row_bytes, "value_count": fmt.values,
              "scale_block": fmt.scale_block, "scale_offset": fmt.scale_offset, "rope_offset": fmt.rope_offset,
              "rope": fmt.rope}
        return {"params_decl": _ABIS[variant.spec.abi](fmt.name).c_declaration(),
                "smem_bytes": estimate(variant).smem_bytes, "kv": kv}

    # --- shape classes ----------------------------------------------------------------------

    def problem_key(self, shape) -> str:
        return str(problem_key(shape))

    def problem_distance(self, a: str, b: str) -> float:
        return ProblemKey.parse(a).distance(ProblemKey.parse(b))

    def specialization(self, shape) -> dict:
        return specialization(shape)

    def problem_specialization(self, problem: str) -> dict:
        key = ProblemKey.parse(problem)
        return {"d_qk": key.d_qk, "paged": key.layout == "paged", "kv_format": key.kv_format}

    def parse_shape(self, text: str, id: str | None = None) -> Shape:
        return parse_shape(text, id)

    def describe_shape(self, shape) -> str:
        return describe_shape(shape)

    def shapes(self) -> dict[str, Shape]:
        """S1 ... S6 of BENCHMARKS.md."""
        return dict(SHAPES)

    def check_shapes(self, problem: str) -> list[Shape]:
        """The named shapes of the class; for a quantized cache's class, the first bf16 shape of
        the same class read from that format (records of them are tuned on S1's sizes)."""
        same = super().check_shapes(problem)
        key = ProblemKey.parse(problem)
        if same or key.kv_format == "bf16":
            return same
        plain = str(replace(key, kv_format="bf16"))
        return [replace(s, kv_format=key.kv_format) for s in SHAPES.values()
                if str(problem_key(s)) == plain][:1]

    def refuses(self, spec, shape) -> str | None:
        """A spec serves its kv_format values."""
        formats = dict(spec.specialize).get("kv_format", ())
        if getattr(shape, "kv_format", "bf16") not in formats:
            return f"the shape's kv={shape.kv_format} is not one of the spec's kv_format values {list(formats)}"
        return None

    # --- run time ---------------------------------------------------------------------------

    def accepts(self, spec, call) -> bool:
        return accepts(spec, call)

    def launch(self, selection, call, stream: int) -> None:
        launch(selection, call, stream)

    def make_inputs(self, shape, device, seed: int = 0) -> dict:
        return make_inputs(shape, device, seed)

    def make_outputs(self, shape, device, fill: float = float("nan")):
        import torch

        return (torch.full((shape.sq, shape.heads, D_V), fill, dtype=torch.bfloat16, device=device),
                torch.full((shape.sq, shape.heads), fill, dtype=torch.float32, device=device),
                torch.full((shape.sq, shape.heads), fill, dtype=torch.float32, device=device))

    def check_shape(self, shape) -> Shape:
        """5 tokens, up to 20 heads (a partial 64-row group), topk 200 (not a multiple of the
        64-row block, so the last pair is part-invalid) over 300 rows, the shape's d_qk."""
        return Shape(f"check:{shape.id}", 5, min(shape.heads, 20), 200, 300, shape.d_qk, True,
                     getattr(shape, "kv_format", "bf16"))

    def call(self, inputs, *, variant=None, kernel=None, outputs=None, check=False):
        # The eager path the public call and its torch ops run (the ops module imports this one).
        out, max_logits, lse = outputs if outputs is not None else (None, None, None)
        return run(inputs["q"], inputs["kv"], inputs["indices"], softmax_scale=inputs["softmax_scale"],
                   topk_length=inputs.get("topk_length"), attn_sink=inputs.get("attn_sink"), out=out,
                   max_logits=max_logits, lse=lse, kernel=variant if variant is not None else kernel,
                   kv_format=inputs.get("kv_format", "bf16"))

    def reference(self, shape, inputs, heads: int | None = None):
        """The reference on the first ``heads`` heads (fp32-dequantized rows for a quantized cache)."""
        h = inputs["q"].shape[1] if heads is None else min(heads, inputs["q"].shape[1])
        sink = inputs.get("attn_sink")
        return reference(inputs["q"][:, :h], inputs["kv"], inputs["indices"], softmax_scale=inputs["softmax_scale"],
                         topk_length=inputs.get("topk_length"), attn_sink=None if sink is None else sink[:h],
                         kv_format=inputs.get("kv_format", "bf16"))

    def compare(self, got, ref):
        return compare(got, ref)

    def flops(self, shape) -> int:
        return flops(shape.sq, shape.heads, shape.topk, shape.d_qk)

    @property
    def tolerance(self) -> float:
        return REL_TOL


def _validate_schedule(spec) -> None:
    from ... import expr

    sched = spec.schedule
    if not isinstance(sched, dict) or set(sched) != set(_SCHEDULE_KEYS):
        raise SpecError(spec.path, "schedule", f"expected the keys {list(_SCHEDULE_KEYS)}")
    known = ({k for k, _ in spec.problem} | {k for k, _ in spec.derived} | {k for k, _ in spec.specialize}
             | {t.name for t in spec.tunables})

    def check(value, where):
        try:
            e = expr.parse(value)
        except expr.ExprError as exc:
            raise SpecError(spec.path, where, str(exc)) from None
        if e.names - known:
            raise SpecError(spec.path, where, f"unknown name(s) {sorted(e.names - known)}")

    roles = sched["roles"]
    if not isinstance(roles, dict) or list(roles) != ["producer", "consumer"]:
        raise SpecError(spec.path, "schedule.roles", "expected the roles producer and consumer, in that order")
    for name, body in roles.items():
        if not isinstance(body, dict) or set(body) != {"warpgroups", "registers", "tasks"}:
            raise SpecError(spec.path, f"schedule.roles.{name}", "expected keys warpgroups, registers, tasks")
        check(body["warpgroups"], f"schedule.roles.{name}.warpgroups")
        check(body["registers"], f"schedule.roles.{name}.registers")
    gather = sched["gather"]
    keys = {"rows", "buffers", "halves", "threads_per_row", "l2_evict_last"}
    if not isinstance(gather, dict) or set(gather) != keys:
        raise SpecError(spec.path, "schedule.gather", f"expected keys {sorted(keys)}")
    for k, value in gather.items():
        check(value, f"schedule.gather.{k}")
    split = sched["consumer_split"]
    if split != {"scores": "alternate_blocks", "output_columns": "halves"}:
        raise SpecError(spec.path, "schedule.consumer_split",
                        "this kernel splits scores by alternate blocks and the output columns in halves")


def evaluate_schedule(variant) -> dict:
    from ... import expr

    env = variant.env()
    sched = variant.spec.schedule
    roles = {name: (int(expr.parse(b["warpgroups"])(env)), int(expr.parse(b["registers"])(env)))
             for name, b in sched["roles"].items()}
    gather = {k: expr.parse(v)(env) for k, v in sched["gather"].items()}
    return {"roles": roles, "gather": gather}


FAMILY = register(MlaSparsePrefillFamily())


# --- reference, FLOPs, inputs -----------------------------------------------------------------


def flops(sq: int, heads: int, topk: int, d_qk: int = 576, d_v: int = D_V) -> int:
    """BENCHMARKS.md convention: 2 * Sq * H * topk * (d_qk + d_v), invalid entries counted."""
    return 2 * sq * heads * topk * (d_qk + d_v)


def kv_rows(kv):
    """The KV table as [N, d] rows (a paged pool's row is block * page_size + offset)."""
    return kv.reshape(-1, kv.shape[-1])


def reference(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, dtype=None,
              chunk: int = 64, kv_format="bf16"):
    """MLA.md section 2 in ``dtype`` (float64 on CPU, float32 on GPU by default).

    A quantized cache (``kv_format`` other than bf16) is dequantized first (fp32 product of the
    e4m3 value and its block's scale, :func:`mlagen.operands.dequantize`, not rounded to bf16);
    the rest is the same computation.

    Returns (out [Sq, H, d_v], max_logits [Sq, H], lse [Sq, H]) in that dtype, natural log. Invalid
    entries (index < 0 or >= N, or position >= topk_length) count for nothing; duplicates count
    each time; the sink enters the denominator only; a row with no valid entry gives out 0,
    max_logits -inf and lse +inf.
    """
    import torch

    if dtype is None:
        dtype = torch.float64 if q.device.type == "cpu" else torch.float32
    fmt = operands.get(kv_format, q.shape[-1])
    rows = operands.dequantize(kv, fmt) if fmt.quantized else kv_rows(kv)
    n = rows.shape[0]
    if indices.dim() == 3:
        indices = indices[:, 0, :]
    sq, heads, _ = q.shape
    topk = indices.shape[1]
    out = torch.zeros((sq, heads, d_v), dtype=dtype, device=q.device)
    max_logits = torch.full((sq, heads), -math.inf, dtype=dtype, device=q.device)
    lse = torch.full((sq, heads), math.inf, dtype=dtype, device=q.device)
    if sq == 0 or topk == 0 or n == 0:
        return out, max_logits, lse
    pos = torch.arange(topk, device=q.device)
    for t0 in range(0, sq, chunk):
        t1 = min(sq, t0 + chunk)
        idx = indices[t0:t1].long()
        valid = (idx >= 0) & (idx < n)
        if topk_length is not None:
            valid &= pos.unsqueeze(0) < topk_length[t0:t1].long().unsqueeze(1)
        g = rows[idx.clamp(0, n - 1)].to(dtype)                               # [c, topk, d_qk]
        s = torch.einsum("chd,ckd->chk", q[t0:t1].to(dtype), g) * softmax_scale
        s = s.masked_fill(~valid.unsqueeze(1), -math.inf)
        m = s.amax(dim=-1)                                                    # -inf where empty
        seen = torch.isfinite(m)
        m_safe = torch.where(seen, m, torch.zeros_like(m))
        p = torch.exp(s - m_safe.unsqueeze(-1))
        total = p.sum(-1)
        denom = total.clone()
        if attn_sink is not None:
            denom = denom + torch.exp(attn_sink.to(dtype).unsqueeze(0) - m_safe)
        o = torch.einsum("chk,ckd->chd", p, g[..., :d_v]) / denom.unsqueeze(-1)
        out[t0:t1] = torch.where(seen.unsqueeze(-1), o, torch.zeros_like(o))
        max_logits[t0:t1] = m
        lse[t0:t1] = torch.where(seen, m_safe + torch.log(total), torch.full_like(m, math.inf))
    return out, max_logits, lse


def random_indices(sq: int, topk: int, s_kv: int, device, generator=None, chunk: int = 256):
    """[Sq, topk] int32, each row a uniform random choice without repetition over [0, s_kv)."""
    import torch

    if topk > s_kv:
        raise ValueError(f"topk {topk} > s_kv {s_kv}: a choice without repetition is impossible")
    rows = []
    for t0 in range(0, sq, chunk):
        r = torch.rand((min(chunk, sq - t0), s_kv), device=device, generator=generator)
        rows.append(r.topk(topk, dim=-1).indices.to(torch.int32))
    return torch.cat(rows) if rows else torch.empty((0, topk), dtype=torch.int32, device=device)


def make_inputs(shape: dict, device, seed: int = 0) -> dict:
    """Benchmark / verification inputs for a shape {sq, heads, topk, s_kv[, d_qk][, sink][, kv_format]}:
    fresh randn data, indices a uniform choice without repetition (BENCHMARKS.md), the sink on unless
    ``sink`` is False. Returns keyword arguments of :func:`mlagen.mla_sparse_prefill` (``kv_format``
    only for a quantized cache)."""
    import torch

    if isinstance(shape, Shape):
        shape = {"sq": shape.sq, "heads": shape.heads, "topk": shape.topk, "s_kv": shape.s_kv, "d_qk": shape.d_qk,
                 "sink": shape.sink, "kv_format": shape.kv_format}
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sq, heads, topk, s_kv = shape["sq"], shape["heads"], shape["topk"], shape["s_kv"]
    d_qk = shape.get("d_qk", 576)
    q = torch.randn((sq, heads, d_qk), device=device, generator=gen).to(torch.bfloat16)
    kv = torch.randn((s_kv, 1, d_qk), device=device, generator=gen).to(torch.bfloat16)
    indices = random_indices(sq, topk, s_kv, device, gen).view(sq, 1, topk)
    sink = torch.randn((heads,), device=device, generator=gen) if shape.get("sink", True) else None
    inputs = {"q": q, "kv": kv, "indices": indices, "softmax_scale": d_qk ** -0.5, "attn_sink": sink}
    fmt = operands.get(shape.get("kv_format", "bf16"), d_qk)
    if fmt.quantized:
        # The same rows quantized into a pool of 64-token pages (the V3.2 serving layout).
        pages = -(-s_kv // 64)
        rows = torch.zeros((pages * 64, d_qk), device=device)
        rows[:s_kv] = kv[:, 0].float()
        inputs["kv"] = operands.quantize(rows, fmt).view(pages, 64, fmt.row_bytes)
        inputs["kv_format"] = fmt.name
    return inputs


REL_TOL = 1e-2    # bf16 P and output; fp32 accumulation
STAT_TOL = 2e-3   # lse and max_logits, relative to 1 + |value|


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


def compare(got, ref, rel_tol: float = REL_TOL, stat_tol: float = STAT_TOL) -> Check:
    """(out, max_logits, lse) against the reference's: coverage (no NaN) everywhere, accuracy on
    the reference's heads; rows with no valid entry must be exactly 0 / -inf / +inf."""
    import torch

    out, ml, lse = got
    r_out, r_ml, r_lse = ref
    heads = r_out.shape[1]
    problems = []
    bad = int(torch.isnan(out).sum()) + int(torch.isnan(ml).sum()) + int(torch.isnan(lse).sum())
    if bad:
        problems.append(f"{bad} output values are NaN (unwritten or computed)")
    diff = out[:, :heads].double() - r_out.double()
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    rel = float(diff.norm() / r_out.double().norm().clamp_min(1e-30)) if r_out.numel() else 0.0
    if float(r_out.double().norm()) == 0.0:
        rel = max_abs
    if not rel <= rel_tol:
        problems.append(f"relative L2 error {rel:.2e} > {rel_tol:.0e}")
    lse_err = 0.0
    for name, a, b in (("lse", lse[:, :heads], r_lse), ("max_logits", ml[:, :heads], r_ml)):
        a = a.double()
        b = b.double()
        inf_b = torch.isinf(b)
        if not torch.equal(a[inf_b], b[inf_b]):
            problems.append(f"{name} of rows with no valid entry must be {'+inf' if name == 'lse' else '-inf'}")
        fin = ~inf_b
        if bool(fin.any()):
            err = float(((a[fin] - b[fin]).abs() / (1 + b[fin].abs())).max())
            if name == "lse":
                lse_err = err
            if not err <= stat_tol:
                problems.append(f"{name} error {err:.2e} > {stat_tol:.0e}")
    return Check(max_abs, rel, lse_err, "; ".join(problems) or None)


# --- the eager path (the torch ops of .op run it; mlagen.api re-exports .op's entry points) -----


def run(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, out=None, max_logits=None,
        lse=None, kernel=None, kv_format="bf16", compute="bf16"):
    """The eager path of one call (what the torch ops run): check, select, launch on the current
    stream; returns (out, max_logits, lse). See :func:`mlagen.mla_sparse_prefill`."""
    import torch

    from ...runtime import current_stream

    sig = None
    if kernel is None or type(kernel) is str:
        sig = _signature(torch, q, kv, indices, softmax_scale, topk_length, attn_sink, d_v, out, max_logits, lse,
                         kernel, kv_format, compute)
        plan = _plans.get(sig) if sig is not None else None
        if plan is not None:
            return plan.run(torch, q, kv, indices, topk_length, attn_sink, out, max_logits, lse)
    call = prepare(q, kv, indices, softmax_scale=softmax_scale, topk_length=topk_length, attn_sink=attn_sink,
                   d_v=d_v, out=out, max_logits=max_logits, lse=lse, kv_format=kv_format, compute=compute)
    if call.empty:
        if call.sq:
            fill_empty(call)
        return call.out, call.max_logits, call.lse
    if staging.applies(call, kernel):   # an FP8 cache in bf16: dequantized first (staging.py says why)
        index = call.q.device.index
        if index == torch.cuda.current_device():
            ws, ws_indices = staging.stage(call)
        else:
            with torch.cuda.device(index):
                ws, ws_indices = staging.stage(call)
        return run(call.q, ws, ws_indices, softmax_scale=call.scale, topk_length=call.topk_length,
                   attn_sink=call.attn_sink, d_v=d_v, out=call.out, max_logits=call.max_logits, lse=call.lse)
    device, selection = select(call, kernel)
    stream = current_stream(torch, device)
    if device == torch.cuda.current_device():
        launch(selection, call, stream)
    else:  # the tensors' device (a cheap check, a costly switch)
        with torch.cuda.device(device):
            launch(selection, call, stream)
    if sig is not None and sig[-1] == device:
        try:
            plan = _Plan.of(selection, call, q, kv, indices)
        except Exception:   # the call ran; without a plan the next one takes the full path again
            plan = None
        if plan is not None:
            _plans.put(sig, plan)
    return call.out, call.max_logits, call.lse


_plans = plans.PlanCache()


def _signature(torch, q, kv, indices, softmax_scale, topk_length, attn_sink, d_v, out, max_logits, lse, kernel,
               kv_format, compute):
    """The launch-plan signature of a call (mlagen/plans.py), or None when it takes the full path
    (plans off, or an argument a signature cannot hold). The current device comes last."""
    from ... import dispatch

    if type(q) is not torch.Tensor or q.get_device() < 0:
        return None   # the full path says what is wrong
    state = knobs.call_state()
    if state is None:
        return None
    try:
        t = torch.Tensor
        return (plans.tensor_sig(q, t), plans.tensor_sig(kv, t), plans.tensor_sig(indices, t),
                plans.tensor_sig(topk_length, t), plans.tensor_sig(attn_sink, t), plans.tensor_sig(out, t),
                plans.tensor_sig(max_logits, t), plans.tensor_sig(lse, t), plans.scalar_sig(softmax_scale),
                plans.scalar_sig(d_v), plans.scalar_sig(kernel), plans.scalar_sig(kv_format),
                plans.scalar_sig(compute), state, dispatch.dispatcher().generation, torch.cuda.current_device())
    except plans.NoPlan:
        return None


# The fields of the parameter struct that change from call to call with one signature.
_POINTERS = ("q", "kv", "indices", "topk_length", "attn_sink", "out", "max_logits", "lse")


class _Plan:
    """A sparse call's launch plan: the outputs' shapes and what ``pack`` would write, less the
    pointers (and the KV tensor map's address, for the TMA gather)."""

    def __init__(self, launch_plan, device, out_shape, stat_shape, kv_map_key):
        self.launch_plan, self.device = launch_plan, device
        self.out_shape, self.stat_shape, self.kv_map_key = out_shape, stat_shape, kv_map_key

    @classmethod
    def of(cls, selection, call: Call, q, kv, indices):
        """The plan of a call that ran, or None where the full path copied an argument (then a
        repeated call must copy again) or the kernel has no plan-able launcher."""
        if (call.q.data_ptr(), call.kv.data_ptr(), call.indices.data_ptr()) != (q.data_ptr(), kv.data_ptr(),
                                                                                 indices.data_ptr()):
            return None
        abi_name = selection.spec.abi
        values = _pack_values(call, abi_name)
        variable = _POINTERS
        kv_map_key = None
        if abi_name == "gather_tma" and call.kv_format == "bf16":
            variable = _POINTERS + ("kv_map",)
            kv_map_key = _kv_map_key(call)[1:]
        res = selection.resources
        launch_plan = plans.LaunchPlan(selection.kernel, grid(selection, call), (res.threads, 1, 1), res.smem_bytes,
                                       _ABIS[abi_name](call.kv_format), values, variable)
        return cls(launch_plan, call.q.device, tuple(call.out.shape), tuple(call.lse.shape), kv_map_key)

    def run(self, torch, q, kv, indices, topk_length, attn_sink, out, max_logits, lse):
        from ...runtime import current_stream

        if out is None:
            out = torch.empty(self.out_shape, dtype=torch.bfloat16, device=self.device)
        if max_logits is None:
            max_logits = torch.empty(self.stat_shape, dtype=torch.float32, device=self.device)
        if lse is None:
            lse = torch.empty(self.stat_shape, dtype=torch.float32, device=self.device)
        values = [q.data_ptr(), kv.data_ptr(), indices.data_ptr(),
                  0 if topk_length is None else topk_length.data_ptr(),
                  0 if attn_sink is None else attn_sink.data_ptr(),
                  out.data_ptr(), max_logits.data_ptr(), lse.data_ptr()]
        if self.kv_map_key is not None:
            values.append(_kv_map((values[1],) + self.kv_map_key))
        self.launch_plan.launch(current_stream(torch, self.device.index), values)
        return out, max_logits, lse


# (device, the call's class, specialisation, kernel argument, forced spec) -> (device, Selection):
# a dispatch.SelectionMemo, made on first use (dispatch imports the families).
_selected = None


def select(call: Call, kernel=None):
    """(device index, dispatch Selection) for a validated call; ``kernel`` is a spec name or a Variant."""
    import torch

    from ... import dispatch, knobs
    from ...variant import Variant

    global _selected
    device = call.q.device.index if call.q.device.index is not None else torch.cuda.current_device()
    if isinstance(kernel, Variant):
        # A pinned variant skips dispatch's filter; one compiled for another layout or format
        # would read the cache at the wrong offsets.
        wrong = {k: v for k, v in specialization(call).items() if kernel.get(k, "bf16" if k == "kv_format" else None) != v}
        if wrong:
            _fail("kernel", f"variant {kernel.symbol} is compiled for "
                            f"{ {k: kernel.get(k) for k in wrong} }, the call needs {wrong}")
        return _select(call, kernel, device)
    if _selected is None:
        _selected = dispatch.SelectionMemo()
    memo = (device, str(call.key), tuple(specialization(call).items()), kernel, knobs.FAMILY.raw())
    return _selected.get(memo, lambda: _select(call, kernel, device))


def _select(call: Call, kernel, device: int):
    from ... import dispatch
    from ...variant import Variant

    try:
        selection = dispatch.dispatcher().select(
            FAMILY.name, str(call.key), specialization(call), device,
            accepts=lambda spec: accepts(spec, call) and (kernel is not None or preferred(spec, call)),
            variant=kernel if isinstance(kernel, Variant) else None,
            only=kernel if isinstance(kernel, str) else None,
        )
    except NoDeviceError as exc:
        if call.kv_format == "bf16":
            raise
        targets = ", ".join(kv_format_targets(call.kv_format)) or "none"
        raise NoDeviceError(f"mla_sparse_prefill: kv_format {call.kv_format!r}: no kernel for this device and "
                            f"these inputs ({exc}); kernels reading it target: {targets}") from None
    return device, selection
