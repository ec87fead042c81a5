"""Timing on the GPU as ``../shared/BENCHMARKS.md`` prescribes: CUDA events around each call,
the L2 cache flushed before it (outside the events), medians and percentiles of many calls.

Used by ``tune`` (each trial, and the re-timing of finalists) and ``bench`` (each peer).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

MIB = 1 << 20


def require_gpu(tool: str) -> None:
    """Raise :class:`~mlagen.errors.NoDeviceError` (one line naming ``tool``) when torch sees no
    CUDA GPU: what the timing and GPU-check tools say before touching a device."""
    import torch

    from .errors import NoDeviceError

    if not torch.cuda.is_available():
        raise NoDeviceError(f"{tool} needs a CUDA GPU, and torch sees none")


# --- statistics -----------------------------------------------------------------------------


def percentile(values: Iterable[float], pct: float) -> float:
    """The ``pct``-th percentile, interpolating linearly between ranks (numpy's default)."""
    data = sorted(values)
    if not data:
        raise ValueError("percentile of no values")
    pos = (len(data) - 1) * pct / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float:
    return percentile(values, 50.0)


@dataclass
class Timing:
    """Seconds per call of one peer on one shape, one list per timed block, in the order run.

    A block is ``iters`` consecutive calls; the interleaving puts one block of each peer in every
    round (ours after each peer). ``median`` is the median of the block medians; ``p20``/``p80``
    pool every call; ``spread`` is the (fastest, slowest) block median, the noise between rounds.
    """

    blocks: list[list[float]]

    @property
    def block_medians(self) -> list[float]:
        return [median(b) for b in self.blocks]

    @property
    def samples(self) -> list[float]:
        return [t for b in self.blocks for t in b]

    @property
    def median(self) -> float:
        return median(self.block_medians)

    @property
    def p20(self) -> float:
        return percentile(self.samples, 20)

    @property
    def p80(self) -> float:
        return percentile(self.samples, 80)

    @property
    def spread(self) -> tuple[float, float]:
        meds = self.block_medians
        return min(meds), max(meds)


# --- timing ---------------------------------------------------------------------------------


class L2Flush:
    """Zeroes a buffer of at least 256 MiB and 3× the L2 cache, so no call finds its operands in L2."""

    def __init__(self, device):
        import torch

        l2 = torch.cuda.get_device_properties(device).L2_cache_size or 50 * MIB
        self.buffer = torch.empty(max(256 * MIB, 3 * l2), dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


def time_calls(fn: Callable[[], Any], iters: int, flush: Callable[[], None]) -> list[float]:
    """Seconds of each of ``iters`` calls of ``fn``, by CUDA events on the current stream; ``flush``
    runs before each call, outside the events."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        flush()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends)]


def host_time(fn: Callable[[], Any], calls: int = 20, reps: int = 5) -> float:
    """Seconds of the caller's CPU time one call of ``fn`` costs: the fastest of ``reps`` runs of
    ``calls`` calls back to back (the GPU idle before each run, so no launch waits on a full
    queue), divided by ``calls``. What an eager caller (a serving stack outside CUDA graphs) pays
    per call whatever the GPU does; the event timings do not show it while the GPU is the slower."""
    import torch

    best = math.inf
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    torch.cuda.synchronize()
    return best

