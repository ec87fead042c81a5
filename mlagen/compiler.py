"""Compiling, whichever the vendor: the compiler for a target, the spill verdict, saved binaries.

The compilers themselves are the backends' (``backends/cuda.py``: NVRTC; ``backends/hip.py``:
hipRTC and an offline clang), on the shared :class:`Compiler` of ``backends/base.py``, which owns
the compile cache. Kernels are compiled through ``build.compile_source``; this module is what it
and the tools (``mlagen build``, ``mlagen check``) use to find a compiler.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from . import arch, backends
from .backends.base import Binary, Compiler, KernelResources
from .cache import atomic_write

__all__ = ["Binary", "Compiler", "KernelResources", "for_target", "save_binary", "spill_reason"]


def spill_reason(binary: Binary) -> str | None:
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


def for_target(target: str, **kwargs) -> Compiler:
    """The compiler of the target's vendor's backend (``cache_dir``, ``source_dir`` as Compiler takes them)."""
    return backends.for_target(target).compiler(**kwargs)


def save_binary(binary: Binary, directory: Path | str) -> Path:
    """Write the binary as ``<symbol>.<target>.cubin`` (``.hsaco`` for AMD), its report beside it."""
    directory = Path(directory)
    suffix = arch.TARGETS[binary.target].binary_suffix if binary.target in arch.TARGETS else "cubin"
    path = directory / f"{binary.symbol}.{binary.target}.{suffix}"
    atomic_write(path, binary.data)
    atomic_write(path.with_suffix(".json"), json.dumps(
        {"symbol": binary.symbol, "target": binary.target, "compiler": binary.compiler, "key": binary.key,
         "resources": asdict(binary.resources)}, indent=1).encode())
    return path
