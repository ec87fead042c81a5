"""Device compilers: rendered source in, binary with its resource report out.

A compiler is a small class with one job. Caching lives in ``Compiler.compile`` alone, keyed by
a hash of everything that changes the output: the source, the options, the target, the
compiler's name and version, and every header under the include directories. NVRTC is the CUDA
compiler; its AMD siblings (hipRTC, an offline clang) implement the same methods on top of
``backends/hip.py``, with their own resource report (AMDGPU metadata instead of ptxas -v).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import knobs
from .cache import DiskCache, atomic_write
from .errors import CompileError, NoDeviceError
from .source import Source


# Part of every key: entries of an older layout (before checksums) are not read, not reported corrupt.
CACHE_FORMAT = "entry-v2"


@dataclass(frozen=True)
class KernelResources:
    """What the device assembler reported for one entry point."""

    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    smem_static: int = 0
    barriers: int = 0
    warnings: tuple[str, ...] = ()
    # AMD only (from the code object's metadata): registers is the unified VGPR count (AGPRs
    # included), stack_bytes the scratch per lane, smem_static the LDS; occupancy is waves per SIMD.
    agprs: int = 0
    sgprs: int = 0
    occupancy: int = 0

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass(frozen=True)
class Binary:
    data: bytes
    target: str
    symbol: str
    key: str
    resources: KernelResources
    compiler: str
    log: str = ""
    source_path: str | None = None
    from_cache: bool = field(default=False, compare=False)


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers([^\n]*)")
# The rest of the "Used" line comes in a varying order ("used 1 barriers, 256 bytes cumulative
# stack size, 1024 bytes smem, ..."), so each item is looked up on its own.
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_WARN = re.compile(r"ptxas warning\s*:\s*(.*)")
# ptxas reports wgmma serialisation as "info" lines (C7510-C7519: an injected warpgroup.wait, or
# MMAs serialised for lack of registers): a kernel that compiles clean but loses its overlap.
_SERIAL = re.compile(r"ptxas info\s*:\s*(\(C751\d\)[^\n]*?)(?: in function '[^']*')?\s*$", re.M)


def parse_ptxas_report(log: str, symbol: str) -> KernelResources:
    """Pull registers, spills, stack and static shared memory of ``symbol`` out of a ptxas -v log."""
    section, current = [], None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group(1)
        # Whole-name match: a module may hold other entries whose names extend this one (<symbol>_vt).
        if current == symbol or line.rstrip().endswith("Function properties for " + symbol):
            section.append(line)
    text = "\n".join(section) if section else log
    props = _PROPS.search(text)
    used = _USED.search(text)
    rest = used.group(2) if used else ""
    barriers, smem = _BARRIERS.search(rest), _SMEM.search(rest)
    warnings = tuple(m.group(1).strip() for m in _WARN.finditer(log)) + tuple(
        "ptxas " + m.group(1).strip() for m in _SERIAL.finditer(log))
    return KernelResources(
        registers=int(used.group(1)) if used else 0,
        barriers=int(barriers.group(1)) if barriers else 0,
        smem_static=int(smem.group(1)) if smem else 0,
        stack_bytes=int(props.group(1)) if props else 0,
        spill_stores=int(props.group(2)) if props else 0,
        spill_loads=int(props.group(3)) if props else 0,
        warnings=warnings,
    )


def spill_reason(binary: "Binary") -> str | None:
    """Why a compiled kernel is rejected before it is launched or recorded, or None if it is not.

    A kernel that spills registers to local memory runs at the mercy of local-memory traffic,
    and whether it spills depends on the assembler: the same source can be clean under one NVRTC
    and spill under another (ptxas 13.3 to 13.5 spill 8 bytes in the 24-register producer of some
    2-CTA cluster variants that 13.0 to 13.2 compile clean), so the check runs after every
    compile, on the local compiler's report, not in the resource model.
    """
    r = binary.resources
    if not r.spills:
        return None
    return (f"spills registers under {binary.compiler} ({r.spill_stores} bytes spill stores, {r.spill_loads} bytes "
            f"spill loads, {r.registers} registers): rejected after compiling")


def _headers_digest(include_dirs: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for d in include_dirs:
        for p in sorted(Path(d).rglob("*")):
            if p.is_file():
                h.update(str(p.relative_to(d)).encode())
                h.update(b"\0")
                h.update(p.read_bytes())
    return h.hexdigest()


class Compiler(ABC):
    """Compile rendered sources for a named target, through the on-disk cache."""

    name: str = "?"

    def __init__(self, cache_dir: Path | str | None = None, source_dir: Path | str | None = None):
        self.cache = DiskCache(cache_dir or knobs.cache_dir())
        self.source_dir = Path(source_dir or knobs.out_dir() / "src")

    @abstractmethod
    def version(self) -> str:
        """Compiler version string; part of every cache key."""

    @abstractmethod
    def options(self, target: str) -> list[str]:
        """Command-line options for ``target`` (include paths are added separately)."""

    @abstractmethod
    def _compile(self, source: Source, target: str, options: list[str], source_path: str) -> tuple[bytes, str]:
        """Compile once, no cache: return (binary, log) or raise CompileError."""

    def parse_resources(self, data: bytes, log: str, symbol: str, target: str) -> KernelResources:
        """The resource report of ``symbol`` (ptxas -v for NVIDIA; AMD compilers override)."""
        return parse_ptxas_report(log, symbol)

    def key(self, source: Source, target: str) -> str:
        h = hashlib.sha256()
        for part in (CACHE_FORMAT, self.name, self.version(), target, json.dumps(self.options(target)), source.text,
                     json.dumps(source.include_dirs and [_headers_digest(source.include_dirs)])):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:40]

    def compile(self, source: Source, target: str, use_cache: bool = True) -> Binary:
        """Compile ``source`` for ``target``; identical requests are served from the cache.

        The rendered source is written under the source directory first, so a CompileError can
        point at the exact text that failed.
        """
        key = self.key(source, target)
        source_path = str(source.write(self.source_dir / target))
        if use_cache:
            hit = self._load(key, source, target, source_path)
            if hit is not None:
                return hit
            with self.cache.lock(key):
                # Another process may have built it; a corrupt entry is discarded (we hold the lock).
                hit = self._load(key, source, target, source_path, discard_corrupt=True)
                if hit is not None:
                    return hit
                return self._build(key, source, target, source_path, publish=True)
        return self._build(key, source, target, source_path, publish=False)

    def _build(self, key: str, source: Source, target: str, source_path: str, publish: bool) -> Binary:
        options = self.options(target) + [f"-I{d}" for d in source.include_dirs]
        data, log = self._compile(source, target, options, source_path)
        resources = self.parse_resources(data, log, source.symbol, target)
        binary = Binary(data, target, source.symbol, key, resources, f"{self.name} {self.version()}", log, source_path)
        if publish:
            meta = {"symbol": source.symbol, "target": target, "compiler": binary.compiler,
                    "resources": asdict(resources), "log": log}
            self.cache.put(key, {"kernel.bin": data, "meta.json": json.dumps(meta, indent=1).encode()})
        return binary

    def _load(self, key: str, source: Source, target: str, source_path: str,
              discard_corrupt: bool = False) -> Binary | None:
        files = self.cache.get(key, discard_corrupt=discard_corrupt)
        if files is None:
            return None
        try:
            meta = json.loads(files["meta.json"])
            res = dict(meta["resources"])
            res["warnings"] = tuple(res.get("warnings", ()))
            binary = Binary(files["kernel.bin"], target, source.symbol, key, KernelResources(**res),
                            meta["compiler"], meta.get("log", ""), source_path, from_cache=True)
        except (KeyError, TypeError, ValueError) as exc:  # checksums match, yet not an entry we wrote
            if discard_corrupt:
                self.cache.discard(key, f"{type(exc).__name__}: {exc}")
            return None
        return binary


class NvrtcCompiler(Compiler):
    """CUDA C++ to CUBIN through NVRTC (the library from the nvidia-cuda-nvrtc wheel)."""

    name = "nvrtc"

    def __init__(self, *args, extra_options: tuple[str, ...] = (), **kwargs):
        super().__init__(*args, **kwargs)
        self.extra_options = tuple(extra_options)

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def _nvrtc():
        library = knobs.nvrtc_library()
        if library is not None:
            # cuda-bindings finds libnvrtc through cuda-pathfinder, which takes a copy already
            # loaded in the process before it looks in site-packages: loading the named library
            # first is how one installation compiles with another NVRTC (CI runs the oldest one).
            # NVRTC 13.0 opens its builtins library by name at the first compile, without looking
            # beside itself: loaded first, the soname matches and the right one is used.
            builtins = sorted(library.parent.glob("libnvrtc-builtins.so.*"))
            try:
                for lib in [b for b in builtins if ".alt." not in b.name] + [library]:
                    ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL)
            except OSError as exc:
                raise NoDeviceError(f"{knobs.NVRTC_LIBRARY.name}={library}: cannot load it ({exc})") from None
        try:
            from cuda.bindings import nvrtc
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise NoDeviceError(f"cuda-bindings is not installed ({exc}); pip install cuda-bindings") from None
        return nvrtc

    @staticmethod
    def library_path() -> str:
        """Where the NVRTC library in use was loaded from."""
        NvrtcCompiler._nvrtc()
        try:
            from cuda.pathfinder import load_nvidia_dynamic_lib

            return load_nvidia_dynamic_lib("nvrtc").abs_path or "?"
        except Exception as exc:  # pragma: no cover - older cuda-pathfinder, or a system library
            return f"? ({type(exc).__name__})"

    def version(self) -> str:
        nvrtc = self._nvrtc()
        err, major, minor = nvrtc.nvrtcVersion()
        _check(nvrtc, err, "nvrtcVersion")
        return f"{major}.{minor}"

    def supported_targets(self) -> list[str]:
        nvrtc = self._nvrtc()
        err, archs = nvrtc.nvrtcGetSupportedArchs()
        _check(nvrtc, err, "nvrtcGetSupportedArchs")
        return [f"sm_{a}" for a in archs]

    def options(self, target: str) -> list[str]:
        return ["-std=c++17", f"-arch={target}", "-Xptxas=-v", "-lineinfo", "-DNDEBUG", *self.extra_options]

    def _compile(self, source: Source, target: str, options: list[str], source_path: str) -> tuple[bytes, str]:
        nvrtc = self._nvrtc()
        base = target.rstrip("af")
        if base not in self.supported_targets():
            raise CompileError(
                f"NVRTC {self.version()} cannot compile for {target} (supports {', '.join(self.supported_targets())})",
                source_path=source_path,
            )
        err, prog = nvrtc.nvrtcCreateProgram(source.text.encode(), source.name.encode(), 0, [], [])
        _check(nvrtc, err, "nvrtcCreateProgram")
        try:
            opts = [o.encode() for o in options]
            (compile_err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            err, size = nvrtc.nvrtcGetProgramLogSize(prog)
            _check(nvrtc, err, "nvrtcGetProgramLogSize")
            log_buf = b" " * size
            (err,) = nvrtc.nvrtcGetProgramLog(prog, log_buf)
            _check(nvrtc, err, "nvrtcGetProgramLog")
            log = log_buf.rstrip(b"\0 ").decode(errors="replace")
            if compile_err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise CompileError(f"NVRTC failed to compile {source.name} for {target}", log, source_path)
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            _check(nvrtc, err, "nvrtcGetCUBINSize")
            cubin = b" " * size
            (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
            _check(nvrtc, err, "nvrtcGetCUBIN")
            return cubin, log
        finally:
            nvrtc.nvrtcDestroyProgram(prog)


def _check(nvrtc, err, what: str) -> None:
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise CompileError(f"{what} failed: {msg.decode() if isinstance(msg, bytes) else msg}")


class _AmdCompiler(Compiler):
    """What the AMD compilers share: the code object's metadata is their resource report."""

    def parse_resources(self, data: bytes, log: str, symbol: str, target: str) -> KernelResources:
        from .backends import hip

        warnings = tuple(line.strip() for line in log.splitlines() if "warning:" in line)
        return KernelResources(**hip.code_object_resources(data, symbol, target), warnings=warnings)


