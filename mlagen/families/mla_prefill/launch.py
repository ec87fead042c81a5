"""Launching dense MLA prefill kernels with either launcher ("abi" in the spec).

Both launchers take the same validated :class:`~.call.Call`, built without any host
synchronisation, so a launch can be captured in a CUDA graph.
"""

from __future__ import annotations

from . import tma
from .call import Call
from .pack import num_virtual_tiles, simt_fp8_values, simt_values
from .params import ABIS, TMA_ABIS


def spec_dtype(spec) -> str:
    """The input dtype name a spec's kernels take (its ``problem.dtype``)."""
    return dict(spec.problem).get("dtype", "bf16")


def accepts(spec, call: Call) -> bool:
    """Whether ``spec``'s kernels can take this call's tensors (their dtype, and TMA's alignment)
    and traits (a spec without a geometry or score axis implements only the default)."""
    if spec_dtype(spec) != call.dtype:
        return False
    axes = dict(spec.specialize)
    if any(value not in axes.get(name, ()) for name, value in call.traits.specialization().items()):
        return False
    return spec.abi not in TMA_ABIS or call.tma_compatible() is None


def launch(selection, call: Call, stream: int) -> tuple[tuple, dict]:
    """Launch the selected kernel on ``stream``; no host synchronisation. Returns the grid and
    the parameter values it packed (what a launch plan keeps)."""
    env = selection.env
    res = selection.resources
    if selection.spec.abi in ("simt", "simt_fp8"):
        values = (simt_values if selection.spec.abi == "simt" else simt_fp8_values)(call, env)
        grid = (num_virtual_tiles(call, env["block_m"]), call.heads, 1)
        selection.kernel.launch(grid, (res.threads, 1, 1), res.smem_bytes, stream, ABIS[selection.spec.abi].pack(values))
        return grid, values
    return tma.launch(selection, call, env, stream)
