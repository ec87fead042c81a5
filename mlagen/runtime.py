"""The devices of this process, whichever the vendor: the runtime that loads kernels, device facts.

A CUDA build of torch drives NVIDIA devices, a ROCm build (``torch.version.hip``) HIP devices
through the same ``torch.cuda``; :func:`vendor` tells which, and :func:`runtime` is that vendor's
backend runtime (``backends/cuda.py``'s ``CudaRuntime`` or ``backends/hip.py``'s ``HipRuntime``,
one interface: ``backends/base.py``'s ``Runtime``), so dispatch, the API, tuning and the GPU tests
name no vendor.
"""

from __future__ import annotations

import functools

from . import backends
from .backends.base import DeviceInfo, Kernel, Runtime
# CUDA-only device helpers the Hopper launchers call (TMA descriptors, driver memory); they live in
# the CUDA backend and are named here for the families that import them from this module.
from .backends.cuda import device_alloc, encode_tensor_map, encode_tensor_map_bf16, memset_d32_async

__all__ = ["DeviceInfo", "Kernel", "Runtime", "current_stream", "device_alloc", "device_count", "device_info",
           "encode_tensor_map", "encode_tensor_map_bf16", "memset_d32_async", "runtime", "vendor"]


def vendor() -> str:
    """``"hip"`` under a ROCm build of torch (its ``torch.cuda`` drives HIP devices), else ``"cuda"``."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return "cuda"
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


@functools.lru_cache(maxsize=None)
def runtime() -> Runtime:
    """The runtime of this torch build's devices (one per process)."""
    return backends.get(vendor()).runtime()


def device_count() -> int:
    """Devices the driver sees (after ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``)."""
    return runtime().device_count()


def device_info(index: int = 0) -> DeviceInfo:
    """Device ``index``'s name, target, SM count, driver and limits (asked once per device)."""
    return runtime().device_info(index)


def current_stream(torch, device: int) -> int:
    """The handle of torch's current stream on ``device`` (torch's raw accessor where it has one:
    a tenth of the cost of building a Stream object, on every call). ``torch`` is passed in, so
    this module does not import it."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream
