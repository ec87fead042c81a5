"""The backend interface: what every vendor (``cuda.py``, ``hip.py``) implements, and what is shared.

A backend is a compiler (rendered source in, :class:`Binary` with its resource report out), a
runtime (binaries loaded once per device, device facts) and its kernels (a loaded entry point
that launches on a stream). The parts that do not depend on the vendor live here, once: the
compile cache (:meth:`Compiler.compile`), the per-device load cache (:meth:`Runtime.load`), the
device-facts cache and the lookup of a module's other entry points (:meth:`Kernel.entry`). The
vendor modules supply only the calls into their libraries, each through their one ``check``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import arch, knobs
from ..abi import PackedParams
from ..cache import DiskCache
from ..source import Source

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
    """Compile rendered sources for a named target, through the on-disk cache.

    Caching lives in :meth:`compile` alone, keyed by a hash of everything that changes the
    output: the source, the options, the target, the compiler's name and version, and every
    header under the include directories; built under the key's lock with a second look."""

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

    @abstractmethod
    def parse_resources(self, data: bytes, log: str, symbol: str, target: str) -> KernelResources:
        """The resource report of ``symbol`` (ptxas -v for NVIDIA, the code object's metadata for AMD)."""

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


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    compute: tuple[int, int]
    sm_count: int
    driver_version: str
    smem_per_block_optin: int
    l2_bytes: int
    arch_name: str = ""  # AMD: gcnArchName without feature flags ("gfx942"); empty on NVIDIA
    pci: str = ""        # NVIDIA: the PCI location ("0000:1b:00"), which tells two GPUs of one kind apart

    @property
    def target(self) -> arch.Target | None:
        # A device names its architecture (AMD) or is known by its compute capability (NVIDIA).
        if self.arch_name:
            return arch.for_gcn_arch(self.arch_name)
        return arch.for_compute_capability(*self.compute)


class Kernel(ABC):
    """A loaded entry point. ``launch`` is the hot path: no synchronisation, no allocation on device."""

    def __init__(self, module, function, binary: Binary):
        self.module = module
        self.function = function
        self.binary = binary
        self._lock = threading.Lock()
        self._entries: dict[str, Kernel] = {}

    def entry(self, name: str) -> Kernel:
        """Another entry point of the same module (e.g. a pre-pass the launcher runs first)."""
        kernel = self._entries.get(name)
        if kernel is None:
            with self._lock:
                kernel = self._entries.get(name)
                if kernel is None:
                    kernel = self._entries[name] = self._entry(name)
        return kernel

    @abstractmethod
    def _entry(self, name: str) -> Kernel:
        """The kernel of entry point ``name`` of this kernel's module."""

    @abstractmethod
    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: int,
               params: PackedParams) -> None:
        """Launch on ``stream`` (a raw stream handle; torch's current one in the launchers)."""


class Runtime(ABC):
    """Loads binaries into a device's context (the one torch uses) and describes the devices."""

    vendor: str = "?"

    def __init__(self):
        self._kernels: dict[tuple[int, str], Kernel] = {}
        self._infos: dict[int, DeviceInfo] = {}
        self._lock = threading.Lock()

    def current_device(self) -> int:
        import torch   # ROCm torch's torch.cuda drives HIP devices: one call for both vendors

        return torch.cuda.current_device()

    @abstractmethod
    def device_count(self) -> int:
        """Devices the driver sees (after ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``)."""

    @abstractmethod
    def _device_info(self, index: int) -> DeviceInfo:
        """Ask the driver about device ``index``."""

    @abstractmethod
    def _load(self, binary: Binary, index: int) -> Kernel:
        """Load ``binary`` into device ``index``'s context, whichever device is current on the
        calling thread, leaving the caller's current again."""

    def device_info(self, index: int = 0) -> DeviceInfo:
        """Device ``index``'s facts, asked once."""
        info = self._infos.get(index)
        if info is None:
            info = self._infos[index] = self._device_info(index)
        return info

    def load(self, binary: Binary, device: int | None = None) -> Kernel:
        """Load (once per device) and return the kernel; later calls are a dictionary lookup.

        The module goes into ``device``'s context (tensors on cuda:1 while torch's current device
        is 0), and the caller's current context or device is current again afterwards."""
        index = self.current_device() if device is None else device
        key = (index, binary.key)
        kernel = self._kernels.get(key)
        if kernel is None:
            with self._lock:
                kernel = self._kernels.get(key)
                if kernel is None:
                    kernel = self._kernels[key] = self._load(binary, index)
        return kernel


class Backend(ABC):
    """One vendor: its compiler for a target and the runtime of its devices (one per process)."""

    vendor: str = "?"

    def __init__(self):
        self._runtime: Runtime | None = None
        self._lock = threading.Lock()

    @abstractmethod
    def compiler(self, **kwargs) -> Compiler:
        """The compiler for this vendor's targets (``cache_dir``, ``source_dir`` as Compiler takes them)."""

    @abstractmethod
    def _new_runtime(self) -> Runtime:
        """A runtime of this vendor's devices."""

    def runtime(self) -> Runtime:
        """The process's runtime of this vendor (its load cache is shared by every caller)."""
        if self._runtime is None:
            with self._lock:
                if self._runtime is None:
                    self._runtime = self._new_runtime()
        return self._runtime
