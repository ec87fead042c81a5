"""mlagen.schedule: the Hopper barrier schedule, evaluated per variant and checked against the
hardware budgets before anything is compiled."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from mlagen import arch, paths, resources
from mlagen.families.mla_prefill import schedule
from mlagen import spec as spec_mod
from mlagen import variant

S90 = spec_mod.load("mla_prefill_sm90")
SM90A = arch.target("sm_90a")
SPEC90 = paths.specs_dir() / "mla_prefill_sm90.yaml"


def spec90_with(**tune_values):
    """The sm90 spec with some tunables' value lists replaced (to reach values the spec forbids)."""
    d = yaml.safe_load(SPEC90.read_text())
    for name, values in tune_values.items():
        d["tune"][name]["values"] = values
    return spec_mod.from_dict(d, SPEC90)


def reasons(v):
    return schedule.check_variant(v, SM90A, resources.estimate(v))


def test_default_schedule():
    s = schedule.evaluate(variant.default(S90))
    producer, consumer = s.roles
    assert (producer.name, producer.entry, producer.first_wg, producer.warpgroups, producer.registers) == (
        "producer", "producer", 0, 1, 24)
    assert (consumer.name, consumer.first_wg, consumer.warpgroups, consumer.registers, consumer.end_wg) == (
        "consumer", 1, 2, 240, 3)
    assert producer.tasks == ("load_q", "load_k", "load_v")
    assert consumer.tasks == ("mma_qk", "softmax", "mma_pv", "store_o")
    assert s.stages == {"q": 1, "kv": 2}
    assert (s.consumer_order, s.overlap, s.scheduler, s.cluster, s.epilogue) == ("pingpong", True, "dynamic", 1, "tma")
    assert s.swizzle == {"q": 128, "k": 128, "v": 128}
    assert (s.warpgroups, s.threads) == (3, 384)
    assert reasons(variant.default(S90)) == []


def test_schedule_follows_the_tunables():
    v = variant.make(S90, {"consumers": 1, "order": "none", "stages": 4, "overlap": False, "scheduler": "static",
                           "epilogue": "direct", "swizzle_k": 64, "producer_regs": 40, "consumer_regs": 160})
    s = schedule.evaluate(v)
    assert [(r.warpgroups, r.registers) for r in s.roles] == [(1, 40), (1, 160)]
    assert s.stages["kv"] == 4 and s.threads == 256
    assert (s.consumer_order, s.overlap, s.scheduler, s.epilogue) == ("none", False, "static", "direct")
    assert s.swizzle["k"] == 64
    assert reasons(v) == []


