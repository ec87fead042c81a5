"""The AMD backend without an AMD GPU: offline compilation, the code-object resource report, the
disassembly checks, the gfx9 specs' resource model, and the clear no-ROCm errors."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from click.testing import CliRunner

from mlagen import arch, compiler, render, resources
from mlagen import spec as spec_mod
from mlagen import variant as variant_mod
from mlagen.backends import cuda, hip
from mlagen.cli import cli
from mlagen.errors import CompileError, NoDeviceError
from mlagen.render import Source

CLANG = hip.find_clang()
needs_clang = pytest.mark.skipif(CLANG is None, reason="needs an offline clang >= 20 with the AMDGPU backend "
                                                      "(apt-get install clang-22 lld-22 llvm-22, or pip install ziglang)")
needs_objdump = pytest.mark.skipif(CLANG is None or CLANG.objdump is None,
                                   reason="needs llvm-objdump (apt-get install llvm-22) to disassemble")
EXPECTED_MFMA = {"gfx942": "v_mfma_f32_32x32x8_bf16", "gfx950": "v_mfma_f32_32x32x16_bf16"}
SPECS = {"mla_prefill_gfx942": ("gfx942", ("v_mfma_f32_32x32x8_bf16",)),
         "mla_prefill_gfx950": ("gfx950", ("v_mfma_f32_32x32x16_bf16",)),
         "mla_prefill_gfx950_fp8": ("gfx950", ("v_mfma_scale_f32_32x32x64_f8f6f4",)),
         "mla_prefill_gfx942_fp8": ("gfx942", ("v_mfma_f32_32x32x16_fp8_fp8",))}


@pytest.fixture
def clang(tmp_path):
    return hip.OfflineClangCompiler(cache_dir=tmp_path / "cache", source_dir=tmp_path / "src")


def tiny(body: str = "out[mlagen::thread_x()] = 1.f;", name: str = "tiny") -> Source:
    text = ('#include "mlagen/common/types.cuh"\n'
            f'extern "C" __global__ void {name}(float* out) {{ {body} }}\n')
    return Source(f"{name}.cu", text, name, (str(render.paths.include_dir()),), "test", "")


# --- msgpack and the metadata note -----------------------------------------------------------


def test_msgpack_subset():
    data = (b"\x83"                                   # map of 3
            b"\xa5.name\xa3abc"                       # fixstr -> fixstr
            b"\xab.vgpr_count\xcd\x01\x04"            # uint16 260
            b"\xa5.args\x92\xc3\xd0\xfe")             # array [true, -2]
    assert hip._MsgPack(data).value() == {".name": "abc", ".vgpr_count": 260, ".args": [True, -2]}
    with pytest.raises(ValueError, match="truncated"):
        hip._MsgPack(b"\xa5ab").value()


def test_not_a_code_object():
    with pytest.raises(ValueError, match="not a 64-bit little-endian ELF"):
        hip.code_object_metadata(b"\x7fELF\x01\x01" + bytes(64))


@needs_clang
def test_metadata_matches_llvm_readelf(clang):
    b = clang.compile(tiny("__shared__ float s[256]; s[mlagen::thread_x()] = 2.f; mlagen::barrier(); "
                           "out[mlagen::thread_x()] = s[255 - mlagen::thread_x()];"), "gfx942")
    k = hip.kernel_metadata(b.data, "tiny")
    assert k[".group_segment_fixed_size"] == 1024 and k[".wavefront_size"] == 64
    assert b.resources.smem_static == 1024 and b.resources.stack_bytes == 0 and b.resources.registers > 0
    assert b.resources.occupancy == 8
    readelf = shutil.which("llvm-readelf-22") or shutil.which("llvm-readelf")
    if readelf:
        path = clang.source_dir / "tiny.hsaco"
        path.write_bytes(b.data)
        notes = subprocess.run([readelf, "--notes", str(path)], capture_output=True, text=True).stdout
        assert f".vgpr_count:     {k['.vgpr_count']}" in notes and f".sgpr_count:     {k['.sgpr_count']}" in notes


@needs_clang
def test_unknown_kernel_in_code_object(clang):
    b = clang.compile(tiny(), "gfx950")
    with pytest.raises(ValueError, match=r"kernel 'nope' is not in the code object \(it has \['tiny'\]\)"):
        hip.kernel_metadata(b.data, "nope")


# --- the offline compiler -----------------------------------------------------------------------


def test_find_clang_rejects_a_bad_setting(monkeypatch):
    with pytest.raises(ValueError, match="MLAGEN_HIP_CLANG='/nonexistent/clang': not a runnable clang"):
        hip.find_clang("/nonexistent/clang")


@needs_clang
def test_clang_is_new_enough_for_gfx950():
    assert int(CLANG.version.split(".")[0]) >= hip.MIN_CLANG_MAJOR


def test_for_target_routes_gfx_to_an_amd_compiler(monkeypatch):
    monkeypatch.setenv("MLAGEN_HIP_COMPILER", "clang")
    if CLANG is None:
        with pytest.raises(NoDeviceError, match="no clang >= 20 with the AMDGPU backend"):
            compiler.for_target("gfx950")
    else:
        assert isinstance(compiler.for_target("gfx950"), hip.OfflineClangCompiler)
    assert isinstance(compiler.for_target("sm_90a"), cuda.NvrtcCompiler)


@needs_clang
def test_cache_key_names_the_compiler(clang, tmp_path):
    first = clang.compile(tiny(), "gfx942")
    assert first.compiler == f"{CLANG.name} {CLANG.version}" and not first.from_cache
    again = hip.OfflineClangCompiler(cache_dir=tmp_path / "cache", source_dir=tmp_path / "src").compile(tiny(), "gfx942")
    assert again.from_cache and again.data == first.data and again.resources == first.resources
    other = hip.OfflineClangCompiler(clang=hip.Clang(CLANG.argv, CLANG.version + "-other", CLANG.ld_lld, CLANG.objdump),
                                     cache_dir=tmp_path / "cache", source_dir=tmp_path / "src")
    assert other.key(tiny(), "gfx942") != clang.key(tiny(), "gfx942")
    assert clang.key(tiny(), "gfx942") != clang.key(tiny(), "gfx950")


@needs_clang
def test_compile_error_carries_the_log(clang):
    with pytest.raises(CompileError) as e:
        clang.compile(tiny("this is not C++;"), "gfx942")
    assert "failed to compile tiny.cu for gfx942" in str(e.value) and "error:" in e.value.log


@needs_clang
def test_cuda_target_is_refused(clang):
    with pytest.raises(CompileError, match="sm_90a is not an AMD target"):
        clang.compile(tiny(), "sm_90a")


@needs_clang
def test_gfx950_atom_on_gfx942_says_why(clang):
    s = spec_mod.load("mla_prefill_gfx950")
    with pytest.raises(CompileError) as e:
        clang.compile(render.render(variant_mod.make(s, {"k_atom": 16})), "gfx942")
    assert "exists on gfx950 only: use k_atom 8" in e.value.log


@needs_objdump
def test_scratch_is_detected(clang):
    # A private array indexed at run time lives in scratch memory.
    body = ("float a[64]; for (int i = 0; i < 64; ++i) a[i] = out[i]; "
            "out[0] = a[(int)out[1] & 63];")
    b = clang.compile(tiny(body, "spill"), "gfx942")
    assert b.resources.stack_bytes > 0
    assert any("uses scratch" in p for p in hip.check_code_object(b.data, "spill", "gfx942", ("v_mfma",)))
    assert any("no v_mfma" in p for p in hip.check_code_object(b.data, "spill", "gfx942", ("v_mfma",)))


# --- the gfx9 kernels ---------------------------------------------------------------------------


@needs_objdump
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("mask", ["causal", "none"])
def test_default_variant_compiles_with_mfma_and_no_scratch(clang, name, mask):
    target, expected = SPECS[name]
    s = spec_mod.load(name)
    v = variant_mod.make(s, {"mask": mask})
    assert resources.check(v, arch.target(target)).ok
    b = clang.compile(render.render(v), target)
    dis = hip.disassemble(b.data)
    assert hip.check_code_object(b.data, b.symbol, target, expected, dis) == []
    assert "v_mfma_f32_32x32x16_bf16" not in dis or target == "gfx950"
    assert ("f8f6f4" in dis) == (name == "mla_prefill_gfx950_fp8")
    if name.endswith("_fp8"):  # both products on the fp8 atom: no bf16 MFMA left
        assert "bf16" not in " ".join(hip.mfma_instructions(dis))
    r = b.resources
    assert r.stack_bytes == 0 and not r.spills and r.occupancy >= 1
    assert r.smem_static == resources.estimate(v).smem_bytes  # the spec's LDS model is exact


@needs_objdump
def test_gfx950_can_use_the_cdna3_atom(clang):
    s = spec_mod.load("mla_prefill_gfx950")
    b = clang.compile(render.render(variant_mod.make(s, {"k_atom": 8, "block_n": 32})), "gfx950")
    assert "v_mfma_f32_32x32x8_bf16" in hip.mfma_instructions(hip.disassemble(b.data))


def test_lds_budget_prunes_on_gfx942_not_gfx950():
    v942 = variant_mod.make(spec_mod.load("mla_prefill_gfx942"), {"stages": 2, "block_n": 64})
    verdict = resources.check(v942, arch.target("gfx942"))
    assert not verdict.ok and any("gfx942 allows 64.0 KB per block" in r for r in verdict.reasons)
    v950 = variant_mod.make(spec_mod.load("mla_prefill_gfx950"), {"stages": 2, "block_n": 64})
    assert resources.check(v950, arch.target("gfx950")).ok


def test_amd_specs_are_not_candidates_on_nvidia():
    s = spec_mod.load("mla_prefill_gfx950")
    verdict = resources.check(variant_mod.make(s, {}), arch.target("sm_90a"))
    assert any("does not target sm_90a" in r for r in verdict.reasons)


@needs_objdump
@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_cli_build_reports_amd_resources(target, tmp_path):
    res = CliRunner().invoke(cli, ["build", "--arch", target, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = res.output
    assert EXPECTED_MFMA[target] in out and "waves/SIMD" in out and "lds KB" in out
    assert f"compiled only: {target}" in out
    assert list(tmp_path.joinpath(target).glob("*.hsaco"))
    # The FP8 spec is built too.
    fp8 = {"gfx950": "v_mfma_scale_f32_32x32x64_f8f6f4", "gfx942": "v_mfma_f32_32x32x16_fp8_fp8"}[target]
    assert fp8 in out and f"mla_prefill_{target}_fp8_causal" in out


# --- no ROCm here -------------------------------------------------------------------------------


def _rocm_present() -> bool:
    return hip.rocm_available()


@pytest.mark.skipif(_rocm_present(), reason="ROCm is installed here")
def test_no_rocm_runtime_is_a_clear_error():
    with pytest.raises(NoDeviceError, match="no ROCm runtime was found"):
        hip.device_properties(0)
    with pytest.raises(NoDeviceError, match="no ROCm runtime was found"):
        hip.hiprtc_version()


def test_importing_needs_no_rocm():
    code = "import mlagen, mlagen.backends.hip, mlagen.runtime; from hip import hip, hiprtc; print('ok')"
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_ziglang_fallback_compiles(tmp_path):
    """The PyPI-only route: the ziglang wheel's clang, with its lld behind a shim."""
    pytest.importorskip("ziglang", reason="the ziglang wheel is not installed (it is an optional fallback)")
    z = hip.find_clang("ziglang")
    assert z is not None and z.name == "zig-clang" and int(z.version.split(".")[0]) >= hip.MIN_CLANG_MAJOR
    c = hip.OfflineClangCompiler(clang=z, cache_dir=tmp_path / "cache", source_dir=tmp_path / "src")
    s = spec_mod.load("mla_prefill_gfx950")
    b = c.compile(render.render(variant_mod.make(s, {"block_n": 32})), "gfx950")
    assert b.compiler.startswith("zig-clang ") and b.resources.stack_bytes == 0
    assert hip.kernel_metadata(b.data, b.symbol)[".wavefront_size"] == 64


