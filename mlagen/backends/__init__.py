"""Vendor backends, one module each, behind one interface (``base.py``), chosen by vendor.

``cuda``: NVIDIA (NVRTC, the driver API through cuda-bindings). ``hip``: AMD Instinct (gfx942,
gfx950: hipRTC or an offline clang, the HIP module API through hip-python, the AMDGPU code object
reader). A target names its vendor (``arch.Target.vendor``); :func:`for_target` and :func:`get`
are the only places a vendor is looked up. Importing a backend loads no vendor library: the first
call does.
"""

from __future__ import annotations

from .. import arch
from ..errors import NoDeviceError
from . import cuda, hip
from .base import Backend

BACKENDS: dict[str, Backend] = {b.vendor: b for b in (cuda.BACKEND, hip.BACKEND)}


def get(vendor: str) -> Backend:
    """The backend of ``vendor`` ("cuda", "hip")."""
    try:
        return BACKENDS[vendor]
    except KeyError:
        raise NoDeviceError(f"no backend for vendor {vendor!r} (known: {', '.join(BACKENDS)})") from None


def for_target(target: str) -> Backend:
    """The backend that compiles for ``target`` (a name in ``arch.TARGETS``)."""
    return get(arch.target(target).vendor)
