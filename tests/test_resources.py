"""mlagen.resources: the resource model and the pruning reasons, before anything is compiled."""

from __future__ import annotations

import itertools

import pytest
import yaml

from mlagen import arch, paths, resources
from mlagen import spec as spec_mod
from mlagen import variant

S80 = spec_mod.load("mla_prefill_sm80")
S90 = spec_mod.load("mla_prefill_sm90")
SM80, SM86, SM90A, SM100A = (arch.target(t) for t in ("sm_80", "sm_86", "sm_90a", "sm_100a"))


def sm80_smem(block_m, block_n, stages, swizzle):
    """Shared memory of templates/include/mlagen/sm80/mla_prefill.cuh (PrefillLayout), written out."""
    def tile(rows, cols):
        return rows * (cols * 2 + (16 if swizzle == "pad" else 0))
    return tile(block_m, 192) + stages * (tile(block_n, 192) + tile(block_n, 128))


def sm90_smem(consumers, block_n, stages):
    """Shared memory of templates/include/mlagen/sm90/mla_prefill.cuh (Layout): Q, the K and V
    rings, 1 KB reserved for barriers and 1 KB of alignment slack."""
    return 64 * consumers * 192 * 2 + stages * block_n * (192 + 128) * 2 + 1024 + 1024


def fixed_except(s, *free):
    """Every axis held at its default except ``free`` (keeps sm90 enumerations small as the spec grows)."""
    return {k: v for k, v in variant.default(s).values if k not in free}


def spec80_with(**resource_exprs):
    d = yaml.safe_load((paths.specs_dir() / "mla_prefill_sm80.yaml").read_text())
    d["resources"].update(resource_exprs)
    return spec_mod.from_dict(d, paths.specs_dir() / "mla_prefill_sm80.yaml")


# --- the estimate ---------------------------------------------------------------------------


def test_estimate_of_the_sm80_default():
    r = resources.estimate(variant.default(S80))
    assert (r.threads, r.smem_bytes, r.registers) == (256, 137216, 184)
    assert r.smem_kb == 134.0


@pytest.mark.parametrize("v", list(variant.enumerate_space(S80, {"mask": "causal"})), ids=lambda v: v.symbol)
def test_sm80_estimate_matches_the_kernel_layout(v):
    r = resources.estimate(v)
    assert r.threads == 32 * v["warps"]
    assert r.smem_bytes == sm80_smem(v["block_m"], v["block_n"], v["stages"], v["swizzle"])


