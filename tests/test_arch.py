"""mlagen.arch: the targets, their budgets, and which binary a device runs."""

from __future__ import annotations

import pytest

from mlagen import arch


def test_targets():
    assert list(arch.TARGETS) == ["sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a"]
    h100 = arch.target("sm_90a")
    assert (h100.smem_per_block, h100.regs_per_sm, h100.max_regs_per_thread) == (232448, 65536, 255)
    assert h100.has("wgmma") and h100.has("tma") and h100.has("mma_sync")
    assert not arch.target("sm_80").has("tma")
    assert arch.target("sm_100a").has("tma") and not arch.target("sm_100a").has("wgmma")
    assert arch.target("sm_86").smem_per_block == 99 * 1024


def test_unknown_target_lists_the_known_ones():
    with pytest.raises(KeyError, match="unknown target 'sm_70'; known: sm_80, sm_86, sm_89, sm_90a, sm_100a"):
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
