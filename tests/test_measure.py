"""mlagen.measure: statistics of timed calls (the GPU timing itself runs in tests/gpu)."""

from __future__ import annotations

import random

import pytest

from mlagen import measure


def test_percentile_and_median_on_known_data():
    data = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert measure.median(data) == 3.0
    assert measure.percentile(data, 20) == pytest.approx(1.8)
    assert measure.percentile(data, 80) == pytest.approx(4.2)
    assert measure.percentile(data, 0) == 1.0 and measure.percentile(data, 100) == 5.0
    assert measure.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert measure.median([7.0]) == 7.0
    with pytest.raises(ValueError):
        measure.median([])


def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    rng = random.Random(1)
    data = [rng.random() for _ in range(57)]
    for pct in (0, 13, 20, 50, 80, 99, 100):
        assert measure.percentile(data, pct) == pytest.approx(float(np.percentile(data, pct)))


def test_timing_statistics():
    t = measure.Timing([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [10.0, 10.0, 11.0]])
    assert t.block_medians == [2.0, 4.0, 10.0]
    assert t.median == 4.0
    assert t.spread == (2.0, 10.0)
    assert t.p20 == pytest.approx(measure.percentile(t.samples, 20))
    assert t.p80 == pytest.approx(measure.percentile(t.samples, 80))
    assert len(t.samples) == 9