def test_sm90_estimate_matches_the_kernel_layout():
    for v in variant.enumerate_space(S90, fixed_except(S90, "consumers", "block_n", "stages", "swizzle_k")):
        r = resources.estimate(v)
        assert r.threads == 128 * (1 + v["consumers"])
        assert r.smem_bytes == sm90_smem(v["consumers"], v["block_n"], v["stages"]), v.symbol
        assert r.registers == min(255, 65536 // r.threads // 8 * 8)


# --- verdicts -------------------------------------------------------------------------------


def test_defaults_fit_their_first_target():
    for s in (S80, S90):
        verdict = resources.check(variant.default(s), arch.target(s.targets[0]))
        assert verdict.ok, verdict.reasons
        assert verdict.reasons == ()


def test_dispatch_default_fits_every_target_the_spec_lists():
    # The sm80 default (134 KB of shared memory) does not fit sm_86/sm_89 (99 KB); with no tuning
    # record, dispatch takes the closest variant that fits instead of failing.
    for t in S80.targets:
        target = arch.target(t)
        chosen = resources.feasible_default(S80, target, {"mask": "causal"})
        assert chosen is not None and resources.check(chosen, target).ok, t
        if resources.check(variant.default(S80), target).ok:
            assert chosen == variant.make(S80, {"mask": "causal"})
    small = resources.feasible_default(S80, arch.target("sm_86"))
    assert small != variant.default(S80)
    changed = [k for k, v in small.tunables.items() if v != variant.default(S80)[k]]
    assert len(changed) == 1, changed  # one tunable moved, the rest are the spec's defaults


def test_shared_memory_over_budget_says_by_how_much():
    v = variant.make(S80, {"block_n": 128, "stages": 3})
    need = sm80_smem(128, 128, 3, "pad")
    verdict = resources.check(v, SM80)
    assert not verdict.ok
    assert verdict.resources.smem_bytes == need
    over = need - SM80.smem_per_block
    assert verdict.reasons == (
        f"needs {need / 1024:.1f} KB of shared memory, sm_80 allows 163.0 KB per block "
        f"({over / 1024:.1f} KB over): lower block sizes or stages",)
    assert "needs 302.0 KB" in verdict.reasons[0] and "139.0 KB over" in verdict.reasons[0]


def test_smaller_targets_prune_more():
    v = variant.default(S80)
    assert resources.check(v, SM80).ok
    reasons = resources.check(v, SM86).reasons
    assert len(reasons) == 1 and "sm_86 allows 99.0 KB per block (35.0 KB over)" in reasons[0]


def test_register_limit_per_thread():
    v = variant.make(S80, {"block_m": 128, "warps": 4, "block_n": 128, "q_in_regs": False, "stages": 2,
                           "swizzle": "xor"})
    verdict = resources.check(v, SM80)
    assert verdict.resources.registers == 2 * 64 + 2 * 64 + 16 + 40
    assert "estimated 312 registers per thread, the limit is 255" in verdict.reasons


def test_register_file_of_an_sm():
    s = spec80_with(threads="1024", registers="100")
    verdict = resources.check(variant.default(s), SM80)
    assert "estimated 100 registers x 1024 threads = 102400 exceeds the 65536 registers of an SM" in verdict.reasons


def test_threads_must_be_whole_warps():
    s = spec80_with(threads="warps * 32 + 1")
    verdict = resources.check(variant.default(s), SM80)
    assert "257 threads per block: must be a multiple of 32 up to 1024" in verdict.reasons


def test_failing_constraint_gives_its_message():
    v = variant.make(S80, {"block_m": 128, "warps": 4, "q_in_regs": True, "block_n": 32})
    verdict = resources.check(v, SM80)
    assert verdict.reasons == (
        "Q fragments fit in registers only with one 16-row slice per warp (block_m == 16 * warps) "
        "(requires not q_in_regs or m_tiles == 1)",)


def test_every_failing_constraint_is_a_reason():
    v = variant.make(S80, {"block_m": 64, "warps": 8})
    reasons = resources.check(v, SM80).reasons
    assert any(r.startswith("each warp owns whole 16-row MMA slices") for r in reasons)
    assert any("(requires block_m % (16 * warps) == 0)" in r for r in reasons)


def test_resource_model_that_fails_to_evaluate_prunes():
    # Fails for block_m 64 only: a spec whose model fails on its default is refused at load (test_spec).
    s = spec80_with(smem_bytes="ceil_div(block_m, block_m - 64)")
    verdict = resources.check(variant.default(s).with_values(block_m=64, warps=4), SM80)
    assert not verdict.ok and verdict.resources is None
    assert verdict.reasons[-1].startswith("resource model failed: ")


def test_sm90_spec_on_sm80_is_pruned():
    reasons = resources.check(variant.default(S90), SM80).reasons
    assert "mla_prefill_sm90 does not target sm_80 (targets: sm_90a)" in reasons
    assert "sm_80 has no wgmma/setmaxnreg; this schedule needs sm_90a" in reasons


def test_sm90_spec_on_sm100a_is_pruned():
    # Blackwell keeps TMA but has no wgmma: the Hopper schedule cannot run there.
    assert "sm_100a has no wgmma/setmaxnreg; this schedule needs sm_90a" in resources.check(
        variant.default(S90), SM100A).reasons


def test_surviving_sm80_variants_on_sm80():
    verdicts = [resources.check(v, SM80) for v in variant.enumerate_space(S80)]
    kept = [x for x in verdicts if x.ok]
    assert 20 < len(kept) < len(verdicts)
    for x in kept:
        assert x.resources.smem_bytes <= SM80.smem_per_block
        assert x.resources.registers <= SM80.max_regs_per_thread
        assert x.variant["block_m"] % (16 * x.variant["warps"]) == 0
    # Both masks survive in equal numbers: the mask changes no resource.
    assert sum(x.variant["mask"] == "causal" for x in kept) * 2 == len(kept)


def test_some_sm90_variants_survive_on_sm90a():
    vs = variant.enumerate_space(S90, fixed_except(S90, "consumers", "block_n", "stages", "order", "producer_regs"))
    verdicts = [resources.check(v, SM90A) for v in vs]
    assert any(x.ok for x in verdicts) and not all(x.ok for x in verdicts)



def _every_candidate(base, target, keep=(), max_changes=None, limit=100_000):
    """feasible_neighbours as a check of every candidate in order (what it was before pruning)."""
    if resources.check(base, target).ok:
        return [base]
    free = [t for t in base.spec.tunables if len(t.values) > 1 and t.name not in set(keep)]
    tried = 0
    for changed in range(1, (len(free) if max_changes is None else min(max_changes, len(free))) + 1):
        found = []
        for axes in itertools.combinations(free, changed):
            for combo in itertools.product(*([v for v in t.values if v != base[t.name]] for t in axes)):
                candidate = base.with_values(**{t.name: v for t, v in zip(axes, combo)})
                if resources.check(candidate, target).ok:
                    found.append(candidate)
                tried += 1
                if tried >= limit:
                    return found
        if found:
            return found
    return []


def test_the_nearest_fitting_search_skips_what_a_broken_constraint_rules_out(monkeypatch):
    """A specialisation nothing fits (an FP8 cache at d_qk 512: its rows hold 576 values) used to
    cost a check of all 82,944 variants of the h16 space, 90 s of a cached ``mlagen check``. The
    search tests each constraint as soon as the axes it reads have values and skips the
    candidates below one that fails; only the rest reach the family's own check."""
    from mlagen import families

    h16 = spec_mod.load("mla_sparse_prefill_sm90_h16")
    family = type(families.get(h16.family))
    calls = []
    original = family.check_variant
    monkeypatch.setattr(family, "check_variant", lambda self, *a: calls.append(1) or original(self, *a))
    resources._check.cache_clear()
    assert resources.feasible_default(h16, arch.target("sm_90a"), {"d_qk": 512, "kv_format": "fp8_v32"}) is None
    assert 0 < len(calls) < 2_000, len(calls)


@pytest.mark.parametrize("keep,most,limit", [((), None, 100_000), (("block_n",), 2, 100_000), ((), 3, 40)])
def test_the_pruned_search_finds_what_checking_every_candidate_finds(keep, most, limit):
    h16 = spec_mod.load("mla_sparse_prefill_sm90_h16")
    sm90a = arch.target("sm_90a")
    bases = [variant.make(S80, {"mask": "causal", "block_n": 128, "stages": 3}).with_values(warps=4),
             variant.make(h16, {"kv_format": "fp8_v32", "producers": 4})]
    for base in bases:
        target = sm90a if base.spec is h16 else arch.target("sm_86")
        assert not resources.check(base, target).ok
        assert resources.feasible_neighbours(base, target, keep, most, limit) == \
            _every_candidate(base, target, keep, most, limit)
