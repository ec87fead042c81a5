"""AMD Instinct (gfx942, gfx950): the HIP backend, the sibling of ``cuda.py``.

Its compilers (:class:`HiprtcCompiler`, :class:`OfflineClangCompiler`), runtime
(:class:`HipRuntime`, :class:`HipKernel`) and what they are built on, as the CUDA classes are
built on cuda-bindings:

* the offline clang (Debian's ``clang-22`` or the ``ziglang`` wheel's clang) that compiles gfx
  targets on any machine, and :func:`clang_compile`;
* hipRTC (:func:`hiprtc_compile`) and the HIP module API (:func:`module_load`, :func:`launch`,
  :func:`device_properties`) through hip-python;
* the AMDGPU code object: its metadata note (a msgpack map: VGPRs, AGPRs, SGPRs, LDS, scratch,
  spills), read without any LLVM tool, and its disassembly (MFMA forms, scratch).

Sources for gfx targets include no HIP header (``mlagen/gfx9/prelude.cuh`` defines what they need
from clang builtins), so hipRTC and the offline clang compile the same text. ``hip-python``
imports without ROCm; its first call needs ``libamdhip64.so`` / ``libhiprtc.so``, and every call
goes through :func:`_call` and its :func:`_check` (a hipRTC failure raises CompileError with the
compile log), which turns a missing runtime into a NoDeviceError that says so.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import arch, knobs
from ..abi import PackedParams
from ..errors import CompileError, DriverError, NoDeviceError
from ..source import Source
from .base import Backend, Binary, Compiler, DeviceInfo, Kernel, KernelResources, Runtime

NO_ROCM = ("no ROCm runtime was found ({what}: {why}); AMD GPUs need ROCm (libamdhip64.so, libhiprtc.so) "
           "on the library path. Without one, mlagen can still compile for gfx942/gfx950 "
           "(mlagen build --arch gfx950) with an offline clang")

# --- the offline clang ------------------------------------------------------------------------


@dataclass(frozen=True)
class Clang:
    """How to run an offline clang: its argv prefix, the linker it needs, and LLVM's objdump."""

    argv: tuple[str, ...]
    version: str
    ld_lld: tuple[str, ...] | None = None  # argv of ld.lld where clang cannot find a linker itself (zig)
    objdump: str | None = None

    @property
    def name(self) -> str:
        return "zig-clang" if self.ld_lld else "clang"


_VERSION = re.compile(r"clang version (\d+)\.(\d+)\.(\d+)")
# gfx950 entered LLVM in 20 (clang-19 rejects --offload-arch=gfx950); 22 is what the issue pins.
MIN_CLANG_MAJOR = 20


def _clang_version(argv: list[str]) -> str | None:
    try:
        out = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = _VERSION.search(out)
    return ".".join(m.groups()) if m else None


def _objdump_major(path: str) -> int:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    m = re.search(r"LLVM version (\d+)", out)
    return int(m.group(1)) if m else 0


def _objdump_near(clang_path: str | None) -> str | None:
    """LLVM's objdump beside ``clang_path``, else the newest one installed; only LLVM >= 20 knows
    gfx950 and code object v5."""
    candidates = []
    if clang_path:
        candidates.append(str(Path(os.path.realpath(clang_path)).parent / "llvm-objdump"))
    candidates += [shutil.which(f"llvm-objdump-{v}") for v in range(30, MIN_CLANG_MAJOR - 1, -1)]
    candidates += [str(p) for p in sorted(Path("/usr/lib").glob("llvm-*/bin/llvm-objdump"), reverse=True)]
    candidates.append(shutil.which("llvm-objdump"))
    for c in filter(None, candidates):
        if os.access(c, os.X_OK) and _objdump_major(c) >= MIN_CLANG_MAJOR:
            return c
    return None


def _ziglang() -> Clang | None:
    try:
        import ziglang  # noqa: F401  (an optional wheel, never a dependency)
    except ImportError:
        return None
    argv = [sys.executable, "-m", "ziglang", "clang"]
    version = _clang_version(argv)
    if version is None:
        return None
    return Clang(tuple(argv), version, ld_lld=(sys.executable, "-m", "ziglang", "ld.lld"),
                 objdump=_objdump_near(None))


