"""KV operands as data: how the rows of a latent KV cache are stored (``../shared/MLA.md`` sections 2
and 3), so that argument checking, specs, the resource model, rendering and references read one
description instead of a literal element size.

A :class:`KvFormat` describes one row: ``values`` leading values of ``value_dtype`` (bf16, or
fp8 e4m3 quantized with one scale per ``scale_block`` values), then the scales, then ``rope``
bf16 values kept unquantized. Its byte layout (``row_bytes``, offsets) follows from those fields.
A cache is contiguous rows or a pool of pages (row ``r`` = page ``r // page_size``, offset
``r % page_size``); the family's argument checking maps tensors onto that.

A format with ``page_scales`` keeps its scales out of the rows: a page of P tokens holds the P
rows (values, then rope: ``row_bytes`` each) first, then P scale rows of ``page_scales`` bytes,
and is padded to a multiple of ``page_align`` bytes (:meth:`KvFormat.page_bytes`). Row ``r``'s
scales are at ``page + P * row_bytes + (r % P) * page_scales``: the address depends on the page
size, so such a cache is always a pool of pages (:func:`page_pool`).

Formats, by the name a caller passes as ``kv_format``:

* ``bf16``: 576 (or 512) bf16 values per row, no scales (1152 B).
* ``fp8_v32``: DeepSeek-V3.2's cache, 656 B per token: 512 e4m3 values, 4 fp32 scales (one per
  128 values), 64 bf16 rope values.
* ``fp8_b64``, ``fp8_b32``: the same with a scale per 64 / 32 values (672 B, 704 B).
* ``fp8_b0``: 512 e4m3 values without scales (scale 1), then the rope (640 B).
* ``fp8_v4``: DeepSeek-V4's cache (FlashMLA's ``MODEL1_FP8Sparse``), d_qk 512, 584 B per token:
  448 e4m3 values and 64 bf16 rope values (576 B, the row), and per page after the rows, 7
  UE8M0 scales (``float8_e8m0fnu``: byte e is 2^(e - 127), 255 NaN; one per 64 values) and a pad
  byte per token; pages padded to a multiple of 576 B (64 tokens: 37440 B).

Dequantization (what the FP8 kernels load, and what :func:`dequantize` returns) is
``float32(e4m3) * scale`` in fp32 (for UE8M0 scales exact, so also FlashMLA's bf16 product); the ``bf16`` compute mode of a kernel then rounds that to bf16
(round to nearest even) in shared memory. :func:`dequantize` gives either form.

Layering: this module imports nothing from mlagen; torch is imported inside the functions that
take tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

E4M3_MAX = 448.0   # largest finite OCP e4m3 (torch.float8_e4m3fn) value


@dataclass(frozen=True)
class KvFormat:
    """One row layout of a latent KV cache (see the module docstring)."""

    name: str
    value_dtype: str     # "bf16" or "fp8_e4m3" (OCP e4m3fn)
    values: int          # leading values of value_dtype (the latent part; all of d_qk for bf16)
    scale_block: int     # values per scale; 0: no scales
    rope: int            # bf16 values after the scales (0 when the row is all bf16)
    scale_dtype: str = "fp32"   # "fp32", or "ue8m0" (one exponent byte, float8_e8m0fnu)
    page_scales: int = 0        # 0: scales inside each row; else bytes per token of a page's scale rows
    page_align: int = 1         # a page's bytes are padded to a multiple of this

    @property
    def quantized(self) -> bool:
        return self.value_dtype != "bf16"

    @property
    def value_bytes(self) -> int:
        return 2 if self.value_dtype == "bf16" else 1

    @property
    def scales(self) -> int:
        """Scales per row."""
        return self.values // self.scale_block if self.scale_block else 0

    @property
    def scale_bytes(self) -> int:
        return 4 if self.scale_dtype == "fp32" else 1

    @property
    def scale_offset(self) -> int:
        """Where the scales start in the row (in the token's scale row for ``page_scales``: 0)."""
        return 0 if self.page_scales else self.values * self.value_bytes

    @property
    def rope_offset(self) -> int:
        if self.page_scales:
            return self.values * self.value_bytes
        return self.scale_offset + self.scale_bytes * self.scales

    @property
    def row_bytes(self) -> int:
        """Bytes of a row (for ``page_scales`` the stride of a page's rows, scales not counted)."""
        return self.rope_offset + 2 * self.rope

    @property
    def token_bytes(self) -> int:
        """Bytes a token takes in the cache, its scales included (584 for ``fp8_v4``)."""
        return self.row_bytes + self.page_scales

    def page_bytes(self, page_size: int) -> int:
        """Bytes of a page of ``page_size`` tokens, padding included."""
        return -(-page_size * self.token_bytes // self.page_align) * self.page_align

    def page_size_of(self, page_bytes: int) -> int | None:
        """The page size whose pages are ``page_bytes`` long (page_bytes grows strictly with the
        page size, so there is at most one), or None."""
        p = max(1, page_bytes // self.token_bytes)
        while self.page_bytes(p) < page_bytes:
            p += 1
        while p > 1 and self.page_bytes(p - 1) >= page_bytes:
            p -= 1
        return p if self.page_bytes(p) == page_bytes else None

    @property
    def d_qk(self) -> int:
        """The key width a row holds once dequantized (what q's last dimension must be)."""
        return self.values + self.rope

    @property
    def storage(self) -> str:
        """The torch dtype name of the tensor that holds the cache."""
        return "bfloat16" if self.value_dtype == "bf16" else "uint8"

    @property
    def elem_bytes(self) -> int:
        """Bytes per element of that tensor (strides are counted in these)."""
        return 2 if self.storage == "bfloat16" else 1

    @property
    def row_elems(self) -> int:
        """Elements of the storage dtype per row (the cache tensor's last dimension)."""
        return self.row_bytes // self.elem_bytes

    @property
    def c_pointer(self) -> str:
        """The kernel parameter type of the cache pointer (an abi field type)."""
        return "const bf16*" if self.value_dtype == "bf16" else "const u8*"


def _fp8(name: str, scale_block: int) -> KvFormat:
    return KvFormat(name, "fp8_e4m3", 512, scale_block, 64)


#: DeepSeek-V4's cache (FlashMLA's MODEL1_FP8Sparse; its tests/quant.py).
FP8_V4 = KvFormat("fp8_v4", "fp8_e4m3", 448, 64, 64, scale_dtype="ue8m0", page_scales=8, page_align=576)

#: Quantized formats by name. ``bf16`` is described per d_qk by :func:`get`.
FORMATS: dict[str, KvFormat] = {f.name: f for f in (
    _fp8("fp8_v32", 128), _fp8("fp8_b64", 64), _fp8("fp8_b32", 32), _fp8("fp8_b0", 0), FP8_V4,
)}
NAMES = ("bf16",) + tuple(FORMATS)


_BF16: dict[int, KvFormat] = {}


def get(name: str, d_qk: int = 576) -> KvFormat:
    """The format called ``name`` (``bf16`` with ``d_qk`` values per row); ValueError naming
    kv_format and the known names otherwise."""
    if name == "bf16":
        fmt = _BF16.get(d_qk)   # one object per width: every call of the sparse op asks
        if fmt is None:
            fmt = _BF16[d_qk] = KvFormat("bf16", "bf16", d_qk, 0, 0)
        return fmt
    if not isinstance(name, str) or name not in FORMATS:
        raise ValueError(f"kv_format: {name!r} is not one of {list(NAMES)}")
    return FORMATS[name]


def for_scale_block(scale_block: int) -> KvFormat:
    """The fp8 format with one fp32 scale per ``scale_block`` values in its rows (128: ``fp8_v32``;
    0: none)."""
    for f in FORMATS.values():
        if f.scale_block == scale_block and not f.page_scales:
            return f
    raise ValueError(f"scale_block: {scale_block!r} is not one of "
                     f"{[f.scale_block for f in FORMATS.values() if not f.page_scales]}")


# --- pools of pages with their scales after the rows (page_scales) ---------------------------


def page_pool(shape: tuple, strides: tuple, fmt: KvFormat, address: int | None = None) -> tuple[int, int, int]:
    """(rows, page size, page stride in bytes) of a ``page_scales`` cache tensor of this shape and
    these strides (uint8 elements), or ValueError saying what is allowed (one line; the caller names
    the argument). The forms: ``[num_blocks, page_bytes]`` (the page size follows from page_bytes,
    :meth:`KvFormat.page_bytes`), or FlashMLA's views of those pages, ``[num_blocks, page_size,
    token_bytes]`` and ``[num_blocks, page_size, 1, token_bytes]`` (token stride token_bytes,
    what its ``quantize_k_cache`` returns). Pages must be 16-byte aligned (base and stride)."""
    shape, strides = tuple(shape), tuple(strides)
    example = f"pages of 64 tokens take {fmt.page_bytes(64)} bytes"
    if len(shape) == 2:
        page_size = fmt.page_size_of(shape[1])
        if page_size is None:
            raise ValueError(f"a {fmt.name} pool [num_blocks, page_bytes] must have page_bytes = "
                             f"ceil(page_size * {fmt.token_bytes} / {fmt.page_align}) * {fmt.page_align} "
                             f"({example}), got {shape[1]}")
        used = shape[1]
    elif len(shape) in (3, 4):
        if len(shape) == 4 and shape[2] != 1:
            raise ValueError(f"a 4-D {fmt.name} cache must be [num_blocks, page_size, 1, {fmt.token_bytes}], "
                             f"got {shape}")
        if shape[-1] != fmt.token_bytes:
            raise ValueError(f"last dimension must be {fmt.token_bytes} (a {fmt.name} token: {fmt.values} e4m3, "
                             f"{fmt.rope} bf16, {fmt.scales} {fmt.scale_dtype} scales and padding), got {shape[-1]}")
        page_size = shape[1]
        if page_size < 1:
            raise ValueError(f"needs at least one token a page, got {shape}")
        if page_size > 1 and strides[1] != fmt.token_bytes:
            raise ValueError(f"a [num_blocks, page_size, ..., {fmt.token_bytes}] {fmt.name} cache is a view of "
                             f"[num_blocks, page_bytes] pages (token stride {fmt.token_bytes}), got strides {strides}")
        used = page_size * fmt.token_bytes
    else:
        raise ValueError(f"a {fmt.name} cache is [num_blocks, page_bytes] ({example}) or "
                         f"[num_blocks, page_size, (1,) {fmt.token_bytes}], got {len(shape)} dimensions")
    if page_size * fmt.token_bytes >= 2**31:
        raise ValueError(f"pages of {page_size} tokens are over 2 GiB; the kernels address a page with 32 bits")
    blocks = shape[0]
    page_stride = strides[0] if blocks > 1 else fmt.page_bytes(page_size)
    if blocks > 1 and page_stride < used:
        raise ValueError(f"pages overlap: page stride {page_stride} bytes < the {used} bytes of a page")
    if page_stride % 16 or (address is not None and blocks and address % 16):
        raise ValueError(f"a {fmt.name} pool's base address and page stride must be multiples of 16 bytes "
                         f"(page stride {page_stride}, address {address})")
    return blocks * page_size, page_size, page_stride


def _pages(cache, fmt: KvFormat):
    """(pages [num_blocks, page_size * token_bytes] uint8 view, page size) of a ``page_scales``
    cache in any form :func:`page_pool` takes."""
    blocks = cache.shape[0]
    try:
        _, page_size, stride = page_pool(tuple(cache.shape), tuple(cache.stride()), fmt)
    except ValueError as exc:
        raise ValueError(f"kv: {exc}") from None
    return cache.as_strided((blocks, page_size * fmt.token_bytes), (stride, 1)), page_size


def _ue8m0_to_f32(torch, e):
    """UE8M0 bytes as fp32: 2^(e - 127) (2^-127 is an fp32 subnormal, exact), NaN for 255."""
    s = torch.pow(2.0, e.double() - 127).float()
    return torch.where(e == 255, torch.full_like(s, float("nan")), s)


# --- host helpers on tensors -------------------------------------------------------------------


def dequantize(cache, fmt: KvFormat, *, round_bf16: bool = False):
    """Rows of a quantized cache as ``[N, d_qk]`` float32: ``float32(e4m3) * scale`` per value
    (fp32 product), rope as stored. With ``round_bf16`` the result is rounded to bf16 (round to
    nearest even) and returned as bf16: exactly what the ``bf16`` compute mode holds in shared
    memory. ``cache``: uint8 (or float8_e4m3fn) ``[..., row_bytes]`` (any leading shape), or for a
    ``page_scales`` format any form :func:`page_pool` takes (rows ``block * page_size + offset``)."""
    import torch

    if cache.dtype == torch.float8_e4m3fn:
        cache = cache.view(torch.uint8)   # the same bytes (FlashMLA's quantize_k_cache types them so)
    if fmt.page_scales:
        pages, ps = _pages(cache, fmt)
        blocks = pages.shape[0]
        rows = pages[:, :ps * fmt.row_bytes].reshape(blocks * ps, fmt.row_bytes)
        exps = pages[:, ps * fmt.row_bytes:].reshape(blocks * ps, fmt.page_scales)[:, :fmt.scales]
        scales = _ue8m0_to_f32(torch, exps)
    else:
        rows = cache.reshape(-1, cache.shape[-1])
        if rows.shape[-1] != fmt.row_bytes:
            raise ValueError(f"kv: last dimension must be {fmt.row_bytes} bytes for {fmt.name}, got {rows.shape[-1]}")
        scales = rows[:, fmt.scale_offset:fmt.rope_offset].contiguous().view(torch.float32) if fmt.scales else None
    vals = rows[:, :fmt.values].contiguous().view(torch.float8_e4m3fn).float()
    if fmt.scales:
        vals = vals * scales.repeat_interleave(fmt.scale_block, dim=1)
    rope = rows[:, fmt.rope_offset:fmt.row_bytes].contiguous().view(torch.bfloat16)
    if round_bf16:
        return torch.cat([vals.to(torch.bfloat16), rope], dim=1)
    return torch.cat([vals, rope.float()], dim=1)


#: How ``quantize`` picks a block's scale: "fp32" amax / 448; "ue8m0" the power of two at or above
#: it (DeepSeek-V3.2's quantizer: its scales are UE8M0-representable).
SCALE_FORMATS = ("fp32", "ue8m0")

#: The smallest scale a UE8M0 format's quantizer picks before rounding up (FlashMLA's
#: quantize_k_cache: 1e-4, so a block with amax below 448e-4 gets the scale 2^-13).
UE8M0_SCALE_FLOOR = 1e-4


def _pow2_at_or_above(torch, x):
    """The exponent k of the least power of two >= x (x > 0, float32), exactly (frexp)."""
    m, e = torch.frexp(x)
    return torch.where(m == 0.5, e - 1, e)


def quantize(rows, fmt: KvFormat, *, scales=None, scale_fmt: str = "fp32", page_size: int | None = None):
    """Rows ``[N, d_qk]`` (float) into a uint8 ``[N, row_bytes]`` cache of ``fmt``: per scale
    block, scale = amax / 448 (``scale_fmt="ue8m0"``: rounded up to a power of two; 1 where the
    block is all zero) unless ``scales`` ``[N, n_scales]`` fp32 is given; values = e4m3(v / scale)
    (saturating); rope rounded to bf16.

    A ``page_scales`` format (``fp8_v4``) is written as its pool, ``[ceil(N / page_size),
    page_bytes]`` uint8 (row r at block r // page_size, offset r % page_size; the last page's
    unused tokens and every pad byte zero), ``page_size`` required, scales always UE8M0:
    2^ceil(log2(max(amax / 448, 1e-4))) as FlashMLA's quantizer picks them, unless ``scales``
    (powers of two) are given."""
    import torch

    if fmt.page_scales:
        return _quantize_pages(torch, rows, fmt, page_size, scales)
    if page_size is not None:
        raise ValueError(f"page_size: {fmt.name} rows hold their scales; reshape the [N, {fmt.row_bytes}] "
                         "result into pages instead")
    if scale_fmt not in SCALE_FORMATS:
        raise ValueError(f"scale_fmt: expected one of {', '.join(SCALE_FORMATS)}, got {scale_fmt!r}")

    n = rows.shape[0]
    lat = rows[:, :fmt.values].float()
    out = torch.empty((n, fmt.row_bytes), dtype=torch.uint8, device=rows.device)
    if fmt.scales:
        blocks = lat.view(n, fmt.scales, fmt.scale_block)
        if scales is None:
            amax = blocks.abs().amax(-1)
            scales = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
            if scale_fmt == "ue8m0":
                scales = torch.exp2(torch.ceil(torch.log2(scales)))
        scales = scales.float().reshape(n, fmt.scales).contiguous()
        q = (blocks / scales.unsqueeze(-1)).reshape(n, fmt.values)
        out[:, fmt.scale_offset:fmt.rope_offset] = scales.view(torch.uint8).view(n, 4 * fmt.scales)
    else:
        q = lat
    q = q.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    out[:, :fmt.values] = q.view(torch.uint8)
    rope = rows[:, fmt.values:fmt.values + fmt.rope].to(torch.bfloat16).contiguous()
    out[:, fmt.rope_offset:] = rope.view(torch.uint8).view(n, 2 * fmt.rope)
    return out


def _quantize_pages(torch, rows, fmt: KvFormat, page_size, scales):
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise ValueError(f"page_size: a {fmt.name} cache is a pool of pages; expected a positive int, got {page_size!r}")
    if rows.dim() != 2 or rows.shape[1] != fmt.d_qk:
        raise ValueError(f"rows: expected [N, {fmt.d_qk}] for {fmt.name}, got {tuple(rows.shape)}")
    n = rows.shape[0]
    blocks = -(-n // page_size)
    full = torch.zeros((blocks * page_size, fmt.d_qk), dtype=torch.float32, device=rows.device)
    full[:n] = rows.float()
    lat = full[:, :fmt.values].view(-1, fmt.scales, fmt.scale_block)
    if scales is None:
        amax = lat.abs().amax(-1)
        exps = _pow2_at_or_above(torch, torch.clamp_min(amax / E4M3_MAX, UE8M0_SCALE_FLOOR)) + 127
    else:
        s = torch.as_tensor(scales, dtype=torch.float32, device=rows.device).reshape(n, fmt.scales)
        m, e = torch.frexp(s)
        exps = e - 1 + 127
        if not bool(((m == 0.5) & (exps >= 0) & (exps <= 254)).all()):
            raise ValueError(f"scales: {fmt.name} scales are powers of two from 2^-127 to 2^127")
        exps = torch.cat([exps, exps.new_zeros((blocks * page_size - n, fmt.scales))])
    exps = exps.to(torch.uint8)
    exps[n:] = 0   # the last page's unused tokens: all zero, scales included
    q = (lat / _ue8m0_to_f32(torch, exps).unsqueeze(-1)).reshape(-1, fmt.values)
    q = q.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    out = torch.zeros((blocks, fmt.page_bytes(page_size)), dtype=torch.uint8, device=rows.device)
    body = out[:, :page_size * fmt.row_bytes].view(blocks, page_size, fmt.row_bytes)
    body[..., :fmt.values] = q.view(blocks, page_size, fmt.values)
    rope = full[:, fmt.values:].to(torch.bfloat16).view(torch.uint8)
    body[..., fmt.rope_offset:] = rope.view(blocks, page_size, 2 * fmt.rope)
    tail = out[:, page_size * fmt.row_bytes:page_size * fmt.token_bytes].view(blocks, page_size, fmt.page_scales)
    tail[..., :fmt.scales] = exps.view(blocks, page_size, fmt.scales)
    return out


def quantize_pages(rows, fmt: KvFormat, page_size: int = 64, **kw):
    """Rows ``[N, d_qk]`` as a pool of pages of ``page_size`` tokens in the form the kernels take:
    ``[num_blocks, page_size, row_bytes]`` for a format with scales in its rows (N padded with zero
    rows), ``[num_blocks, page_bytes]`` for a ``page_scales`` one. ``kw``: :func:`quantize`'s."""
    import torch

    if fmt.page_scales:
        return quantize(rows, fmt, page_size=page_size, **kw)
    blocks = -(-rows.shape[0] // page_size)
    full = torch.zeros((blocks * page_size, rows.shape[1]), dtype=rows.dtype, device=rows.device)
    full[:rows.shape[0]] = rows
    return quantize(full, fmt, **kw).view(blocks, page_size, fmt.row_bytes)
