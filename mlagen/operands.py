"""KV operands as data: how the rows of a latent KV cache are stored (``../shared/MLA.md`` sections 2
and 3), so that argument checking, specs, the resource model, rendering and references read one
description instead of a literal element size.

A :class:`KvFormat` describes one row: ``values`` leading values of ``value_dtype`` (bf16, or
fp8 e4m3 quantized with one fp32 scale per ``scale_block`` values), then the scales, then
``rope`` bf16 values kept unquantized. Its byte layout (``row_bytes``, offsets) follows from those
fields. A cache is contiguous rows or a pool of pages (row ``r`` = page ``r // page_size``,
offset ``r % page_size``); the family's argument checking maps tensors onto that.

Formats, by the name a caller passes as ``kv_format``:

* ``bf16``: 576 (or 512) bf16 values per row, no scales (1152 B).
* ``fp8_v32``: DeepSeek-V3.2's cache, 656 B per token: 512 e4m3 values, 4 fp32 scales (one per
  128 values), 64 bf16 rope values.
* ``fp8_b64``, ``fp8_b32``: the same with a scale per 64 / 32 values (672 B, 704 B).
* ``fp8_b0``: 512 e4m3 values without scales (scale 1), then the rope (640 B).

Dequantization (what the FP8 kernels load, and what :func:`dequantize` returns) is
``float32(e4m3) * scale`` in fp32; the ``bf16`` compute mode of a kernel then rounds that to bf16
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
    scale_block: int     # values per fp32 scale; 0: no scales
    rope: int            # bf16 values after the scales (0 when the row is all bf16)

    @property
    def quantized(self) -> bool:
        return self.value_dtype != "bf16"

    @property
    def value_bytes(self) -> int:
        return 2 if self.value_dtype == "bf16" else 1

    @property
    def scales(self) -> int:
        """fp32 scales per row."""
        return self.values // self.scale_block if self.scale_block else 0

    @property
    def scale_offset(self) -> int:
        return self.values * self.value_bytes

    @property
    def rope_offset(self) -> int:
        return self.scale_offset + 4 * self.scales

    @property
    def row_bytes(self) -> int:
        return self.rope_offset + 2 * self.rope

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


#: Quantized formats by name. ``bf16`` is described per d_qk by :func:`get`.
FORMATS: dict[str, KvFormat] = {f.name: f for f in (
    _fp8("fp8_v32", 128), _fp8("fp8_b64", 64), _fp8("fp8_b32", 32), _fp8("fp8_b0", 0),
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
    """The fp8 format with one scale per ``scale_block`` values (128: ``fp8_v32``; 0: none)."""
    for f in FORMATS.values():
        if f.scale_block == scale_block:
            return f
    raise ValueError(f"scale_block: {scale_block!r} is not one of {[f.scale_block for f in FORMATS.values()]}")


# --- host helpers on tensors -------------------------------------------------------------------


def dequantize(cache, fmt: KvFormat, *, round_bf16: bool = False):
    """Rows of a quantized cache (uint8 ``[..., row_bytes]``, any leading shape) as ``[N, d_qk]``
    float32: ``float32(e4m3) * scale`` per value (fp32 product), rope as stored. With
    ``round_bf16`` the result is rounded to bf16 (round to nearest even) and returned as bf16:
    exactly what the ``bf16`` compute mode holds in shared memory."""
    import torch

    rows = cache.reshape(-1, cache.shape[-1])
    if rows.shape[-1] != fmt.row_bytes:
        raise ValueError(f"kv: last dimension must be {fmt.row_bytes} bytes for {fmt.name}, got {rows.shape[-1]}")
    vals = rows[:, :fmt.values].contiguous().view(torch.float8_e4m3fn).float()
    if fmt.scales:
        scales = rows[:, fmt.scale_offset:fmt.rope_offset].contiguous().view(torch.float32)
        vals = vals * scales.repeat_interleave(fmt.scale_block, dim=1)
    rope = rows[:, fmt.rope_offset:fmt.row_bytes].contiguous().view(torch.bfloat16)
    if round_bf16:
        return torch.cat([vals.to(torch.bfloat16), rope], dim=1)
    return torch.cat([vals, rope.float()], dim=1)


#: How ``quantize`` picks a block's scale: "fp32" amax / 448; "ue8m0" the power of two at or above
#: it (DeepSeek-V3.2's quantizer: its scales are UE8M0-representable).
SCALE_FORMATS = ("fp32", "ue8m0")


def quantize(rows, fmt: KvFormat, *, scales=None, scale_fmt: str = "fp32"):
    """Rows ``[N, d_qk]`` (float) into a uint8 ``[N, row_bytes]`` cache of ``fmt``: per scale
    block, scale = amax / 448 (``scale_fmt="ue8m0"``: rounded up to a power of two; 1 where the
    block is all zero) unless ``scales`` ``[N, n_scales]`` fp32 is given; values = e4m3(v / scale)
    (saturating); rope rounded to bf16."""
    import torch

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