@needs_clang
def test_kernel_takes_the_param_struct_by_value(clang):
    """HIP copies kernel arguments by the sizes in the code object's metadata: one by-value
    argument of exactly the size the launcher packs (tests/test_abi.py checks the offsets)."""
    from mlagen.families.mla_prefill.params import SIMT_PARAMS

    s = spec_mod.load("mla_prefill_gfx942")
    b = clang.compile(render.render(variant_mod.make(s, {})), "gfx942")
    args = hip.kernel_metadata(b.data, b.symbol)[".args"]
    assert [(a[".offset"], a[".size"], a[".value_kind"]) for a in args] == [(0, SIMT_PARAMS.size, "by_value")]


@needs_objdump
@pytest.mark.parametrize("name, target", [("mla_prefill_gfx950_fp8", "gfx950"), ("mla_prefill_gfx942_fp8", "gfx942")])
def test_fp8_kv_split_variant_compiles_and_is_pruned_where_it_spills(clang, name, target):
    """kv_split (K copied by the first half of the waves, V by the second) compiles without scratch
    for 64-key tiles; the model prunes it for 128-key tiles, where it spilled."""
    s = spec_mod.load(name)
    v = variant_mod.make(s, {"kv_split": 1, "block_n": 64})
    b = clang.compile(render.render(v), target)
    assert hip.check_code_object(b.data, b.symbol, target, SPECS[name][1], hip.disassemble(b.data)) == []
    assert b.resources.stack_bytes == 0 and not b.resources.spills
    verdict = resources.check(variant_mod.make(s, {"kv_split": 1, "block_n": 128, "q_in_lds": 0}), arch.target(target))
    assert not verdict.ok and any("split copies of a 128-key tile" in r for r in verdict.reasons)


@needs_objdump
@pytest.mark.parametrize("name, target, fixed", [
    ("mla_prefill_gfx950_fp8", "gfx950", {}),  # the default: Q in LDS, K/V split, 8 waves, 128 keys
    ("mla_prefill_gfx942_fp8", "gfx942", {"q_in_lds": 1, "waves": 4, "block_n": 64})])
def test_fp8_q_in_lds_compiles_with_the_modelled_lds(clang, name, target, fixed):
    """Q staged in LDS (the seed's schedule): LDS is the stages plus block_m padded Q rows, exactly."""
    s = spec_mod.load(name)
    v = variant_mod.make(s, fixed)
    env = v.env()
    assert env["q_in_lds"] == 1
    b = clang.compile(render.render(v), target)
    assert hip.check_code_object(b.data, b.symbol, target, SPECS[name][1], hip.disassemble(b.data)) == []
    q_bytes = env["block_m"] * (192 + 2 * env["lds_pad"])
    assert b.resources.smem_static == env["stages"] * env["lds_stage"] + q_bytes
    assert b.resources.stack_bytes == 0 and not b.resources.spills
