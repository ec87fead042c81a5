"""What a tune is asked for and what it returns: the configuration, the trials, the finals."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .. import variant as variant_mod
from ..records import MEASURED, RecordKey, Trial

FINALISTS = 4           # variants re-timed at the end, besides the spec default
FINAL_ROUNDS = 3        # interleaved rounds of the final re-timing
EXTRA_ROUNDS = 3        # more rounds for the finalists whose rounds still overlap the fastest's
FINALIST_DISTANCE = 3   # tunables in which a finalist differs from every faster one (while the ranking has such)
NOISE_FLOOR = 0.005     # finalists closer than this (or their measured spread) are tied ...
NOISE_CAP = 0.015       # ... but never when further apart than this

@dataclass
class TuneConfig:
    """What to tune and how; ``mlagen tune`` fills it from its options."""

    spec: str
    shapes: tuple  # ids ("D1"), descriptions ("b=4,q=4096,h=16"), the family's shapes or WorkloadItem objects
    strategy: str = "auto"
    max_trials: int = 200
    fixed: dict = field(default_factory=dict)
    timeout_s: float = 60.0
    iters: int = 20
    warmup: int = 3
    jobs: int | None = None
    db_path: str | None = None
    seed: int = 0
    target: str | None = None     # default: the target of the GPU the trials run on
    budget_s: float | None = None  # whole tune, all classes; None: no limit but max_trials
    resume: bool = False
    devices: tuple[int, ...] | None = None  # CUDA ordinals; None: every visible GPU like device 0
    finalists: int = FINALISTS
    final_rounds: int = FINAL_ROUNDS
    # While every GPU waits for a batch's compiles, measure the nearest compiled guess (its result
    # answers the trial if the search asks for it later; the trials are the same either way).
    measure_ahead: bool = True


@dataclass
class TrialResult:
    """One variant's trial in a tune: the database's Trial without its key (the variant itself,
    not its tunables and symbol), and the fields of records.MEASURED."""

    variant: variant_mod.Variant
    outcome: str
    time_ms: float | None = None
    tflops: float | None = None
    max_error: float | None = None
    registers: int | None = None
    spills: int | None = None
    detail: str = ""
    resumed: bool = False   # taken from the database (--resume), not run again

    def trial(self, key: RecordKey, run_id: str) -> Trial:
        """The database's record of this trial."""
        return Trial(key, dict(self.variant.tunables), self.variant.symbol,
                     *(getattr(self, name) for name in MEASURED), run_id=run_id)

    @classmethod
    def resumed_from(cls, variant: variant_mod.Variant, trial: Trial) -> "TrialResult":
        """A trial the database holds, taken as this tune's (``--resume``)."""
        return cls(variant, *(getattr(trial, name) for name in MEASURED), resumed=True)


@dataclass
class Final:
    """One finalist's re-timing: the median of its block medians, and their spread."""

    variant: variant_mod.Variant
    block_ms: list[float]

    @property
    def median_ms(self) -> float:
        return _median(self.block_ms)

    @property
    def noise(self) -> float:
        """Relative spread of the block medians."""
        return (max(self.block_ms) - min(self.block_ms)) / self.median_ms if self.block_ms else math.inf


@dataclass
class TuneResult:
    shape: str
    problem: str
    run_id: str
    trials: list[TrialResult]
    best: TrialResult | None
    default: TrialResult | None
    seconds: float
    weight: float = 1.0
    finals: list[Final] = field(default_factory=list)
    stopped: str = ""   # why the search stopped early ("budget"), empty if it finished
    in_use: str = ""    # the record calls used before the tune (symbol and origin), empty if none
    kept: bool = False  # that record won the final re-timing and stays: nothing was recorded


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


# --- the family -------------------------------------------------------------------------------
# Everything specific to an operation (shape classes, inputs, reference, call, FLOPs) comes from
# the spec's family through the protocol of mlagen/families/base.py; this module names none.


def family_of(spec):
    from .. import families

    return families.get(spec.family, spec.path)


def problem_of(shape, family) -> str:
    """The shape class (record key problem) of ``shape``."""
    return family.problem_key(shape)


# --- GPU worker process -----------------------------------------------------------------------