@functools.lru_cache(maxsize=None)
def find_clang(setting: str | None = None) -> Clang | None:
    """The offline clang to use: ``MLAGEN_HIP_CLANG`` (a path, or ``ziglang``), else ``clang-22``
    / ``clang`` on PATH or under /usr/lib/llvm-*, else the ziglang wheel. Only a clang of major
    version >= 20 counts (older ones cannot target gfx950). None if there is none."""
    setting = setting if setting is not None else knobs.hip_clang()
    if setting:
        if setting == "ziglang":
            return _ziglang()
        version = _clang_version([setting])
        if version is None:
            raise ValueError(f"MLAGEN_HIP_CLANG={setting!r}: not a runnable clang")
        return Clang((setting,), version, objdump=_objdump_near(setting))
    names = [f"clang-{v}" for v in range(30, MIN_CLANG_MAJOR - 1, -1)] + ["clang"]
    paths = [shutil.which(n) for n in names]
    paths += [str(p) for p in sorted(Path("/usr/lib").glob("llvm-*/bin/clang"), reverse=True)]
    for path in filter(None, paths):
        version = _clang_version([path])
        if version and int(version.split(".")[0]) >= MIN_CLANG_MAJOR:
            return Clang((path,), version, objdump=_objdump_near(path))
    return _ziglang()


# --- AMDGPU code objects: metadata and disassembly -------------------------------------------


