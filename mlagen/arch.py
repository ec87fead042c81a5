"""Compilation targets: what each architecture offers and what a block may use on it.

The resource model prunes variants against these budgets before anything is compiled.
Targets differ by data, not by code paths: NVIDIA (``vendor="cuda"``, 32-lane warps, shared
memory, one register file) and AMD Instinct (``vendor="hip"``, 64-lane waves, LDS, an architectural
VGPR file plus an accumulation (AGPR) file that gfx90a and later allocate together, 512 per lane).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str                 # the compiler's name: "sm_90a", "gfx950"
    vendor: str               # "cuda" or "hip": picks the compiler, loader and binary format
    compute: tuple[int, int]  # CUDA compute capability; for AMD the gfx major / minor-stepping
    smem_per_block: int       # largest shared memory / LDS a block may use, bytes
    smem_per_sm: int          # per SM (NVIDIA) or per CU (AMD)
    regs_per_sm: int          # 32-bit registers of an SM, or of a CU (4 SIMDs x 512 x 64 lanes)
    max_regs_per_thread: int  # per thread (NVIDIA) or per lane (AMD: VGPRs + AGPRs)
    max_threads_per_block: int
    features: frozenset[str]
    wave_size: int = 32       # lanes of a warp / wavefront
    vgprs: int = 0            # AMD: architectural VGPRs a lane may use (0 on NVIDIA)
    agprs: int = 0            # AMD: accumulation VGPRs a lane may use besides them
    sgprs: int = 0            # AMD: scalar registers a wave may use
    simds: int = 0            # AMD: SIMDs per CU, each runs waves of its own
    max_waves_per_simd: int = 0
    binary_suffix: str = "cubin"  # file extension of the compiled binary
    executed: bool = False    # kernels for it have run on hardware in this project's tests (not just compiled)

    def has(self, feature: str) -> bool:
        return feature in self.features


_AMPERE = frozenset({"mma_sync", "ldmatrix", "cp_async"})
_HOPPER = _AMPERE | {"tma", "mbarrier", "cluster", "wgmma", "setmaxnreg"}
# sm_100a keeps the Ampere instructions and TMA but drops wgmma (tcgen05 replaces it).
_BLACKWELL = _AMPERE | {"tma", "mbarrier", "cluster"}

# CDNA3 (MI300) and CDNA4 (MI350/MI355): bf16 MFMA in both; gfx950 doubles the bf16 K step
# (32x32x16), adds the scaled f8f6f4 MFMA with OCP fp8 (gfx942's fp8 MFMA uses the FNUZ
# encodings) and grows LDS from 64 KB to 160 KB per CU.
_CDNA3 = frozenset({"mfma", "mfma_bf16_32x32x8", "mfma_fp8_fnuz"})
_CDNA4 = frozenset({"mfma", "mfma_bf16_32x32x8", "mfma_bf16_32x32x16", "mfma_f8f6f4", "fp8_ocp"})


def _gfx(name: str, compute: tuple[int, int], lds: int, features: frozenset[str]) -> Target:
    # Unified register file: 512 VGPR+AGPR per lane per SIMD, at most 256 of each kind per wave.
    return Target(name, "hip", compute, lds, lds, 4 * 512 * 64, 512, 1024, features, wave_size=64, vgprs=256,
                  agprs=256, sgprs=102, simds=4, max_waves_per_simd=8, binary_suffix="hsaco")


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_80", "cuda", (8, 0), 166912, 167936, 65536, 255, 1024, _AMPERE),
        Target("sm_86", "cuda", (8, 6), 101376, 102400, 65536, 255, 1024, _AMPERE),
        Target("sm_89", "cuda", (8, 9), 101376, 102400, 65536, 255, 1024, _AMPERE),
        # Only the H100 (sm_90a) runs the GPU tests and benchmarks; other targets are compiled in CI.
        Target("sm_90a", "cuda", (9, 0), 232448, 233472, 65536, 255, 1024, _HOPPER, executed=True),
        Target("sm_100a", "cuda", (10, 0), 232448, 233472, 65536, 255, 1024, _BLACKWELL),
        _gfx("gfx942", (9, 42), 65536, _CDNA3),
        _gfx("gfx950", (9, 50), 163840, _CDNA4),
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
        if t.vendor != "cuda":
            continue
        if t.name.endswith("a") and t.compute != (major, minor):
            continue
        if t.compute[0] == major and t.compute[1] <= minor:
            if best is None or t.compute[1] > best.compute[1]:
                best = t
    return best


def for_gcn_arch(name: str) -> Target | None:
    """The target for a HIP device's ``gcnArchName`` (``"gfx942:sramecc+:xnack-"``); None if
    no target of that name is known. The feature suffixes do not change the code we emit."""
    t = TARGETS.get(name.split(":", 1)[0].strip())
    return t if t is not None and t.vendor == "hip" else None


def occupancy(target: Target, threads: int, lds_bytes: int, vgprs: int) -> int:
    """Waves per SIMD an AMD kernel can keep resident, limited by registers and LDS.

    ``vgprs`` is the unified count (architectural VGPRs rounded up to 4, plus AGPRs), which is
    what the code object's ``.vgpr_count`` states on gfx90a and later: a wave64 allocates it from
    one 512-entry file per lane, in granules of 8. LDS is per CU, shared by the work-groups
    resident there; a work-group's waves spread over the CU's SIMDs.
    """
    if target.vendor != "hip":
        raise ValueError(f"occupancy: {target.name} is not an AMD target")
    waves_per_group = -(-threads // target.wave_size)
    regs = max(8, -(-vgprs // 8) * 8)
    by_regs = min(target.max_waves_per_simd, 512 // regs)
    if lds_bytes:
        groups = target.smem_per_sm // lds_bytes
        by_lds = groups * waves_per_group // target.simds
        return max(0, min(by_regs, by_lds))
    return by_regs


def describe_coverage(names) -> str:
    """``"executed: sm_90a; compiled only: sm_80, gfx950"`` for a list of target names."""
    ran = [n for n in names if TARGETS[n].executed]
    only = [n for n in names if not TARGETS[n].executed]
    parts = ([f"executed: {', '.join(ran)}"] if ran else []) + ([f"compiled only: {', '.join(only)}"] if only else [])
    return "; ".join(parts)
