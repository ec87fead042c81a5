"""Launch plans: the eager hot path of a call repeated with the same signature.

A serving stack calls a kernel with tensors of the same shapes, strides and dtypes over and over
(every layer of every step); only the data pointers change. A family's first call of a
*signature* (each tensor argument's dtype, shape, strides, device and base alignment modulo 16
bytes, the scalar arguments, the knobs read per call, the current device and the dispatcher's
generation) takes the full path: argument checks, dispatch, parameter packing, launch. Where that
path used the caller's tensors in place (no copies), the family keeps a :class:`LaunchPlan`: the
kernel, grid, block and shared memory, and the parameter struct packed once with every field
that the signature decides. A later call with the same signature allocates its outputs, writes the
fields that change per call (pointers, tensor maps) into a per-thread copy of that buffer and
launches: no checks (its arguments have what passed them), no dispatch, no packing.

Plans are keyed by the dispatcher's generation, so a new tuning record or ``dispatcher().clear()``
drops them. ``MLAGEN_PLANS=0`` turns the hot path off (every call takes the full path;
``knobs.call_state``). This module imports neither torch nor a family.
"""

from __future__ import annotations

import struct
import threading

from .abi import ParamStruct, PackedParams

_LIMIT = 1024
_QWORD = struct.Struct("<Q")


class NoPlan(Exception):
    """An argument a signature cannot hold (a tensor subclass, a scalar of an unusual type): the
    call takes the full path."""


def tensor_sig(t, tensor_type) -> tuple | None:
    """What checks and launches read of a tensor besides its data: dtype, shape, strides, whether
    it is a CUDA tensor and its device index (-1 on the CPU), and the base address modulo 16
    bytes. ``tensor_type`` is torch.Tensor (passed in, so this module does not import torch); a
    subclass raises NoPlan."""
    if t is None:
        return None
    if type(t) is not tensor_type:
        raise NoPlan
    return (t.dtype, t.shape, t.stride(), t.is_cuda, t.get_device(), t.data_ptr() & 15)


def scalar_sig(x) -> tuple:
    """A scalar argument with its type (so True, 1 and 1.0 differ); NoPlan for anything else."""
    if x is None or type(x) in (bool, int, float, str):
        return (type(x), x)
    raise NoPlan


_SCALARS = frozenset((bool, int, float, str))


def _sequence_sig(x) -> tuple:
    """A tuple or list of scalars (such as a window's two sides), element by element."""
    if type(x) in (tuple, list):
        return (type(x), tuple(map(scalar_sig, x)))
    raise NoPlan


def values_sig(values, tensor_type) -> tuple:
    """:func:`tensor_sig` of each tensor of ``values`` (a call's arguments, in their order),
    :func:`scalar_sig` of each scalar (of each element of a tuple or list, such as
    ``window_size``) and None for None, so a new argument joins the signature by itself; NoPlan
    as those raise it. (tensor_sig's and scalar_sig's tuples are written out here: this runs on
    every eager call, and a function call per argument costs a third of it.)"""
    return tuple([None if x is None else (x.dtype, x.shape, x.stride(), x.is_cuda, x.get_device(), x.data_ptr() & 15)
                  if type(x) is tensor_type else (type(x), x) if type(x) in _SCALARS else _sequence_sig(x)
                  for x in values])


class LaunchPlan:
    """One kernel launch with a parameter struct packed once: ``launch(stream, values)`` writes the
    ``variable`` fields (in that order) and launches. Each thread writes its own copy of the buffer
    (the driver copies the parameters when the launch is issued, so a buffer is free again at once)."""

    def __init__(self, kernel, grid: tuple, block: tuple, smem: int, params: ParamStruct, fixed: dict,
                 variable: tuple[str, ...]):
        self.kernel, self.grid, self.block, self.smem = kernel, grid, block, smem
        kinds = {f.name: f.kind for f in params.fields}
        if any(not (kinds[n] == "tensormap" or kinds[n].endswith("*")) for n in variable):
            raise ValueError(f"{params.name}: only pointers and tensor maps vary per call, not {variable}")
        fixed_pointers = [n for n, kind in kinds.items() if kind.endswith("*") and n not in variable]
        if fixed_pointers:   # a pointer kept from the first call would point into a freed buffer
            raise ValueError(f"{params.name}: pointer fields {fixed_pointers} must be written per call")
        blank = {n: (bytes(128) if kinds[n] == "tensormap" else 0) for n in variable}
        self._template = bytes(params.pack({**fixed, **blank}).data)
        self._size = params.size
        offsets = {f.name: (offset, f.kind) for f, offset in params.layout}
        self._writers = tuple((offsets[name][0], offsets[name][1] == "tensormap") for name in variable)
        self._local = threading.local()

    def _buffer(self) -> PackedParams:
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = PackedParams(self._size)
            buf.data[:] = self._template
            self._local.buf = buf
        return buf

    def launch(self, stream: int, values) -> None:
        buf = self._buffer()
        data = buf.data
        for (offset, raw), value in zip(self._writers, values):
            if raw:
                data[offset:offset + 128] = value
            else:
                _QWORD.pack_into(data, offset, value)
        self.kernel.launch(self.grid, self.block, self.smem, stream, buf)


class PlanCache:
    """A family's plans by signature; bounded (cleared when full). Lock-free: two threads racing
    on a new signature both build the same plan."""

    def __init__(self, limit: int = _LIMIT):
        self._entries: dict = {}
        self._limit = limit
        self.hits = 0  # calls that took a plan (tests and diagnostics)

    def get(self, sig):
        plan = self._entries.get(sig)
        if plan is not None:
            self.hits += 1
        return plan

    def put(self, sig, plan) -> None:
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[sig] = plan

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
