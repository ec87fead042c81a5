"""mlagen.arch: the targets, their budgets, and which binary a device runs."""

from __future__ import annotations

import pytest

from mlagen import arch


def test_targets():
    assert list(arch.TARGETS) == ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "gfx942", "gfx950"]
    h100 = arch.target("sm_90a")
    assert (h100.smem_per_block, h100.regs_per_sm, h100.max_regs_per_thread) == (232448, 65536, 255)
    assert h100.has("wgmma") and h100.has("tma") and h100.has("mma_sync")
    assert not arch.target("sm_80").has("tma")
    assert arch.target("sm_100a").has("tma") and not arch.target("sm_100a").has("wgmma")
    assert arch.target("sm_86").smem_per_block == 99 * 1024


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown target 'sm_70'; known: sm_80, sm_86, sm_89, sm_90a, sm_100a, gfx942, gfx950"):
        arch.target("sm_70")


@pytest.mark.parametrize("cc, name", [
    ((8, 0), "sm_80"), ((8, 6), "sm_86"), ((8, 7), "sm_86"), ((8, 9), "sm_89"),
    ((9, 0), "sm_90a"), ((10, 0), "sm_100a"),
    ((10, 3), None),   # sm_100a (arch-specific) cubins run on compute 10.0 only
    ((9, 1), None), ((7, 5), None), ((12, 0), None),
])
def test_for_compute_capability(cc, name):
    t = arch.for_compute_capability(*cc)
    assert (t.name if t else None) == name


def test_amd_targets_differ_by_data():
    mi300, mi355 = arch.target("gfx942"), arch.target("gfx950")
    for t in (mi300, mi355):
        assert (t.vendor, t.wave_size, t.max_regs_per_thread, t.binary_suffix) == ("hip", 64, 512, "hsaco")
    assert (mi300.smem_per_block, mi355.smem_per_block) == (64 * 1024, 160 * 1024)
    assert mi355.has("mfma_bf16_32x32x16") and mi355.has("mfma_f8f6f4") and mi355.has("fp8_ocp")
    assert not mi300.has("mfma_bf16_32x32x16") and mi300.has("mfma_fp8_fnuz")
    assert arch.for_compute_capability(9, 42) is None  # AMD targets never match a CUDA device


@pytest.mark.parametrize("name, expected", [
    ("gfx942:sramecc+:xnack-", "gfx942"), ("gfx950", "gfx950"), ("gfx90a:xnack-", None), ("sm_90a", None),
])
def test_for_gcn_arch(name, expected):
    t = arch.for_gcn_arch(name)
    assert (t.name if t else None) == expected


@pytest.mark.parametrize("threads, lds, vgprs, waves", [
    (256, 0, 128, 4),        # 512 / 128 registers
    (256, 0, 129, 3),        # granules of 8: 136 -> 3 waves
    (256, 0, 512, 1),
    (256, 0, 24, 8),         # capped at 8 waves per SIMD
    (256, 44032, 128, 3),    # 64 KB LDS holds one 43 KB work-group (4 waves over 4 SIMDs): 1 wave
])
def test_occupancy_gfx942(threads, lds, vgprs, waves):
    expected = 1 if lds else waves
    assert arch.occupancy(arch.target("gfx942"), threads, lds, vgprs) == expected


def test_occupancy_lds_bound_gfx950():
    # 160 KB holds three 44 KB work-groups of 8 waves: 24 waves over 4 SIMDs.
    assert arch.occupancy(arch.target("gfx950"), 512, 44032, 128) == 4
    with pytest.raises(ValueError, match="not an AMD target"):
        arch.occupancy(arch.target("sm_90a"), 256, 0, 64)
