"""NVIDIA: NVRTC compiles CUDA C++ to CUBIN, the driver API (cuda-bindings) loads and launches it.

Every NVRTC call goes through :func:`nvrtc_check` (a CompileError carrying the compile log) and
every driver call through :func:`check` (a DriverError naming the call and the driver's error).
Launching does no host synchronisation, so launches can be captured in CUDA graphs. The resource
report is ptxas' ``-v`` log (:func:`parse_ptxas_report`). Besides the backend, the CUDA-only
device helpers the Hopper launchers use: TMA descriptors and driver memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import threading

from .. import knobs
from ..abi import PackedParams
from ..errors import CompileError, DriverError, NoDeviceError
from ..source import Source
from .base import Backend, Binary, Compiler, DeviceInfo, Kernel, KernelResources, Runtime

# --- compiling -------------------------------------------------------------------------------

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


class NvrtcCompiler(Compiler):
    """CUDA C++ to CUBIN through NVRTC (the library from the nvidia-cuda-nvrtc wheel)."""

    name = "nvrtc"
    vendor = "cuda"

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
        nvrtc_check(err, "nvrtcVersion")
        return f"{major}.{minor}"

    def supported_targets(self) -> list[str]:
        nvrtc = self._nvrtc()
        err, archs = nvrtc.nvrtcGetSupportedArchs()
        nvrtc_check(err, "nvrtcGetSupportedArchs")
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
        nvrtc_check(err, "nvrtcCreateProgram", source_path=source_path)
        try:
            opts = [o.encode() for o in options]
            (compile_err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
            err, size = nvrtc.nvrtcGetProgramLogSize(prog)
            nvrtc_check(err, "nvrtcGetProgramLogSize", source_path=source_path)
            log_buf = b" " * size
            (err,) = nvrtc.nvrtcGetProgramLog(prog, log_buf)
            nvrtc_check(err, "nvrtcGetProgramLog", source_path=source_path)
            log = log_buf.rstrip(b"\0 ").decode(errors="replace")
            nvrtc_check(compile_err, "nvrtcCompileProgram", log, source_path,
                        message=f"NVRTC failed to compile {source.name} for {target}")
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            nvrtc_check(err, "nvrtcGetCUBINSize", log, source_path)
            cubin = b" " * size
            (err,) = nvrtc.nvrtcGetCUBIN(prog, cubin)
            nvrtc_check(err, "nvrtcGetCUBIN", log, source_path)
            return cubin, log
        finally:
            (err,) = nvrtc.nvrtcDestroyProgram(prog)
            nvrtc_check(err, "nvrtcDestroyProgram", source_path=source_path)

    def parse_resources(self, data: bytes, log: str, symbol: str, target: str) -> KernelResources:
        return parse_ptxas_report(log, symbol)


def nvrtc_check(err, what: str, log: str = "", source_path: str | None = None, message: str | None = None) -> None:
    """Raise CompileError (with the compile log, where there is one) unless ``err`` is NVRTC_SUCCESS.
    ``message`` replaces "<what> failed" (the compile's own sentence)."""
    nvrtc = NvrtcCompiler._nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        if message is not None:
            raise CompileError(message, log, source_path)
        _, msg = nvrtc.nvrtcGetErrorString(err)
        raise CompileError(f"{what} failed: {msg.decode() if isinstance(msg, bytes) else msg}", log, source_path)


# --- the driver ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:  # pragma: no cover
        raise NoDeviceError(f"cuda-bindings is not installed ({exc})") from None
    return driver


@functools.lru_cache(maxsize=None)
def _raw_driver():
    """(cuLaunchKernel, cuMemsetD32Async) of the driver through ctypes, or None where libcuda cannot
    be loaded. The launch path's two driver calls, without cuda-bindings' per-argument object
    conversions (about 10 us a call on the H100 machine's host; docs/notes.md, "Host time per
    call"). The library is the one cuda-bindings opened (one driver per process), so the handles
    it returned are valid here."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    launch = lib.cuLaunchKernel
    launch.argtypes = (ctypes.c_void_p,) + (ctypes.c_uint,) * 7 + (ctypes.c_void_p,) * 3
    launch.restype = ctypes.c_int
    memset = lib.cuMemsetD32Async
    memset.argtypes = (ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p)
    memset.restype = ctypes.c_int
    return launch, memset


def check(result, what: str):
    """Unpack a cuda-bindings result tuple; raise DriverError if its status is not success."""
    driver = _driver()
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        _, text = driver.cuGetErrorString(err)
        name = name.decode() if isinstance(name, bytes) else name
        text = text.decode() if isinstance(text, bytes) else text
        raise DriverError(f"{what} failed: {name}: {text}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


_init_lock = threading.Lock()
_initialised = False


def _init() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            try:
                check(_driver().cuInit(0), "cuInit")
            except DriverError as exc:
                raise NoDeviceError(f"no usable CUDA driver or device: {exc}") from None
            except Exception as exc:  # libcuda.so missing: the bindings raise their own error type
                raise NoDeviceError(f"no CUDA driver library: {exc}") from None
            _initialised = True


# --- loading and launching --------------------------------------------------------------------


class CudaKernel(Kernel):
    """A loaded CUBIN entry point; dynamic shared memory beyond 48 KB is opted into once per size."""

    def __init__(self, module, function, binary: Binary, smem_limit: int):
        super().__init__(module, function, binary)
        self._handle = int(function)  # the CUfunction's address, for the ctypes launch
        self._smem_configured = 0
        self._smem_limit = smem_limit

    def _entry(self, name: str) -> CudaKernel:
        function = check(_driver().cuModuleGetFunction(self.module, name.encode()), f"cuModuleGetFunction({name})")
        return CudaKernel(self.module, function, self.binary, self._smem_limit)

    def _ensure_smem(self, smem: int) -> None:
        if smem <= self._smem_configured:
            return
        with self._lock:
            if smem > self._smem_limit:
                raise DriverError(
                    f"{self.binary.symbol} needs {smem} bytes of dynamic shared memory; "
                    f"the device allows {self._smem_limit}"
                )
            d = _driver()
            check(d.cuFuncSetAttribute(self.function,
                                       d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                  f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={smem}) for {self.binary.symbol}")
            self._smem_configured = smem

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: int,
               params: PackedParams) -> None:
        """Launch on ``stream``. A kernel that runs in clusters has its cluster shape compiled in
        (``__cluster_dims__``), so a plain launch forms the clusters; ``grid`` must be a multiple."""
        self._ensure_smem(smem)
        raw = _raw_driver()
        if raw is not None:
            err = raw[0](self._handle, *grid, *block, smem, stream, params.kernel_params, None)
            if err:
                check(_driver().CUresult(err), f"cuLaunchKernel({self.binary.symbol})")
            return
        d = _driver()
        check(d.cuLaunchKernel(self.function, *grid, *block, smem, d.CUstream(stream), params.kernel_params, 0),
              f"cuLaunchKernel({self.binary.symbol})")


class CudaRuntime(Runtime):
    """Loads CUBINs into a device's primary context (the one torch uses)."""

    vendor = "cuda"

    def __init__(self):
        super().__init__()
        self._contexts: dict[int, object] = {}

    def device_count(self) -> int:
        _init()
        return int(check(_driver().cuDeviceGetCount(), "cuDeviceGetCount"))

    def _device_info(self, index: int) -> DeviceInfo:
        _init()
        d = _driver()
        dev = check(d.cuDeviceGet(index), "cuDeviceGet")
        name = check(d.cuDeviceGetName(256, dev), "cuDeviceGetName")
        name = name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name)
        A = d.CUdevice_attribute

        def attr(a):
            return check(d.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a.name})")

        version = check(d.cuDriverGetVersion(), "cuDriverGetVersion")
        return DeviceInfo(
            index=index,
            name=name,
            compute=(attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                     attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
            sm_count=attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            driver_version=f"{version // 1000}.{version % 1000 // 10}",
            smem_per_block_optin=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            l2_bytes=attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
            pci=f"{attr(A.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID):04x}:{attr(A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID):02x}:"
                f"{attr(A.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID):02x}",
        )

    def _primary(self, index: int):
        """Device ``index``'s primary context (the one torch's runtime uses), retained once."""
        ctx = self._contexts.get(index)
        if ctx is None:
            d = _driver()
            dev = check(d.cuDeviceGet(index), "cuDeviceGet")
            ctx = self._contexts[index] = check(d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        return ctx

    @contextlib.contextmanager
    def _context(self, index: int):
        """Device ``index``'s primary context current inside: made current where the thread has
        none (and left so, as torch's runtime would), else pushed over the caller's and popped."""
        d = _driver()
        target = self._primary(index)
        current = check(d.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if current is None or int(current) == 0:
            check(d.cuCtxSetCurrent(target), "cuCtxSetCurrent")
            yield
        elif int(current) == int(target):
            yield
        else:
            check(d.cuCtxPushCurrent(target), "cuCtxPushCurrent")
            try:
                yield
            finally:
                check(d.cuCtxPopCurrent(), "cuCtxPopCurrent")

    def _load(self, binary: Binary, index: int) -> CudaKernel:
        # Into device ``index``'s primary context, whichever context is current on the calling
        # thread: loaded into the current one, a kernel for tensors on cuda:1 while torch's current
        # device is 0 failed at launch with CUDA_ERROR_INVALID_HANDLE (2x H200).
        _init()
        with self._context(index):
            d = _driver()
            module = check(d.cuModuleLoadData(binary.data), f"cuModuleLoadData({binary.symbol})")
            function = check(d.cuModuleGetFunction(module, binary.symbol.encode()),
                             f"cuModuleGetFunction({binary.symbol})")
        return CudaKernel(module, function, binary, self.device_info(index).smem_per_block_optin)


class CudaBackend(Backend):
    vendor = "cuda"

    def compiler(self, **kwargs) -> NvrtcCompiler:
        return NvrtcCompiler(**kwargs)

    def _new_runtime(self) -> CudaRuntime:
        return CudaRuntime()


BACKEND = CudaBackend()


# --- CUDA-only device helpers (the Hopper launchers') ---------------------------------------


def device_alloc(nbytes: int) -> int:
    """Device memory from the driver in the current context, outside torch's caching allocator,
    so no memory pool (a CUDA graph's, or torch.compile's) ever holds it. Never freed: for small
    buffers a process keeps."""
    return int(check(_driver().cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"))


def memset_d32_async(address: int, value: int, count: int, stream: int) -> None:
    """``count`` 32-bit words at ``address`` set to ``value``, in order on ``stream``."""
    raw = _raw_driver()
    if raw is not None:
        err = raw[1](address, value, count, stream)
        if err:
            check(_driver().CUresult(err), "cuMemsetD32Async")
        return
    d = _driver()
    check(d.cuMemsetD32Async(d.CUdeviceptr(address), value, count, d.CUstream(stream)), "cuMemsetD32Async")


def encode_tensor_map_bf16(address: int, dims: list[int], strides_bytes: list[int], box: list[int],
                           swizzle_bytes: int, what: str) -> bytes:
    """A TMA descriptor (128 bytes) for a bf16 tensor; dims innermost first, strides for dims[1:]."""
    return encode_tensor_map(address, dims, strides_bytes, box, swizzle_bytes, what, 2)


def encode_tensor_map(address: int, dims: list[int], strides_bytes: list[int], box: list[int],
                      swizzle_bytes: int, what: str, element_bytes: int) -> bytes:
    """A TMA descriptor (128 bytes) for a tensor of bf16 (``element_bytes`` 2) or of bytes (1: fp8,
    moved as uint8); dims innermost first, strides for dims[1:]."""
    d = _driver()
    dtype = {2: d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             1: d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT8}[element_bytes]
    sw = {0: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
          32: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_32B,
          64: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B,
          128: d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}[swizzle_bytes]
    rank = len(dims)
    tmap = check(d.cuTensorMapEncodeTiled(
        dtype, rank, address,
        [d.cuuint64_t(x) for x in dims], [d.cuuint64_t(x) for x in strides_bytes],
        [d.cuuint32_t(x) for x in box], [d.cuuint32_t(1)] * rank,
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), f"cuTensorMapEncodeTiled({what})")
    return _tensor_map_bytes(tmap)


def _tensor_map_bytes(tmap) -> bytes:
    ptr = int(tmap.getPtr())
    return ctypes.string_at(ptr, 128)
