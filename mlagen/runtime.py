"""Load binaries with the CUDA driver API and launch them on the caller's torch stream.

Every driver call goes through ``check``, which raises DriverError naming the call and the
driver's error. Launching does no host synchronisation, so launches can be captured in CUDA
graphs. On ROCm torch (``torch.version.hip``) the HIP siblings (``HipRuntime``, ``HipKernel``)
implement the same ``device_info``/``load``/``launch`` on ``backends/hip.py`` (hip-python).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from dataclasses import dataclass

from .abi import PackedParams
from .compiler import Binary
from .errors import DriverError, NoDeviceError


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


def current_stream(torch, device: int) -> int:
    """The handle of torch's current stream on ``device`` (torch's raw accessor where it has one:
    a tenth of the cost of building a Stream object, on every call). ``torch`` is passed in, so
    this module does not import it."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


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
    def target(self):
        from . import arch

        if self.arch_name:
            return arch.for_gcn_arch(self.arch_name)
        return arch.for_compute_capability(*self.compute)


def _hip_device_info(index: int) -> DeviceInfo:
    from .backends import hip

    p = hip.device_properties(index)
    return DeviceInfo(index=index, name=p["name"], compute=p["compute"], sm_count=p["sm_count"],
                      driver_version=p["driver_version"], smem_per_block_optin=p["smem_per_block"],
                      l2_bytes=p["l2_bytes"], arch_name=p["arch_name"])


def vendor() -> str:
    """``"hip"`` under a ROCm build of torch (its ``torch.cuda`` drives HIP devices), else ``"cuda"``."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return "cuda"
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


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


def device_count() -> int:
    """CUDA devices the driver sees (after ``CUDA_VISIBLE_DEVICES``)."""
    _init()
    return int(check(_driver().cuDeviceGetCount(), "cuDeviceGetCount"))


@functools.lru_cache(maxsize=None)
def device_info(index: int = 0) -> DeviceInfo:
    if vendor() == "hip":
        return _hip_device_info(index)
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
        compute=(attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        sm_count=attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        driver_version=f"{version // 1000}.{version % 1000 // 10}",
        smem_per_block_optin=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        l2_bytes=attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        pci=f"{attr(A.CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID):04x}:{attr(A.CU_DEVICE_ATTRIBUTE_PCI_BUS_ID):02x}:"
            f"{attr(A.CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID):02x}",
    )


class CudaKernel:
    """A loaded entry point. ``launch`` is the hot path: no synchronisation, no allocation on device."""

    def __init__(self, module, function, binary: Binary, smem_limit: int):
        self.module = module
        self.function = function
        self._handle = int(function)  # the CUfunction's address, for the ctypes launch
        self.binary = binary
        self._smem_configured = 0
        self._smem_limit = smem_limit
        self._lock = threading.Lock()
        self._entries: dict[str, "CudaKernel"] = {}

    def entry(self, name: str) -> "CudaKernel":
        """Another entry point of the same module (e.g. a pre-pass the launcher runs first)."""
        kernel = self._entries.get(name)
        if kernel is None:
            with self._lock:
                kernel = self._entries.get(name)
                if kernel is None:
                    d = _driver()
                    function = check(d.cuModuleGetFunction(self.module, name.encode()), f"cuModuleGetFunction({name})")
                    kernel = CudaKernel(self.module, function, self.binary, self._smem_limit)
                    self._entries[name] = kernel
        return kernel

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


class CudaRuntime:
    """Loads CUBINs into the current device's primary context (the one torch uses)."""

    vendor = "cuda"

    def __init__(self):
        self._kernels: dict[tuple[int, str], CudaKernel] = {}
        self._contexts: dict[int, object] = {}
        self._lock = threading.Lock()

    def current_device(self) -> int:
        import torch

        return torch.cuda.current_device()

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

    def load(self, binary: Binary, device: int | None = None) -> CudaKernel:
        """Load (once per device) and return the kernel; later calls are a dictionary lookup.

        The module goes into ``device``'s primary context, whichever context is current on the
        calling thread (tensors on cuda:1 while torch's current device is 0), and the caller's
        context is current again afterwards."""
        index = self.current_device() if device is None else device
        cache_key = (index, binary.key)
        kernel = self._kernels.get(cache_key)
        if kernel is not None:
            return kernel
        with self._lock:
            kernel = self._kernels.get(cache_key)
            if kernel is None:
                _init()
                with self._context(index):
                    d = _driver()
                    module = check(d.cuModuleLoadData(binary.data), f"cuModuleLoadData({binary.symbol})")
                    function = check(d.cuModuleGetFunction(module, binary.symbol.encode()),
                                     f"cuModuleGetFunction({binary.symbol})")
                info = device_info(index)
                kernel = CudaKernel(module, function, binary, info.smem_per_block_optin)
                self._kernels[cache_key] = kernel
        return kernel


class HipKernel:
    """A loaded AMD kernel; ``launch`` has the same signature as CudaKernel's."""

    def __init__(self, module, function, binary: Binary):
        self.module = module
        self.function = function
        self._handle = int(function)  # the CUfunction's address, for the ctypes launch
        self.binary = binary

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int, stream: int,
               params: PackedParams) -> None:
        """Launch on ``stream`` (ROCm torch's ``torch.cuda`` stream handles are HIP streams). The
        gfx9 kernels declare their LDS statically, so only what a launch asks beyond that is
        passed as dynamic LDS."""
        from .backends import hip

        dynamic = max(0, smem - self.binary.resources.smem_static)
        hip.launch(self.function, self.binary.symbol, grid, block, dynamic, stream, params.kernel_params)


class HipRuntime:
    """Loads AMDGPU code objects on the current HIP device (the one ROCm torch uses)."""

    vendor = "hip"

    def __init__(self):
        self._kernels: dict[tuple[int, str], HipKernel] = {}
        self._lock = threading.Lock()

    def current_device(self) -> int:
        import torch

        return torch.cuda.current_device()

    def load(self, binary: Binary, device: int | None = None) -> HipKernel:
        """Load (once per device) and return the kernel; later calls are a dictionary lookup."""
        from .backends import hip

        index = self.current_device() if device is None else device
        key = (index, binary.key)
        kernel = self._kernels.get(key)
        if kernel is not None:
            return kernel
        with self._lock:
            kernel = self._kernels.get(key)
            if kernel is None:
                module, function = hip.module_load(binary.data, binary.symbol, index)
                kernel = self._kernels[key] = HipKernel(module, function, binary)
        return kernel


@functools.lru_cache(maxsize=None)
def runtime():
    """The runtime of this torch build's devices: CudaRuntime, or HipRuntime on ROCm."""
    if vendor() == "hip":
        return HipRuntime()
    return CudaRuntime()


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
    import ctypes

    ptr = int(tmap.getPtr())
    return ctypes.string_at(ptr, 128)
