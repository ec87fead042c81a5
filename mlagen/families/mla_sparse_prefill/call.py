"""Argument checking of sparse MLA prefill: torch tensors in, a validated :class:`Call` out. Reads
no device values, so it never synchronises the host and can run inside CUDA graph capture."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ... import operands
from ...errors import ArgumentError, ArgumentTypeError
from .. import kit
from .problem import BLOCK_H, D_QK_VALUES, D_V, MAX_ROWS, ProblemKey, problem_key

OP = "mla_sparse_prefill"


def _fail(arg: str, message: str, kind=ArgumentError):
    kit.fail(OP, arg, message, kind)


def _check_tensor(torch, t, arg: str, dtype, ndims: tuple, device=None):
    kit.check_tensor(torch, t, OP, arg, dtype, ndims, device, last_contiguous=True)


def check_compute(compute) -> str:
    """``compute`` of a call: only "bf16" (the default: an FP8 cache is read as bf16, dequantized
    in the kernel or staged first). The fp8 compute mode (FP8 tensor cores on the e4m3 values) was
    removed on 2026-12-01: it measured 0.77-0.93x the default call on the same cache, and less
    accurate (docs/notes-sparse.md)."""
    if not isinstance(compute, str):
        _fail("compute", f"expected the string 'bf16', got {compute!r}", ArgumentTypeError)
    if compute == "fp8":
        _fail("compute", "the fp8 compute mode was removed (slower and less accurate than the default); the "
                         "default call, compute='bf16', reads FP8 caches (kv_format fp8_*) dequantized to bf16")
    if compute != "bf16":
        _fail("compute", f"{compute!r}: the only compute mode is 'bf16'")
    return compute


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
    extra: "Pool | None" = None   # the second pool of one softmax (MLA.md 2b), None without one

    @property
    def key(self) -> ProblemKey:
        return problem_key(self)

    @property
    def keys(self) -> int:
        """Key positions per query over both pools (what the kernel's work scales with)."""
        return self.topk + (self.extra.topk if self.extra is not None else 0)

    @property
    def empty(self) -> bool:
        """Nothing to launch: no rows, or no row can see a key."""
        first = self.topk == 0 or self.num_kv == 0
        return self.sq == 0 or first and (self.extra is None or self.extra.empty)


@dataclass
class Pool:
    """The second KV pool of a call (``extra_kv`` / ``extra_indices`` / ``extra_topk_length``):
    its key positions follow the first pool's in one softmax. Fields as :class:`Call`'s."""

    kv: Any
    indices: Any      # [Sq, topk] view
    topk_length: Any  # [Sq] int32 or None
    topk: int
    num_kv: int
    kv_row_stride: int
    kv_page_stride: int
    page_size: int
    kv_format: str = "bf16"

    @property
    def empty(self) -> bool:
        return self.topk == 0 or self.num_kv == 0


def kv_format_of(kv_format, d_qk: int = 576) -> operands.KvFormat:
    """The operand description of ``kv_format`` (ValueError / TypeError naming kv_format)."""
    if not isinstance(kv_format, str):
        _fail("kv_format", f"expected a string, one of {list(operands.NAMES)}, got {kv_format!r}", ArgumentTypeError)
    if kv_format not in operands.NAMES:
        _fail("kv_format", f"{kv_format!r} is not one of {list(operands.NAMES)}")
    return operands.get(kv_format, d_qk)


def kv_layout(kv, fmt: operands.KvFormat, device=None, arg: str = "kv"):
    """Check the cache tensor against its format and map it onto rows: returns (kv as the kernel
    reads it, N rows, page_size, row stride, page stride), strides in elements of kv (bytes for a
    quantized cache). page_size 0 means rows are one stride apart (a flat table, or pages back
    to back); otherwise row ``r`` is page ``r // page_size``, offset ``r % page_size``.

    bf16: [N, d], [N, 1, d] or [blocks, page, d]. Quantized: uint8 [N, row_bytes],
    [blocks, page, row_bytes] or [blocks, page, 1, row_bytes] (FlashMLA's decode cache); a format
    with scales after each page's rows (fp8_v4): uint8 [blocks, page_bytes] or FlashMLA's views
    [blocks, page, (1,) token_bytes] of it (operands.page_pool), row stride row_bytes."""
    import torch

    dtype = torch.uint8 if fmt.quantized else torch.bfloat16
    if fmt.quantized and isinstance(kv, torch.Tensor) and kv.dtype == torch.float8_e4m3fn:
        kv = kv.view(torch.uint8)   # the same bytes: FlashMLA's quantize_k_cache returns its cache typed so
    if isinstance(kv, torch.Tensor) and kv.dtype != dtype:
        _fail(arg, f"dtype must be {dtype} for kv_format {fmt.name!r}, got {kv.dtype}", ArgumentTypeError)
    _check_tensor(torch, kv, arg, dtype, (2, 3, 4) if fmt.quantized else (2, 3), device)
    if fmt.page_scales:   # scales after each page's rows: always paged (operands.page_pool)
        try:
            num_kv, page_size, page_stride = operands.page_pool(kv.shape, kv.stride(), fmt, kv.data_ptr())
        except ValueError as exc:
            _fail(arg, str(exc))
        return kv, num_kv, page_size, fmt.row_bytes, page_stride
    if kv.dim() == 4:
        if kv.shape[2] != 1:
            _fail(arg, f"a 4-D cache must be [num_blocks, page_size, 1, {fmt.row_elems}], got {tuple(kv.shape)}")
        kv = kv[:, :, 0]
    if kv.shape[-1] != fmt.row_elems:
        if not fmt.quantized:
            _fail(arg, f"last dimension must match q's d_qk {fmt.d_qk}, got {kv.shape[-1]}")
        _fail(arg, f"last dimension must be {fmt.row_elems} (kv_format {fmt.name!r} rows are {fmt.row_bytes} bytes ("
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


def _index_rows(torch, indices, arg: str, sq: int, device):
    """indices as [Sq, topk] (from [Sq, topk] or FlashMLA's [Sq, 1, topk])."""
    _check_tensor(torch, indices, arg, torch.int32, (2, 3), device)
    if indices.dim() == 3:
        if indices.shape[1] != 1:
            _fail(arg, f"expected [Sq, topk] or [Sq, 1, topk], got {tuple(indices.shape)}")
        indices = indices[:, 0, :]
    if indices.shape[0] != sq:
        _fail(arg, f"has {indices.shape[0]} rows, q has {sq} query tokens")
    return indices


def _lengths(torch, topk_length, arg: str, sq: int, device):
    if topk_length is not None:
        _check_tensor(torch, topk_length, arg, torch.int32, (1,), device)
        if topk_length.shape[0] != sq:
            _fail(arg, f"expected shape ({sq},), got {tuple(topk_length.shape)}")
    return topk_length


def _extra_pool(torch, extra_kv, extra_indices, extra_topk_length, extra_kv_format, kv_format, d_qk, sq, device,
                num_kv):
    """The second pool of a call, checked (errors name the extra_* argument), or None."""
    if extra_kv is None and extra_indices is None:
        if extra_topk_length is not None:
            _fail("extra_topk_length", "given without extra_kv / extra_indices")
        return None
    if extra_kv is None or extra_indices is None:
        _fail("extra_kv" if extra_kv is None else "extra_indices", "extra_kv and extra_indices come together (the "
              "second pool and its index lists)")
    if extra_kv_format is None:
        extra_kv_format = kv_format
    if not isinstance(extra_kv_format, str) or extra_kv_format not in operands.NAMES:
        _fail("extra_kv_format", f"{extra_kv_format!r} is not one of {list(operands.NAMES)}",
              ArgumentTypeError if not isinstance(extra_kv_format, str) else ArgumentError)
    fmt = operands.get(extra_kv_format, d_qk)
    if fmt.d_qk != d_qk:
        _fail("extra_kv_format", f"{fmt.name!r} rows hold d_qk {fmt.d_qk}, q has {d_qk}")
    kv, n, page_size, row_stride, page_stride = kv_layout(extra_kv, fmt, device, "extra_kv")
    if num_kv + n > MAX_ROWS:
        _fail("extra_kv", f"the two pools hold {num_kv} + {n} rows; at most 2**31 - 1 together")
    indices = _index_rows(torch, extra_indices, "extra_indices", sq, device)
    topk_length = _lengths(torch, extra_topk_length, "extra_topk_length", sq, device)
    return Pool(kv, indices, topk_length, indices.shape[1], n, row_stride, page_stride, page_size, fmt.name)


def as_paged(num_kv: int, row_stride: int) -> tuple[int, int]:
    """(page_size, page_stride) of a flat pool read by a paged kernel: one page of all its rows."""
    rows = max(num_kv, 1)
    return rows, rows * row_stride


def prepare(q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, d_v=D_V, out=None,
            max_logits=None, lse=None, kv_format="bf16", compute="bf16", extra_kv=None, extra_indices=None,
            extra_topk_length=None, extra_kv_format=None) -> Call:
    """Validate the arguments (errors name the argument) and allocate the outputs. Reads no
    device values, so it never synchronises the host and can run inside CUDA graph capture."""
    import torch

    kv_format_of(kv_format)
    check_compute(compute)
    if not isinstance(q, torch.Tensor):
        _fail("q", f"expected a torch.Tensor, got {type(q).__name__}", ArgumentTypeError)
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

    indices = _index_rows(torch, indices, "indices", sq, device)
    topk = indices.shape[1]
    topk_length = _lengths(torch, topk_length, "topk_length", sq, device)
    num_kv = min(num_kv, MAX_ROWS)
    extra = _extra_pool(torch, extra_kv, extra_indices, extra_topk_length, extra_kv_format, fmt.name, d_qk, sq,
                        device, num_kv)
    if extra is not None and (page_size > 0) != (extra.page_size > 0):
        # One kernel reads both: a flat pool in the paged kernel is one page of all its rows.
        if page_size == 0:
            page_size, page_stride = as_paged(num_kv, row_stride)
        else:
            extra.page_size, extra.kv_page_stride = as_paged(extra.num_kv, extra.kv_row_stride)
    if attn_sink is not None:
        _check_tensor(torch, attn_sink, "attn_sink", torch.float32, (1,), device)
        if attn_sink.shape[0] != heads:
            _fail("attn_sink", f"expected shape ({heads},) (one per head), got {tuple(attn_sink.shape)}")

    if isinstance(softmax_scale, bool):
        _fail("softmax_scale", f"expected a float, got {softmax_scale!r}", ArgumentTypeError)
    try:
        scale = float(softmax_scale)
    except (TypeError, ValueError):
        _fail("softmax_scale", f"expected a float, got {softmax_scale!r}", ArgumentTypeError)
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
        # The sm90 kernels store O in 16-byte vectors (8 bf16 values) at row and head starts.
        if out.data_ptr() % 16 or any(out.stride(d) % 8 for d in range(2) if out.size(d) > 1):
            _fail("out", f"base address and row/head strides must be multiples of 16 bytes (8 values); got "
                         f"address % 16 = {out.data_ptr() % 16}, strides {tuple(out.stride())[:2]} values")
    for name, t in (("max_logits", max_logits), ("lse", lse)):
        if t is not None:
            _check_tensor(torch, t, name, torch.float32, (2,), device)
            if tuple(t.shape) != (sq, heads):
                _fail(name, f"expected shape ({sq}, {heads}), got {tuple(t.shape)}")
    if max_logits is None:
        max_logits = torch.empty((sq, heads), dtype=torch.float32, device=device)
    if lse is None:
        lse = torch.empty((sq, heads), dtype=torch.float32, device=device)

    q = kit.aligned_or_copy(q)
    return Call(q, kv, indices, topk_length, attn_sink, out, max_logits, lse, sq, heads, topk, d_qk,
                num_kv, row_stride, page_stride, page_size, scale, fmt.name, extra)


def fill_empty(call: Call) -> None:
    """Outputs of a call in which no row sees a key: out 0, max_logits -inf, lse +inf."""
    call.out.zero_()
    call.max_logits.fill_(-math.inf)
    call.lse.fill_(math.inf)

