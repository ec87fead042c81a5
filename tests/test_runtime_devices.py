"""Loading a kernel for a device other than the caller's current one (tensors on cuda:1 while
torch's current device is 0), GPU-free: the CUDA and HIP loaders against fake drivers that
record which context or device each module went to. tests/gpu/test_multi_device_gpu.py runs the
same on two GPUs."""

from __future__ import annotations

import types

import pytest

from mlagen.backends import cuda as cuda_backend
from mlagen.backends import hip as hip_backend
from mlagen.backends.base import Binary, KernelResources


def _binary(symbol="k"):
    return Binary(data=b"\0", target="sm_90a", symbol=symbol, key=symbol, resources=KernelResources(), compiler="x")


class FakeCudaDriver:
    """Contexts are ints (device + 1); a thread's context stack is a list; modules remember the
    context they were loaded into."""

    def __init__(self, current: int):
        self.stack = [current] if current else []
        self.loaded = []

    def _ok(self, *rest):
        return (0, *rest) if rest else (0,)

    def cuDeviceGet(self, index):
        return self._ok(index)

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._ok(dev + 1)

    def cuCtxGetCurrent(self):
        return self._ok(self.stack[-1] if self.stack else 0)

    def cuCtxSetCurrent(self, ctx):
        if self.stack:
            self.stack[-1] = ctx
        else:
            self.stack.append(ctx)
        return self._ok()

    def cuCtxPushCurrent(self, ctx):
        self.stack.append(ctx)
        return self._ok()

    def cuCtxPopCurrent(self):
        return self._ok(self.stack.pop())

    def cuModuleLoadData(self, data):
        self.loaded.append(self.stack[-1])
        return self._ok(100 + self.stack[-1])       # a module handle that names its context

    def cuModuleGetFunction(self, module, name):
        return self._ok(module + 900)


@pytest.fixture
def cuda(monkeypatch):
    def make(current):
        fake = FakeCudaDriver(current)
        monkeypatch.setattr(cuda_backend, "_driver", lambda: fake)
        monkeypatch.setattr(cuda_backend, "_init", lambda: None)
        monkeypatch.setattr(cuda_backend, "check", lambda result, what: result[1] if len(result) == 2 else None)
        info = types.SimpleNamespace(smem_per_block_optin=227 * 1024)
        rt = cuda_backend.CudaRuntime()
        monkeypatch.setattr(rt, "_device_info", lambda index: info)
        monkeypatch.setattr(rt, "current_device", lambda: current - 1)
        return fake, rt
    return make


def test_cuda_load_for_another_device_uses_its_context_and_restores_the_callers(cuda):
    fake, rt = cuda(current=1)                       # device 0's context is current
    kernel = rt.load(_binary(), device=1)
    assert fake.loaded == [2]                        # device 1's primary context
    assert kernel.function == 1002
    assert fake.stack == [1]                         # the caller's context again
    assert rt.load(_binary(), device=1) is kernel    # loaded once per device
    rt.load(_binary(), device=0)
    assert fake.loaded == [2, 1] and fake.stack == [1]


def test_cuda_load_on_a_thread_without_a_context_makes_the_devices_current(cuda):
    fake, rt = cuda(current=0)                       # no context on this thread
    rt.load(_binary(), device=1)
    assert fake.loaded == [2] and fake.stack == [2]


class FakeHip:
    def __init__(self, current: int):
        self.device = current
        self.loaded = []

    def hipGetDevice(self):
        return (0, self.device)

    def hipSetDevice(self, device):
        self.device = device
        return (0,)

    def hipModuleLoadData(self, data):
        self.loaded.append(self.device)
        return (0, ("module", self.device))

    def hipModuleGetFunction(self, module, name):
        return (0, ("function", module[1]))


@pytest.mark.parametrize("current", [0, 1])
def test_hip_load_for_a_device_restores_the_callers_device(monkeypatch, current):
    fake = FakeHip(current)
    monkeypatch.setattr(hip_backend, "_hip_modules", lambda: (fake, None))
    module, function = hip_backend.module_load(b"\0", "k", 1)
    assert fake.loaded == [1] and function == ("function", 1)
    assert fake.device == current


def test_hip_runtime_loads_once_per_device_and_finds_other_entries(monkeypatch):
    fake = FakeHip(0)
    monkeypatch.setattr(hip_backend, "_hip_modules", lambda: (fake, None))
    rt = hip_backend.HipRuntime()
    monkeypatch.setattr(rt, "current_device", lambda: 0)
    kernel = rt.load(_binary(), device=1)
    assert isinstance(kernel, hip_backend.HipKernel) and fake.loaded == [1] and fake.device == 0
    assert rt.load(_binary(), device=1) is kernel and fake.loaded == [1]
    assert rt.load(_binary()) is not kernel and fake.loaded == [1, 0]     # the current device's own copy
    other = kernel.entry("k_mark")
    assert other.function == ("function", 1) and other.binary is kernel.binary and kernel.entry("k_mark") is other


def test_cuda_kernel_entries_come_from_its_module_once(cuda):
    fake, rt = cuda(current=1)
    kernel = rt.load(_binary(), device=1)
    calls = []
    real = fake.cuModuleGetFunction
    fake.cuModuleGetFunction = lambda module, name: calls.append(name) or real(module, name)
    mark = kernel.entry("k_mark")
    assert isinstance(mark, cuda_backend.CudaKernel) and mark.module == kernel.module
    assert kernel.entry("k_mark") is mark and calls == [b"k_mark"]


def test_the_backend_is_chosen_by_the_vendor():
    from mlagen import backends
    from mlagen.errors import NoDeviceError

    assert backends.for_target("sm_90a") is backends.get("cuda") is cuda_backend.BACKEND
    assert backends.for_target("gfx942") is backends.get("hip") is hip_backend.BACKEND
    assert isinstance(backends.get("cuda").runtime(), cuda_backend.CudaRuntime)
    assert isinstance(backends.get("hip").runtime(), hip_backend.HipRuntime)
    assert backends.get("hip").runtime() is backends.get("hip").runtime()      # one per process
    with pytest.raises(NoDeviceError, match="no backend for vendor 'metal' \\(known: cuda, hip\\)"):
        backends.get("metal")
