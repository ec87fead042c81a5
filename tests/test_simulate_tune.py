"""tools/simulate_tune.py: the tuner's own loop with simulated GPU workers and compiler runs, and
gives the same trials on one and two simulated GPUs (the wall times it predicts are not asserted)."""

from __future__ import annotations

import mlagen.tune as tune_mod
from _tool import load_tool


def test_simulated_tunes_make_the_same_trials_on_one_and_two_gpus(tmp_path):
    sim = load_tool("simulate_tune.py")
    args = sim.argparse.Namespace(load_ms=10, check_small_ms=90, check_shape_ms=90, call_overhead_ms=0.3, warmup=3,
                                  compile_s=1.0, cold=True, jobs=4, worker_start_s=1.0, fixed_s=1.0, record_ms=5,
                                  scale=0.01)
    costs = sim.Costs(args)
    landscape = sim.Landscape(0)
    runs = {n: sim.simulate(tune_mod, n, 24, 1, landscape, costs, tmp_path) for n in (1, 2)}
    (wall1, tuned1, one, log1), (wall2, tuned2, two, log2) = runs[1], runs[2]
    assert len(one.trials) == 24 and [t.variant for t in one.trials] == [t.variant for t in two.trials]
    assert one.best.variant == two.best.variant
    assert wall1 > tuned1 > 0 and wall2 > tuned2 > 0
    lines = [line for line in log2 if line.startswith("  GPU worker ")]
    assert len(lines) == 2 and lines[0].split()[3] == lines[1].split()[3]   # as many measurements each


def test_the_tool_prints_a_ratio_table(capsys):
    sim = load_tool("simulate_tune.py")
    assert sim.main(["--max-trials", "12", "--scale", "0.005", "--gpus", "1,2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["1", "2"] and rows[0][4] == "1.000" and all(r[-1] == "yes" for r in rows)