class _MsgPack:
    """The subset of msgpack the AMDGPU metadata note uses (maps, arrays, strings, numbers)."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def _take(self, n: int) -> bytes:
        out = self.data[self.pos:self.pos + n]
        if len(out) != n:
            raise ValueError("truncated msgpack")
        self.pos += n
        return out

    def _unpack(self, fmt: str):
        return struct.unpack(">" + fmt, self._take(struct.calcsize(">" + fmt)))[0]

    def value(self):
        b = self._take(1)[0]
        if b <= 0x7F:
            return b
        if b >= 0xE0:
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self._map(b & 0x0F)
        if 0x90 <= b <= 0x9F:
            return [self.value() for _ in range(b & 0x0F)]
        if 0xA0 <= b <= 0xBF:
            return self._take(b & 0x1F).decode()
        simple = {0xC0: None, 0xC2: False, 0xC3: True}
        if b in simple:
            return simple[b]
        numbers = {0xCA: "f", 0xCB: "d", 0xCC: "B", 0xCD: "H", 0xCE: "I", 0xCF: "Q",
                   0xD0: "b", 0xD1: "h", 0xD2: "i", 0xD3: "q"}
        if b in numbers:
            return self._unpack(numbers[b])
        sized = {0xD9: ("B", "str"), 0xDA: ("H", "str"), 0xDB: ("I", "str"), 0xC4: ("B", "bin"),
                 0xC5: ("H", "bin"), 0xC6: ("I", "bin"), 0xDC: ("H", "array"), 0xDD: ("I", "array"),
                 0xDE: ("H", "map"), 0xDF: ("I", "map")}
        if b not in sized:
            raise ValueError(f"unsupported msgpack type byte 0x{b:02x}")
        fmt, kind = sized[b]
        n = self._unpack(fmt)
        if kind == "str":
            return self._take(n).decode()
        if kind == "bin":
            return self._take(n)
        if kind == "array":
            return [self.value() for _ in range(n)]
        return self._map(n)

    def _map(self, n: int) -> dict:
        out = {}
        for _ in range(n):
            k = self.value()
            out[k] = self.value()
        return out


NT_AMDGPU_METADATA = 32


def code_object_metadata(data: bytes) -> dict:
    """The AMDGPU metadata map of a code object (``amdhsa.kernels``, ``amdhsa.target``, ...)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF code object")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        sh = shoff + i * shentsize
        sh_type, = struct.unpack_from("<I", data, sh + 4)
        if sh_type != 7:  # SHT_NOTE
            continue
        off, size = struct.unpack_from("<QQ", data, sh + 0x18)
        pos, end = off, off + size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name = data[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            desc = pos + 12 + (namesz + 3) // 4 * 4
            if name == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                return _MsgPack(data[desc:desc + descsz]).value()
            pos = desc + (descsz + 3) // 4 * 4
    raise ValueError("the code object has no AMDGPU metadata note")


def kernel_metadata(data: bytes, symbol: str) -> dict:
    meta = code_object_metadata(data)
    for k in meta.get("amdhsa.kernels", []):
        if k.get(".name") == symbol:
            return k
    names = [k.get(".name") for k in meta.get("amdhsa.kernels", [])]
    raise ValueError(f"kernel {symbol!r} is not in the code object (it has {names})")


def code_object_resources(data: bytes, symbol: str, target: str) -> dict:
    """VGPRs, AGPRs, SGPRs, LDS, scratch, spills and occupancy of ``symbol`` from its metadata,
    as the fields of ``compiler.KernelResources``.

    ``registers`` is ``.vgpr_count``: on gfx90a and later the unified VGPR + AGPR count."""
    k = kernel_metadata(data, symbol)
    vgprs, agprs = int(k.get(".vgpr_count", 0)), int(k.get(".agpr_count", 0))
    lds = int(k.get(".group_segment_fixed_size", 0))
    vspill = int(k.get(".vgpr_spill_count", 0))
    threads = int(k.get(".max_flat_workgroup_size", 256))
    return {
        "registers": vgprs,
        "agprs": agprs,
        "sgprs": int(k.get(".sgpr_count", 0)),
        "smem_static": lds,
        "stack_bytes": int(k.get(".private_segment_fixed_size", 0)),
        # VGPR spills go to scratch, 4 bytes per lane each; SGPR spills go to VGPR lanes (not memory).
        "spill_stores": 4 * vspill,
        "spill_loads": 4 * vspill,
        "occupancy": arch.occupancy(arch.target(target), threads, lds, vgprs),
    }


def disassemble(data: bytes, objdump: str | None = None) -> str:
    """Disassembly of a code object with LLVM's objdump (found beside the offline clang)."""
    tool = objdump or (find_clang().objdump if find_clang() else None) or _objdump_near(None)
    if tool is None:
        raise NoDeviceError(f"no llvm-objdump >= {MIN_CLANG_MAJOR} found to disassemble AMDGPU code "
                            "(apt-get install llvm-22)")
    with tempfile.TemporaryDirectory(prefix="mlagen-hip-") as d:
        path = Path(d) / "kernel.hsaco"
        path.write_bytes(data)
        proc = subprocess.run([tool, "-d", str(path)], capture_output=True, text=True, timeout=300)
    if proc.returncode:
        raise CompileError(f"llvm-objdump failed on the code object: {proc.stderr.strip()}")
    return proc.stdout


_MFMA = re.compile(r"\b(v_mfma_\w+)")
_SCRATCH = re.compile(r"\b(scratch_(?:load|store)_\w+|buffer_(?:load|store)_\w+[^\n]*\boffen\b[^\n]*s\[0:3\])")


def mfma_instructions(disassembly: str) -> dict[str, int]:
    """How often each ``v_mfma_*`` instruction occurs in a disassembly."""
    out: dict[str, int] = {}
    for m in _MFMA.finditer(disassembly):
        out[m.group(1)] = out.get(m.group(1), 0) + 1
    return out


def check_code_object(data: bytes, symbol: str, target: str, expect_mfma: tuple[str, ...],
                      disassembly: str | None = None) -> list[str]:
    """What is wrong with a compiled AMD kernel: missing MFMA forms, scratch or spills, LDS or
    registers over the target's budget. Empty when it is fine."""
    t = arch.target(target)
    r = code_object_resources(data, symbol, target)
    problems = []
    dis = disassembly if disassembly is not None else disassemble(data)
    found = mfma_instructions(dis)
    for name in expect_mfma:
        if not any(f.startswith(name) for f in found):
            problems.append(f"no {name} in the disassembly (found: {sorted(found) or 'no MFMA at all'})")
    if r["stack_bytes"] or r["spill_stores"] or _SCRATCH.search(dis):
        problems.append(f"uses scratch ({r['stack_bytes']} bytes per lane, {r['spill_stores'] // 4} VGPRs spilled)")
    if r["smem_static"] > t.smem_per_block:
        problems.append(f"{r['smem_static']} bytes of LDS, {t.name} has {t.smem_per_block}")
    if r["registers"] > t.max_regs_per_thread or r["agprs"] > t.agprs:
        problems.append(f"{r['registers']} VGPRs ({r['agprs']} of them AGPRs) exceed {t.max_regs_per_thread} "
                        f"({t.agprs} AGPRs)")
    if r["occupancy"] < 1:
        problems.append("not a single wave fits a SIMD (registers or LDS)")
    return problems


# --- compiling -------------------------------------------------------------------------------


def check_amd_target(target: str) -> None:
    """CompileError unless ``target`` is an AMD target."""
    if arch.target(target).vendor != "hip":
        raise CompileError(f"{target} is not an AMD target (AMD targets: "
                           f"{', '.join(n for n, x in arch.TARGETS.items() if x.vendor == 'hip')})")


def clang_options(target: str) -> list[str]:
    """Device code only, unbundled, no device libraries or HIP headers (the sources need only
    clang builtins); code object v5 is what ROCm 6 loads by default."""
    return ["-x", "hip", f"--offload-arch={target}", "--cuda-device-only", "--no-gpu-bundle-output",
            "-nogpulib", "-nogpuinc", "-O3", "-std=c++17", "-mcode-object-version=5", "-DNDEBUG"]


def clang_compile(clang: Clang, text: str, name: str, target: str, options: list[str],
                  source_path: str) -> tuple[bytes, str]:
    """Compile ``text`` (file name ``name``) with the offline clang: (code object, log)."""
    check_amd_target(target)
    with tempfile.TemporaryDirectory(prefix="mlagen-hip-") as d:
        src, out = Path(d) / name, Path(d) / "kernel.hsaco"
        src.write_text(text)
        env = None
        if clang.ld_lld:
            # zig's clang links AMDGPU code objects by running "lld -flavor gnu" from PATH, which
            # the wheel does not install: a shim of that name forwards to its "ld.lld".
            shim = Path(d) / "bin" / "lld"
            shim.parent.mkdir()
            shim.write_text('#!/bin/sh\n[ "$1" = "-flavor" ] && shift 2\nexec '
                            + " ".join(f"'{a}'" for a in clang.ld_lld) + ' "$@"\n')
            shim.chmod(0o755)
            env = {**os.environ, "PATH": f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        cmd = [*clang.argv, *options, str(src), "-o", str(out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        except subprocess.TimeoutExpired:
            raise CompileError(f"clang timed out compiling {name} for {target}", "", source_path) from None
        log = (proc.stderr or "").replace(str(src), source_path)
        if proc.returncode or not out.is_file():
            raise CompileError(f"clang {clang.version} failed to compile {name} for {target}", log, source_path)
        return out.read_bytes(), log


@functools.lru_cache(maxsize=None)
def _hip_modules():
    """hip-python's ``hip`` and ``hiprtc`` modules (importing them needs no ROCm)."""
    try:
        from hip import hip, hiprtc
    except ImportError as exc:  # pragma: no cover - hip-python is a dependency
        raise NoDeviceError(f"hip-python is not installed ({exc}); pip install hip-python") from None
    return hip, hiprtc


def _check(result, what: str, log: str = "", source_path: str | None = None, message: str | None = None):
    """Unwrap a hip-python result tuple; raise with the error's name when it failed: CompileError
    (with the compile log, where there is one) for hipRTC calls, DriverError for the others.
    ``message`` replaces "<what> failed: <error>" (the compile's own sentence)."""
    err, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    code = int(getattr(err, "value", err))
    if code != 0:
        name = getattr(err, "name", str(code))
        text = message if message is not None else f"{what} failed: {name} ({code})"
        if "hiprtc" in what:
            raise CompileError(text, log, source_path)
        raise DriverError(text)
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def _call(fn, *args, what: str, log: str = "", source_path: str | None = None, message: str | None = None):
    """Call a hip-python function through :func:`_check`; a ROCm library that cannot be loaded
    becomes a NoDeviceError."""
    try:
        result = fn(*args)
    except RuntimeError as exc:
        if "dlopen" in str(exc) or "cannot open shared object" in str(exc):
            why = re.sub(r"b'([^']*)'", r"\1", str(exc)).strip()  # hip-python prints bytes reprs
            raise NoDeviceError(NO_ROCM.format(what=what, why=why)) from None
        raise
    return _check(result, what, log, source_path, message)


def hiprtc_version() -> str:
    """hipRTC's version ("6.4"); NoDeviceError without ROCm."""
    _, hiprtc = _hip_modules()
    major, minor = _call(hiprtc.hiprtcVersion, what="hiprtcVersion")
    return f"{major}.{minor}"


def hiprtc_options(target: str) -> list[str]:
    return [f"--offload-arch={target}", "-O3", "-std=c++17", "-DNDEBUG"]


def hiprtc_compile(text: str, name: str, target: str, options: list[str], source_path: str) -> tuple[bytes, str]:
    """hiprtcCreateProgram -> hiprtcCompileProgram -> hiprtcGetCode: (code object, log)."""
    check_amd_target(target)
    _, hiprtc = _hip_modules()
    prog = _call(hiprtc.hiprtcCreateProgram, text.encode(), name.encode(), 0, None, None, what="hiprtcCreateProgram")
    try:
        opts = [o.encode() for o in options]
        compiled = hiprtc.hiprtcCompileProgram(prog, len(opts), opts)
        size = _call(hiprtc.hiprtcGetProgramLogSize, prog, what="hiprtcGetProgramLogSize")
        buf = bytearray(int(size) + 1)
        _call(hiprtc.hiprtcGetProgramLog, prog, buf, what="hiprtcGetProgramLog")
        log = bytes(buf).rstrip(b"\0 ").decode(errors="replace")
        _check(compiled, "hiprtcCompileProgram", log, source_path,
               message=f"hipRTC failed to compile {name} for {target}")
        size = _call(hiprtc.hiprtcGetCodeSize, prog, what="hiprtcGetCodeSize", log=log, source_path=source_path)
        code = bytearray(int(size))
        _call(hiprtc.hiprtcGetCode, prog, code, what="hiprtcGetCode", log=log, source_path=source_path)
        return bytes(code), log
    finally:
        _call(hiprtc.hiprtcDestroyProgram, prog, what="hiprtcDestroyProgram")


def rocm_available() -> bool:
    """Whether the ROCm runtime compiler loads (no device needed for hipRTC)."""
    try:
        hiprtc_version()
        return True
    except (NoDeviceError, CompileError):
        return False


# --- loading and launching --------------------------------------------------------------------


def device_properties(index: int = 0) -> dict:
    """Name, gcnArchName (without feature flags), version, CU count, LDS, L2 and driver of HIP
    device ``index``. NoDeviceError saying that no ROCm runtime was found when libamdhip64.so
    cannot be loaded, and naming the device when mlagen has no target for it."""
    hip, _ = _hip_modules()
    props = _call(hip.hipGetDeviceProperties, index, what="hipGetDeviceProperties")

    def text(x) -> str:
        x = x.decode(errors="replace") if isinstance(x, (bytes, bytearray)) else str(x)
        return x.split("\0", 1)[0]

    arch_name = text(props.gcnArchName)
    if arch.for_gcn_arch(arch_name) is None:
        known = ", ".join(n for n, x in arch.TARGETS.items() if x.vendor == "hip")
        raise NoDeviceError(f"HIP device {index} is {arch_name}; mlagen has kernels for {known}")
    version = _call(hip.hipDriverGetVersion, what="hipDriverGetVersion")
    return {"name": text(props.name), "arch_name": arch_name.split(":", 1)[0],
            "compute": (int(props.major), int(props.minor)), "sm_count": int(props.multiProcessorCount),
            "smem_per_block": int(props.sharedMemPerBlock), "l2_bytes": int(props.l2CacheSize),
            "driver_version": f"hip {version}"}


def device_count() -> int:
    """HIP devices the runtime sees (after ``HIP_VISIBLE_DEVICES``)."""
    hip, _ = _hip_modules()
    return int(_call(hip.hipGetDeviceCount, what="hipGetDeviceCount"))


def module_load(data: bytes, symbol: str, device: int):
    """Load a code object on HIP device ``device``: (module, function). The caller's current
    device is current again afterwards (tensors on another device than torch's current one)."""
    hip, _ = _hip_modules()
    caller = _call(hip.hipGetDevice, what="hipGetDevice")
    _call(hip.hipSetDevice, device, what="hipSetDevice")
    try:
        module = _call(hip.hipModuleLoadData, data, what=f"hipModuleLoadData({symbol})")
        function = module_function(module, symbol)
    finally:
        if caller != device:
            _call(hip.hipSetDevice, caller, what="hipSetDevice")
    return module, function


def module_function(module, symbol: str):
    """Entry point ``symbol`` of a loaded module."""
    hip, _ = _hip_modules()
    return _call(hip.hipModuleGetFunction, module, symbol.encode(), what=f"hipModuleGetFunction({symbol})")


def launch(function, symbol: str, grid, block, dynamic_lds: int, stream: int, kernel_params: int) -> None:
    """hipModuleLaunchKernel on ``stream`` (a hipStream_t as an int; 0: the null stream) with the
    ``void*[]`` at ``kernel_params``: HIP copies each argument by the size in the kernel's metadata."""
    hip, _ = _hip_modules()
    _call(hip.hipModuleLaunchKernel, function, *grid, *block, dynamic_lds,
          hip.ihipStream_t.fromObj(stream) if stream else None, kernel_params, None,
          what=f"hipModuleLaunchKernel({symbol})")


# --- the backend -------------------------------------------------------------------------------


class _AmdCompiler(Compiler):
    """What the AMD compilers share: the code object's metadata is their resource report."""

    def parse_resources(self, data: bytes, log: str, symbol: str, target: str) -> KernelResources:
        warnings = tuple(line.strip() for line in log.splitlines() if "warning:" in line)
        return KernelResources(**code_object_resources(data, symbol, target), warnings=warnings)


class OfflineClangCompiler(_AmdCompiler):
    """HIP source to an AMDGPU code object with an offline clang (>= 20); no ROCm needed."""

    def __init__(self, *args, clang: Clang | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.clang = clang or find_clang()
        if self.clang is None:
            raise NoDeviceError(
                f"no clang >= {MIN_CLANG_MAJOR} with the AMDGPU backend was found to compile for AMD targets: "
                "apt-get install clang-22 lld-22 llvm-22, or pip install ziglang, or set MLAGEN_HIP_CLANG")
        self.name = self.clang.name

    def version(self) -> str:
        return self.clang.version

    def options(self, target: str) -> list[str]:
        return clang_options(target)

    def _compile(self, source: Source, target: str, options: list[str], source_path: str) -> tuple[bytes, str]:
        return clang_compile(self.clang, source.text, source.name, target, options, source_path)


class HiprtcCompiler(_AmdCompiler):
    """HIP source to an AMDGPU code object through hipRTC (ROCm's runtime compiler, hip-python)."""

    name = "hiprtc"

    def version(self) -> str:
        return hiprtc_version()

    def options(self, target: str) -> list[str]:
        return hiprtc_options(target)

    def _compile(self, source: Source, target: str, options: list[str], source_path: str) -> tuple[bytes, str]:
        return hiprtc_compile(source.text, source.name, target, options, source_path)


class HipKernel(Kernel):
    """A loaded AMD kernel; ``launch`` has the same signature as CudaKernel's."""

    def _entry(self, name: str) -> HipKernel:
        return HipKernel(self.module, module_function(self.module, name), self.binary)

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: int,
               params: PackedParams) -> None:
        """Launch on ``stream`` (ROCm torch's ``torch.cuda`` stream handles are HIP streams). The
        gfx9 kernels declare their LDS statically, so only what a launch asks beyond that is
        passed as dynamic LDS."""
        dynamic = max(0, smem - self.binary.resources.smem_static)
        launch(self.function, self.binary.symbol, grid, block, dynamic, stream, params.kernel_params)


class HipRuntime(Runtime):
    """Loads AMDGPU code objects on a HIP device (ROCm torch's ``torch.cuda`` devices)."""

    vendor = "hip"

    def device_count(self) -> int:
        return device_count()

    def _device_info(self, index: int) -> DeviceInfo:
        p = device_properties(index)
        return DeviceInfo(index=index, name=p["name"], compute=p["compute"], sm_count=p["sm_count"],
                          driver_version=p["driver_version"], smem_per_block_optin=p["smem_per_block"],
                          l2_bytes=p["l2_bytes"], arch_name=p["arch_name"])

    def _load(self, binary: Binary, index: int) -> HipKernel:
        module, function = module_load(binary.data, binary.symbol, index)
        return HipKernel(module, function, binary)


class HipBackend(Backend):
    vendor = "hip"

    def compiler(self, **kwargs) -> Compiler:
        """hipRTC where ROCm loads (MLAGEN_HIP_COMPILER=auto), else the offline clang;
        ``hiprtc`` / ``clang`` force one."""
        choice = knobs.hip_compiler()
        if choice == "hiprtc" or (choice == "auto" and rocm_available()):
            return HiprtcCompiler(**kwargs)
        return OfflineClangCompiler(**kwargs)

    def _new_runtime(self) -> HipRuntime:
        return HipRuntime()


BACKEND = HipBackend()
