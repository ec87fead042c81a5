"""The autotuner (``mlagen tune``): search a spec's variants for each shape class, record every trial, keep the winner.

What is tuned. ``TuneConfig.shapes`` lists shapes (BENCHMARKS.md ids, descriptions such as
``b=4,q=4096,h=16,causal``, or the spec's family's shape objects) or weighted
:class:`~mlagen.shapes.WorkloadItem` entries from a workload file; texts are read by the spec's
family (:func:`mlagen.shapes.parse_shape`). Shapes are grouped by shape
class (the dispatcher's problem key: mask, and heads, mean query and key length rounded up to
powers of two), because a tuning record applies to a class. Every distinct class is tuned once,
on its heaviest shape; the classes run in order of their summed weight, heaviest first, and
``budget_s`` is split between them in proportion to that weight (equal weights without a
workload file). ``max_trials`` is per class.

How. A search strategy proposes variants; the resource model prunes them; the rest compile on
the CPU pool while one measuring worker process per GPU (``devices``) checks each compiled
variant against the float32 reference (a small ragged problem with odd lengths, then two heads
of the real shape) and times it if right. Failures are data: a compile error, a wrong result, a
crash (the worker dies or the CUDA context is lost) and a hang (the trial outlives its timeout;
the worker is killed) are recorded like successes and never selected. Results reach the search
in proposal order, so the trials and records do not depend on how many GPUs ran them. With
several GPUs every measurement is split into equal shares, one per GPU, and each check of a new
trial runs once, on one of them (:class:`TrialRunner` says how; ``docs/notes.md`` why).

Strategies: ``global`` (default for spaces larger than ``max_trials``): random feasible samples
plus known good starts (the spec default, winners recorded for other shape classes), successive
halving with re-timing (keep the fastest third, time them again with twice the calls, until
``LOCAL_STARTS`` remain), then coordinate descent from each survivor (``docs/notes.md`` says how
these numbers were chosen). ``exhaustive`` (default for
small spaces) and ``coordinate`` (descent from the default) stay available.

Choosing. The fastest few correct variants (and the spec default) are re-timed in interleaved
rounds (in shares on every GPU); the winner is the lowest median. Finalists within the measured noise of the
fastest are tied, and a tie goes to the variant closest to the spec default, then the first
symbol in sort order, so that runs with different seeds agree. ``resume`` reuses the trials the
database already holds for the same record key and variant symbol instead of repeating them.

The package follows the data flow: :mod:`.config` (what is asked, what comes back),
:mod:`.search` (the strategies), :mod:`.worker` (the measuring process per GPU), :mod:`.runner`
(a batch of asks on the workers while the CPU pool compiles), :mod:`.finals` (the final
re-timing and the choice), :mod:`.loop` (one shape class), :mod:`.orchestrate` (a whole tune).
"""

from __future__ import annotations

from .config import (EXTRA_ROUNDS, FINAL_ROUNDS, FINALIST_DISTANCE, FINALISTS, NOISE_CAP, NOISE_FLOOR, Final,
                     TrialResult, TuneConfig, TuneResult, family_of, problem_of)
from .finals import beats, choose, diverse_finalists, noise_allowance, unsettled
from .loop import FINAL_SHARE, KNOWN_REPAIRS, ShapeClass, known_starts, record_in_use, shape_classes, tune_class
from .orchestrate import tune
from .runner import AHEAD_POLL_S, CompileTime, TrialRunner, WorkerTime
from .search import (ETA, GLOBAL_SHARE, LOCAL_REPAIR_WIDTH, LOCAL_STARTS, LOOKAHEAD, REPAIR_CHANGES, REPAIR_WIDTH,
                     STRATEGIES, Ask, Coordinate, Exhaustive, Global, Search, make_search)
from .worker import GpuWorker, default_devices, parse_devices

__all__ = [
    "AHEAD_POLL_S", "ETA", "EXTRA_ROUNDS", "FINAL_ROUNDS", "FINAL_SHARE", "FINALIST_DISTANCE", "FINALISTS",
    "GLOBAL_SHARE", "KNOWN_REPAIRS", "LOCAL_REPAIR_WIDTH", "LOCAL_STARTS", "LOOKAHEAD", "NOISE_CAP", "NOISE_FLOOR",
    "REPAIR_CHANGES", "REPAIR_WIDTH", "STRATEGIES", "Ask", "CompileTime", "Coordinate", "Exhaustive", "Final",
    "Global", "GpuWorker", "Search", "ShapeClass", "TrialResult", "TrialRunner", "TuneConfig", "TuneResult",
    "WorkerTime", "beats", "choose", "default_devices", "diverse_finalists", "family_of", "known_starts",
    "make_search", "noise_allowance", "parse_devices", "problem_of", "record_in_use", "shape_classes", "tune", "tune_class",
    "unsettled",
]