class OfflineClangCompiler(_AmdCompiler):
    """HIP source to an AMDGPU code object with an offline clang (>= 20); no ROCm needed."""

    def __init__(self, *args, clang=None, **kwargs):
        from .backends import hip

        super().__init__(*args, **kwargs)
        self.clang = clang or hip.find_clang()
        if self.clang is None:
            raise NoDeviceError(
                f"no clang >= {hip.MIN_CLANG_MAJOR} with the AMDGPU backend was found to compile for AMD targets: "
                "apt-get install clang-22 lld-22 llvm-22, or pip install ziglang, or set MLAGEN_HIP_CLANG")
        self.name = self.clang.name

    def version(self) -> str:
        return self.clang.version

    def options(self, target: str) -> list[str]:
        from .backends import hip

        return hip.clang_options(target)

    def _compile(self, source: Source, target: str, options: list[str], source_path: str) -> tuple[bytes, str]:
        from .backends import hip

        return hip.clang_compile(self.clang, source.text, source.name, target, options, source_path)


class HiprtcCompiler(_AmdCompiler):
    """HIP source to an AMDGPU code object through hipRTC (ROCm's runtime compiler, hip-python)."""

    name = "hiprtc"

    def version(self) -> str:
        from .backends import hip

        return hip.hiprtc_version()

    def options(self, target: str) -> list[str]:
        from .backends import hip

        return hip.hiprtc_options(target)

    def _compile(self, source: Source, target: str, options: list[str], source_path: str) -> tuple[bytes, str]:
        from .backends import hip

        return hip.hiprtc_compile(source.text, source.name, target, options, source_path)