@pytest.mark.parametrize("threads, cap", [(384, 168), (256, 255), (128, 255), (512, 128)])
def test_entry_register_cap(threads, cap):
    s = dataclasses.replace(schedule.evaluate(variant.default(S90)),
                            roles=(schedule.Role("producer", "producer", 0, 1, 24, ()),
                                   schedule.Role("consumer", "consumer", 1, threads // 128 - 1, 240, ())))
    assert s.threads == threads
    assert s.entry_register_cap == cap


def test_register_budget_exceeded():
    v = variant.make(S90, {"producer_regs": 56, "consumer_regs": 240})
    r = reasons(v)
    total = 128 * 56 + 2 * 128 * 240
    pool = 384 * 168  # the CTA's registers at launch: setmaxnreg only moves these around
    assert total - pool == 4096
    assert (f"register budget: producer 1x128x56 + consumer 2x128x240 = {total} exceeds the {pool} registers "
            f"the CTA holds at launch (384 threads x 168) by 4096; setmaxnreg would wait forever") in r
    assert not resources.check(v, SM90A).ok


def test_register_budget_is_the_launch_allocation_not_the_register_file():
    # 128 x 32 + 2 x 128 x 240 = 65536 fits the SM's register file but not the 64512 the CTA holds:
    # on the H100 this schedule hung in setmaxnreg.inc (the tuner recorded it as a hang).
    assert any("exceeds the 64512 registers" in x
               for x in reasons(variant.make(S90, {"producer_regs": 32, "consumer_regs": 240})))


def test_register_budget_at_the_limit_passes():
    # 128 x 24 + 2 x 128 x 240 = 64512 = 384 x 168 exactly.
    assert reasons(variant.make(S90, {"producer_regs": 24, "consumer_regs": 240})) == []
    assert reasons(variant.make(S90, {"producer_regs": 40, "consumer_regs": 232})) == []


def test_pingpong_needs_two_consumers():
    v = variant.make(S90, {"consumers": 1, "order": "pingpong"})
    assert "pingpong alternates two consumer warpgroups, this schedule has 1" in reasons(v)
    # The spec's own constraint says so too, with its message.
    assert any(x.startswith("pingpong alternates two consumer warpgroups (requires")
               for x in resources.check(v, SM90A).reasons)


def test_block_n_over_the_tma_box():
    s = spec90_with(block_n=[128, 272])
    r = reasons(variant.make(s, {"block_n": 272}))
    assert "block_n 272 exceeds the TMA box limit of 256 rows by 16" in r


def test_block_n_multiple_of_16():
    s = spec90_with(block_n=[128, 120])
    assert "block_n 120 must be a multiple of 16 (the k-step of P V)" in reasons(variant.make(s, {"block_n": 120}))


def test_swizzle_must_be_a_tma_swizzle():
    s = spec90_with(swizzle_v=[128, 256])
    assert "swizzle.v 256: must be one of [32, 64, 128] bytes" in reasons(variant.make(s, {"swizzle_v": 256}))


def test_swizzle_width_must_divide_the_rows():
    # The geometries have d_rope 64 or 0 (128-byte rows), which every TMA swizzle divides; a 48-column
    # rope (96-byte rows) shows the check.
    from mlagen import expr

    v = variant.make(S90, {"swizzle_k": 64})
    derived = tuple((k, expr.parse("48") if k == "d_rope" else e) for k, e in S90.derived)
    v = dataclasses.replace(v, spec=dataclasses.replace(S90, derived=derived))
    assert v.env()["d_rope"] == 48
    assert "swizzle.k 64 B does not divide the 96 B rows of that operand" in reasons(v)


def test_cluster_sizes():
    s = spec90_with(cluster=[1, 2, 4])
    assert "cluster 4: must be one of [1, 2] CTAs" in reasons(variant.make(s, {"cluster": 4, "scheduler": "static"}))
    assert reasons(variant.make(S90, {"cluster": 2, "scheduler": "persistent"})) == []
    assert reasons(variant.make(S90, {"cluster": 2, "scheduler": "static", "block_n": 64})) == []


def test_cluster_needs_an_agreed_schedule():
    # The dynamic queue hands each CTA its own tile; a cluster's CTAs must share one.
    r = reasons(variant.make(S90, {"cluster": 2, "scheduler": "dynamic"}))
    assert any(x.startswith("cluster 2 needs a static or persistent scheduler") for x in r), r
    # The spec says the same before the schedule is looked at.
    verdict = resources.check(variant.make(S90, {"cluster": 2, "scheduler": "dynamic"}), SM90A)
    assert any("use the static or persistent scheduler" in x for x in verdict.reasons), verdict.reasons


def test_cluster_share_of_a_kv_tile_is_whole_swizzle_atoms():
    s = spec90_with(block_n=[128, 72])
    r = reasons(variant.make(s, {"cluster": 2, "scheduler": "static", "block_n": 72}))
    assert any("block_n / 2 = 36 rows of every K/V tile, which must be a whole number of 8-row swizzle atoms" in x
               for x in r), r


def test_kv_stages_range():
    s = spec90_with(stages=[2, 5])
    assert "the kv pipeline needs 2 to 4 stages, got 5" in reasons(variant.make(s, {"stages": 5}))


def test_setmaxnreg_values():
    s = spec90_with(producer_regs=[24, 20, 36])
    assert "producer registers 20: setmaxnreg takes a multiple of 8 in [24, 256]" in reasons(
        variant.make(s, {"producer_regs": 20}))
    assert "producer registers 36: setmaxnreg takes a multiple of 8 in [24, 256]" in reasons(
        variant.make(s, {"producer_regs": 36}))


def test_unknown_scheduler_value():
    s = spec90_with(scheduler=["dynamic", "lpt"])
    assert "scheduler 'lpt' is not one of ['static', 'persistent', 'dynamic']" in reasons(
        variant.make(s, {"scheduler": "lpt"}))


def test_no_wgmma_target():
    v = variant.default(S90)
    assert schedule.check_variant(v, arch.target("sm_80"), resources.estimate(v)) == [
        "sm_80 has no wgmma/setmaxnreg; this schedule needs sm_90a"]


def test_thread_count_must_match_the_resource_model():
    d = yaml.safe_load(SPEC90.read_text())
    d["derived"]["threads"] = "128 * (2 + consumers)"
    s = spec_mod.from_dict(d, SPEC90)
    v = variant.default(s)
    assert "the roles add up to 384 threads but the resource model says 512" in reasons(v)


def test_the_scheduler_owns_its_grid_rule():
    from mlagen import spec as spec_mod, variant as variant_mod

    s90 = spec_mod.load("mla_prefill_sm90")
    for values, tiles, sms, grid in [({"scheduler": "static", "cluster": 1}, 1000, 132, 1000),
                                     ({"scheduler": "persistent", "cluster": 1}, 1000, 132, 132),
                                     ({"scheduler": "persistent", "cluster": 1}, 50, 132, 50),
                                     ({"scheduler": "static", "cluster": 2}, 7, 132, 14),
                                     ({"scheduler": "persistent", "cluster": 2}, 1000, 132, 132),
                                     ({"scheduler": "dynamic", "cluster": 1}, 1000, 78, 78)]:
        s = schedule.evaluate(variant_mod.make(s90, values))
        assert s.grid(tiles, sms) == grid, (values, tiles, sms)


@pytest.mark.parametrize("rescale, allowed", [("first", False), ("overlapped", True), ("lazy", True)])
def test_without_overlap_the_rescale_has_one_place(rescale, allowed):
    """rescale: first places the O rescale before an overlapped Q K^T; without overlap only the
    one place remains, taken every step (overlapped) or lazily (lazy)."""
    v = variant.make(S90, {"rescale": rescale, "overlap": False, "order": "none"})
    found = [x for x in resources.check(v, SM90A).reasons if x.startswith("rescale first places")]
    assert bool(found) != allowed, found
