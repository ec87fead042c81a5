"""Compilation targets: what each architecture offers and what a block may use on it.

The resource model prunes variants against these budgets before anything is compiled.
Targets of one vendor differ by data, not by code paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str                 # the compiler's name: "sm_90a"
    vendor: str               # "cuda" (a "hip" sibling joins later)
    compute: tuple[int, int]  # compute capability of the devices that run its binaries
    smem_per_block: int       # largest dynamic shared memory a block may opt into, bytes
    smem_per_sm: int
    regs_per_sm: int
    max_regs_per_thread: int
    max_threads_per_block: int
    features: frozenset[str]

    def has(self, feature: str) -> bool:
        return feature in self.features


_AMPERE = frozenset({"mma_sync", "ldmatrix", "cp_async"})
_HOPPER = _AMPERE | {"tma", "mbarrier", "cluster", "wgmma", "setmaxnreg"}
# sm_100a keeps the Ampere instructions and TMA but drops wgmma (tcgen05 replaces it).
_BLACKWELL = _AMPERE | {"tma", "mbarrier", "cluster"}

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_80", "cuda", (8, 0), 166912, 167936, 65536, 255, 1024, _AMPERE),
        Target("sm_86", "cuda", (8, 6), 101376, 102400, 65536, 255, 1024, _AMPERE),
        Target("sm_89", "cuda", (8, 9), 101376, 102400, 65536, 255, 1024, _AMPERE),
        Target("sm_90a", "cuda", (9, 0), 232448, 233472, 65536, 255, 1024, _HOPPER),
        Target("sm_100a", "cuda", (10, 0), 232448, 233472, 65536, 255, 1024, _BLACKWELL),
    )
}


# Device names (as the driver reports them) of the NVIDIA parts each target runs on; used to tell
# whether a tuning record made on another device comes from the same architecture.
DEVICE_NAME_TARGETS = (
    (re.compile(r"\b(GH|H)(100|200|800|20)\b"), "sm_90a"),
    (re.compile(r"\b(GB|B)(100|200)\b"), "sm_100a"),
    (re.compile(r"\bA(100|800|30)\b"), "sm_80"),
    (re.compile(r"\bA(10|16|2|40)\b|RTX 30\d0|RTX A\d000"), "sm_86"),
    (re.compile(r"\bL(4|20|40S?)\b|RTX 40\d0|RTX \d000 Ada"), "sm_89"),
)


def target_of_device_name(name: str) -> str | None:
    """The target of a device known by name only (e.g. "NVIDIA H100 80GB HBM3" -> "sm_90a"), or None."""
    for pattern, target_name in DEVICE_NAME_TARGETS:
        if pattern.search(name):
            return target_name
    return None


def target(name: str) -> Target:
    """Look a target up by name; the error lists the known ones."""
    try:
        return TARGETS[name]
    except KeyError:
        raise KeyError(f"unknown target {name!r}; known: {', '.join(TARGETS)}") from None


def for_compute_capability(major: int, minor: int) -> Target | None:
    """The target whose binaries run on a device of this compute capability.

    CUBINs run only on their own major version, so Hopper gets sm_90a even for Ampere-class
    source; minor versions within a major run the lowest matching binary. Arch-specific targets
    ("a": sm_90a, sm_100a) run only on exactly their compute capability (sm_100a not on 10.3).
    """
    best = None
    for t in TARGETS.values():
        if t.name.endswith("a") and t.compute != (major, minor):
            continue
        if t.compute[0] == major and t.compute[1] <= minor:
            if best is None or t.compute[1] > best.compute[1]:
                best = t
    return best