def hip_compiler(**kwargs) -> Compiler:
    """The AMD compiler for this machine: hipRTC where ROCm loads (MLAGEN_HIP_COMPILER=auto), else
    the offline clang; ``hiprtc`` / ``clang`` force one."""
    from .backends import hip

    choice = knobs.hip_compiler()
    if choice == "hiprtc" or (choice == "auto" and hip.rocm_available()):
        return HiprtcCompiler(**kwargs)
    return OfflineClangCompiler(**kwargs)


def for_target(target: str, **kwargs) -> Compiler:
    """The compiler for a target's vendor."""
    from . import arch

    vendor = arch.target(target).vendor
    if vendor == "cuda":
        return NvrtcCompiler(**kwargs)
    if vendor == "hip":
        return hip_compiler(**kwargs)
    raise NoDeviceError(f"no compiler for vendor {vendor!r}")  # pragma: no cover


def save_binary(binary: Binary, directory: Path | str) -> Path:
    """Write the binary as ``<symbol>.<target>.cubin`` (``.hsaco`` for AMD), its report beside it."""
    from . import arch

    directory = Path(directory)
    suffix = arch.TARGETS[binary.target].binary_suffix if binary.target in arch.TARGETS else "cubin"
    path = directory / f"{binary.symbol}.{binary.target}.{suffix}"
    atomic_write(path, binary.data)
    atomic_write(path.with_suffix(".json"), json.dumps(
        {"symbol": binary.symbol, "target": binary.target, "compiler": binary.compiler, "key": binary.key,
         "resources": asdict(binary.resources)}, indent=1).encode())
    return path
