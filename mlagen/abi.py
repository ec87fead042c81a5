"""Kernel parameter structs described once, rendered to C and packed from Python.

Every kernel takes one struct by value (``const __grid_constant__ Params p``). The struct's
fields are declared here as data; the template renders the C declaration (with ``static_assert``s
on its size and alignment) and the launcher packs the same layout into bytes, so the two sides
are generated from one description instead of being kept in step by hand.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from dataclasses import dataclass

# kind: (C type, size, alignment, struct format or None for raw bytes)
_KINDS = {
    "const bf16*": ("const mlagen::u16*", 8, 8, "Q"),
    "bf16*": ("mlagen::u16*", 8, 8, "Q"),
    "const u8*": ("const mlagen::u8*", 8, 8, "Q"),
    "u8*": ("mlagen::u8*", 8, 8, "Q"),
    "float*": ("float*", 8, 8, "Q"),
    "const int*": ("const int*", 8, 8, "Q"),
    "int*": ("int*", 8, 8, "Q"),
    "i64": ("mlagen::i64", 8, 8, "q"),
    "int": ("int", 4, 4, "i"),
    "float": ("float", 4, 4, "f"),
    "tensormap": ("mlagen::TensorMap", 128, 64, None),
}


@dataclass(frozen=True)
class Field:
    name: str
    kind: str


@dataclass(frozen=True)
class ParamStruct:
    name: str
    fields: tuple[Field, ...]

    def __post_init__(self):
        for f in self.fields:
            if f.kind not in _KINDS:
                raise ValueError(f"field {f.name}: unknown kind {f.kind!r}; known: {', '.join(_KINDS)}")

    @functools.cached_property
    def layout(self) -> list[tuple[Field, int]]:
        """(field, byte offset) with C's natural alignment rules."""
        out, offset = [], 0
        for f in self.fields:
            _, size, align, _ = _KINDS[f.kind]
            offset = (offset + align - 1) // align * align
            out.append((f, offset))
            offset += size
        return out

    @functools.cached_property
    def alignment(self) -> int:
        return max(_KINDS[f.kind][2] for f in self.fields)

    @functools.cached_property
    def size(self) -> int:
        f, offset = self.layout[-1]
        end = offset + _KINDS[f.kind][1]
        return (end + self.alignment - 1) // self.alignment * self.alignment

    @functools.cached_property
    def _packer(self) -> tuple[struct.Struct, tuple[str, ...], frozenset, tuple[str, ...]]:
        """The whole struct as one struct.Struct (padding as pad bytes, tensor maps as 128s), the
        field names in order, their set, and the raw-bytes fields (whose length pack checks, as
        ``s`` codes would silently pad or cut). Launches pack on every call: one pack_into."""
        fmt, end = ["<"], 0
        for f, offset in self.layout:
            if offset > end:
                fmt.append(f"{offset - end}x")
            code, size = _KINDS[f.kind][3], _KINDS[f.kind][1]
            fmt.append(code if code is not None else f"{size}s")
            end = offset + size
        if self.size > end:
            fmt.append(f"{self.size - end}x")
        names = tuple(f.name for f in self.fields)
        raw = tuple(f.name for f in self.fields if _KINDS[f.kind][3] is None)
        return struct.Struct("".join(fmt)), names, frozenset(names), raw

    def c_declaration(self) -> str:
        lines = [f"struct {self.name} {{"]
        for f in self.fields:
            lines.append(f"  {_KINDS[f.kind][0]} {f.name};")
        lines.append("};")
        # NVRTC has no offsetof; size and alignment are checked here, and the offsets are
        # checked against the host C ABI in the tests (tests/test_abi.py).
        lines.append(
            f'static_assert(sizeof({self.name}) == {self.size}, '
            f'"{self.name} must be {self.size} bytes, as the launcher packs it");'
        )
        lines.append(
            f'static_assert(alignof({self.name}) == {self.alignment}, '
            f'"{self.name} must be {self.alignment}-byte aligned, as the launcher packs it");'
        )
        return "\n".join(lines)

    def pack(self, values: dict) -> "PackedParams":
        """Pack field values (ints for pointers, bytes for tensor maps) into a launch buffer."""
        packer, names, name_set, raw = self._packer
        if values.keys() != name_set:
            missing = [n for n in names if n not in values]
            raise ValueError(f"{self.name}: missing {missing}, unexpected {sorted(set(values) - name_set)}")
        for name in raw:
            if len(values[name]) != 128:
                raise ValueError(f"{self.name}.{name}: expected 128 bytes, got {len(values[name])}")
        buf = PackedParams(self.size)
        try:
            packer.pack_into(buf.data, 0, *[values[n] for n in names])
        except struct.error as exc:  # name the field
            bad = next((f.name for f in self.fields if _KINDS[f.kind][3] is not None
                        and not _packs(_KINDS[f.kind][3], values[f.name])), "?")
            raise struct.error(f"{self.name}.{bad}: {exc} (value {values.get(bad)!r})") from exc
        return buf


def _packs(code: str, value) -> bool:
    try:
        struct.pack("<" + code, value)
        return True
    except struct.error:
        return False


class PackedParams:
    """A parameter buffer plus the one-element ``void*[]`` that cuLaunchKernel reads it through."""

    def __init__(self, size: int):
        # Over-allocate so the struct can start on a 64-byte boundary, as the device expects
        # for tensor maps (the driver copies it into the parameter space).
        self._raw = (ctypes.c_uint8 * (size + 64))()
        base = ctypes.addressof(self._raw)
        self._offset = (-base) % 64
        self.data = memoryview(self._raw).cast("B")[self._offset:self._offset + size]
        self._argv = (ctypes.c_void_p * 1)(base + self._offset)

    @property
    def kernel_params(self) -> int:
        """Address of the ``void*[1]`` array to hand to cuLaunchKernel."""
        return ctypes.addressof(self._argv)
