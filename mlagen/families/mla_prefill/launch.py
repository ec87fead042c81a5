"""Launching dense MLA prefill kernels with either launcher ("abi" in the spec).

Both launchers take the same validated :class:`~.call.Call`, built without any host
synchronisation, so a launch can be captured in a CUDA graph.
"""

from __future__ import annotations

from . import tma
from .call import Call
from .pack import num_virtual_tiles, pack_simt


def accepts(spec, call: Call) -> bool:
    """Whether ``spec``'s kernels can take this call's tensors."""
    return spec.abi != "tma" or call.tma_compatible() is None


def launch(selection, call: Call, stream: int) -> None:
    """Launch the selected kernel on ``stream``; no host synchronisation."""
    env = selection.env
    res = selection.resources
    if selection.spec.abi == "simt":
        params = pack_simt(call, env)
        grid = (num_virtual_tiles(call, env["block_m"]), call.heads, 1)
        selection.kernel.launch(grid, (res.threads, 1, 1), res.smem_bytes, stream, params)
        return
    tma.launch(selection, call, env, stream)
