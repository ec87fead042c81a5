"""mlagen.abi: the parameter struct is laid out as the C compiler lays it out, and packed so."""

from __future__ import annotations

import ctypes
import struct

import pytest

from mlagen import abi
from mlagen.families.mla_prefill.params import SIMT_PARAMS, TMA_PARAMS

CTYPE = {
    "const bf16*": ctypes.c_void_p, "bf16*": ctypes.c_void_p, "const u8*": ctypes.c_void_p,
    "float*": ctypes.c_void_p, "const int*": ctypes.c_void_p, "int*": ctypes.c_void_p,
    "i64": ctypes.c_int64, "int": ctypes.c_int32, "float": ctypes.c_float,
    "tensormap": ctypes.c_uint8 * 128,  # CUtensorMap: 128 bytes, 64-byte aligned (checked separately)
}
FMT = {"i64": "q", "int": "i", "float": "f", "tensormap": "128s"}


def as_ctypes(ps: abi.ParamStruct):
    return type(ps.name, (ctypes.Structure,), {"_fields_": [(f.name, CTYPE[f.kind]) for f in ps.fields]})


def test_simt_params_match_the_c_layout():
    c = as_ctypes(SIMT_PARAMS)
    assert [(f.name, off) for f, off in SIMT_PARAMS.layout] == [(name, getattr(c, name).offset)
                                                               for name, _ in c._fields_]
    assert SIMT_PARAMS.size == ctypes.sizeof(c)
    assert SIMT_PARAMS.alignment == ctypes.alignment(c) == 8


def test_tma_params_match_the_c_layout():
    c = as_ctypes(TMA_PARAMS)
    layout = dict((f.name, off) for f, off in TMA_PARAMS.layout)
    for name, _ in c._fields_:
        assert layout[name] == getattr(c, name).offset, name
    # The 64-byte alignment of CUtensorMap (which ctypes cannot express) pads the end.
    assert TMA_PARAMS.alignment == 64
    assert TMA_PARAMS.size == -(-ctypes.sizeof(c) // 64) * 64
    assert TMA_PARAMS.size % 64 == 0


def test_tensormaps_are_64_byte_aligned():
    maps = [(f, off) for f, off in TMA_PARAMS.layout if f.kind == "tensormap"]
    assert [f.name for f, _ in maps] == ["tma_q", "tma_k", "tma_k_rope", "tma_v", "tma_o"]
    assert all(off % 64 == 0 for _, off in maps)


def test_tensormap_after_a_scalar_is_padded_to_64():
    ps = abi.ParamStruct("P", (abi.Field("n", "int"), abi.Field("m", "tensormap"), abi.Field("x", "float")))
    assert [off for _, off in ps.layout] == [0, 64, 192]
    assert (ps.alignment, ps.size) == (64, 256)


def test_mixed_scalars_follow_natural_alignment():
    ps = abi.ParamStruct("P", (abi.Field("a", "int"), abi.Field("b", "i64"), abi.Field("c", "float"),
                               abi.Field("d", "int"), abi.Field("e", "float*"), abi.Field("f", "int")))
    c = as_ctypes(ps)
    assert [off for _, off in ps.layout] == [getattr(c, n).offset for n, _ in c._fields_] == [0, 8, 16, 20, 24, 32]
    assert ps.size == ctypes.sizeof(c) == 40


def test_unknown_kind():
    with pytest.raises(ValueError, match="field x: unknown kind 'double'"):
        abi.ParamStruct("P", (abi.Field("x", "double"),))


def test_c_declaration():
    text = SIMT_PARAMS.c_declaration()
    lines = text.splitlines()
    assert lines[0] == "struct Params {"
    assert lines[1] == "  const mlagen::u16* q;"
    assert "  mlagen::i64 q_row_stride;" in lines and "  float scale_log2;" in lines
    assert f'static_assert(sizeof(Params) == {SIMT_PARAMS.size}, "Params must be {SIMT_PARAMS.size} bytes, ' \
           f'as the launcher packs it");' in lines
    assert "  mlagen::TensorMap tma_q;" in TMA_PARAMS.c_declaration()
    assert "static_assert(alignof(Params) == 64," in TMA_PARAMS.c_declaration()


def _values(ps: abi.ParamStruct) -> dict:
    out = {}
    for i, f in enumerate(ps.fields):
        if f.kind == "tensormap":
            out[f.name] = bytes((i + j) % 256 for j in range(128))
        elif f.kind == "float":
            out[f.name] = 0.5 + i
        elif f.kind == "int":
            out[f.name] = -(i + 1)
        elif f.kind == "i64":
            out[f.name] = -(2**40) - i
        else:
            out[f.name] = 0x7F00_0000_0000 + 16 * i
    return out


@pytest.mark.parametrize("ps", [SIMT_PARAMS, TMA_PARAMS], ids=["simt", "tma"])
def test_pack_round_trips(ps):
    values = _values(ps)
    packed = ps.pack(values)
    assert len(packed.data) == ps.size
    for f, off in ps.layout:
        (got,) = struct.unpack_from("<" + FMT.get(f.kind, "Q"), packed.data, off)
        assert got == values[f.name], f.name


def test_pack_through_ctypes():
    values = _values(SIMT_PARAMS)
    packed = SIMT_PARAMS.pack(values)
    c = as_ctypes(SIMT_PARAMS).from_buffer_copy(bytes(packed.data))
    for f in SIMT_PARAMS.fields:
        assert getattr(c, f.name) == pytest.approx(values[f.name]), f.name


def test_padding_is_zero():
    ps = abi.ParamStruct("P", (abi.Field("n", "int"), abi.Field("p", "int*")))
    packed = ps.pack({"n": -1, "p": 2**63})
    assert bytes(packed.data) == b"\xff" * 4 + b"\0" * 4 + struct.pack("<Q", 2**63)


def test_pack_missing_and_extra_fields():
    values = _values(SIMT_PARAMS)
    del values["q"]
    values["bogus"] = 1
    with pytest.raises(ValueError, match=r"Params: missing \['q'\], unexpected \['bogus'\]"):
        SIMT_PARAMS.pack(values)


def test_pack_tensormap_of_the_wrong_size():
    values = _values(TMA_PARAMS)
    values["tma_v"] = b"\0" * 64
    with pytest.raises(ValueError, match="Params.tma_v: expected 128 bytes, got 64"):
        TMA_PARAMS.pack(values)


def test_pack_out_of_range_int():
    values = _values(SIMT_PARAMS)
    values["total_q"] = 2**31
    with pytest.raises(struct.error, match=r"Params\.total_q: .* \(value 2147483648\)"):
        SIMT_PARAMS.pack(values)


def test_packed_params_are_64_byte_aligned_and_launchable():
    for _ in range(8):  # allocations land at different offsets modulo 64
        packed = TMA_PARAMS.pack(_values(TMA_PARAMS))
        address = ctypes.addressof(ctypes.c_uint8.from_buffer(packed.data))
        assert address % 64 == 0
        # kernel_params is a void*[1] whose one entry points at the struct.
        assert ctypes.c_void_p.from_address(packed.kernel_params).value == address
        assert bytes((ctypes.c_uint8 * TMA_PARAMS.size).from_address(address)) == bytes(packed.data)
