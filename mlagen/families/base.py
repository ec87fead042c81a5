"""The family protocol: what dispatch, tune, bench and the CLI may ask of a kernel family.

A family is the operation a spec implements (dense MLA prefill, sparse MLA prefill, ...). It lives
in one package, ``mlagen/families/<name>/``, whose ``FAMILY`` object implements :class:`Family`.
Nothing outside that package names it: specs say ``family: <name>`` and :func:`get` finds the
package of that name the first time it is asked for, so a new family is a new package and
nothing else.

The protocol has two sides:

* compile time (needs no torch, no GPU): validate the family's part of a spec, add its checks
  to the resource model, supply the values a template renders;
* run time: the shape classes tuning records are keyed by, argument checking into a call
  record, launching a selected kernel, and what tune and bench need to exercise a shape
  (inputs, the call, the reference, the comparison, the FLOP count);
* bench: the family's peers (:class:`Peer`), the other implementations of its operation that
  ``mlagen bench`` times against ours, and ours as a user calls it.

"Shape" is the family's own description of a problem (for dense MLA prefill: per-sequence query
and key lengths, heads, mask); its text form is what ``mlagen tune --shape`` and
``MLAGEN_RECORD_SHAPES`` files carry. A backend (CUDA, HIP) plugs in below this protocol: the
family launches a ``Selection``'s kernel through the runtime's ``launch``, whatever loaded it.

Layering: this module imports nothing from mlagen but ``errors``; family packages import the
layers below them (spec, variant, resources, runtime), and the modules below find families only
through :func:`get`, never by importing them.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import SpecError


@dataclass
class Prepared:
    """A peer made ready for one shape's inputs: everything a call needs (layout changes, padding,
    masks) is built, nothing is timed yet.

    ``fn`` is the timed call (its result is dropped). ``checked_call`` runs the problem once more
    and returns outputs in the form the family's :meth:`Family.compare` takes (a peer that does
    not compute one of them, such as an lse, returns None in its place). ``note`` says how the
    peer was adapted to the problem (it goes to the report)."""

    fn: Callable[[], Any]
    checked_call: Callable[[], Any]
    note: str = ""


def _always_available() -> str | None:
    return None


@dataclass(frozen=True)
class Peer:
    """One way ``mlagen bench`` runs a family's problem: another library's kernel, a plain
    PyTorch implementation, or ours through the public call.

    ``prepare(shape, inputs, arg)`` returns a :class:`Prepared` for the family's inputs
    (:meth:`Family.make_inputs`); ``arg`` is the text after ``name:`` on the command line
    (``mlagen:<spec>``), None without one; a peer whose ``arg`` is None takes none. ``status()``
    says why the peer cannot run here (a library not built, with where it was looked for and
    how to build it), None when it can: bench skips an unavailable default peer with that line,
    and reports one asked for by name as n/a with it. Every peer of a shape is credited with the
    family's FLOPs of the problem (:meth:`Family.flops`), so TFLOP/s compare times, whatever a
    peer computes beyond the problem (padding).

    ``ours``: mlagen itself (timed after each other peer in every round; a wrong result fails the
    run). ``default``: run when no peers are named. ``lead``: the strongest peer, the first
    column of the report."""

    name: str
    summary: str
    prepare: Callable[[Any, Mapping[str, Any], "str | None"], Prepared]
    ours: bool = False
    default: bool = False
    lead: bool = False
    arg: str | None = None
    status: Callable[[], "str | None"] = _always_available


class Family(ABC):
    """One kernel family. Subclasses set ``name`` (the spec's ``family:`` value, and the name of
    the package under ``mlagen/families/``)."""

    name: str

    # --- compile time ---------------------------------------------------------------------

    @abstractmethod
    def validate_spec(self, spec) -> None:
        """Raise SpecError (file, key path, what is allowed) if ``spec`` is not one this family can drive."""

    def check_variant(self, variant, target, resources) -> list[str]:
        """Family-specific reasons to prune ``variant`` on ``target`` (empty: it may compile)."""
        return []

    @abstractmethod
    def render_context(self, variant) -> dict:
        """Extra names for the template (beyond ``spec``, ``symbol`` and ``v``)."""

    # --- shape classes ----------------------------------------------------------------------

    @abstractmethod
    def problem_key(self, shape) -> str:
        """The shape class (tuning-record key) of ``shape``, e.g. ``causal/h128/q8192/k8192``."""

    @abstractmethod
    def problem_distance(self, a: str, b: str) -> float:
        """How far apart two shape classes are (0: the same; inf: a record of one is unusable for
        the other). Raises ValueError for text that is not a shape class of this family."""

    @abstractmethod
    def specialization(self, shape) -> dict[str, Any]:
        """The values of the spec's ``specialize`` axes this shape needs (e.g. ``{"mask": "causal"}``)."""

    @abstractmethod
    def problem_specialization(self, problem: str) -> dict[str, Any]:
        """The ``specialize`` values of a shape class (what a tuning record of it was built with)."""

    @abstractmethod
    def parse_shape(self, text: str, id: str | None = None):
        """A shape from one of its ids (:meth:`shapes`) or its text description (the grammar is the
        family's); ``id`` renames it. Errors are ValueError naming the item and what is allowed."""

    @abstractmethod
    def describe_shape(self, shape) -> str:
        """The text description of ``shape``; ``parse_shape`` reads it back."""

    def shapes(self) -> dict[str, Any]:
        """The family's named shapes (its BENCHMARKS.md ids, e.g. ``D1``), by id; ``parse_shape``
        reads these ids too. None by default."""
        return {}

    def refuses(self, spec, shape) -> str | None:
        """Why ``spec`` cannot compute ``shape`` whatever its variant (a sentence naming what
        the shape asks and what the spec serves), None when it can; ``mlagen tune`` asks before
        any GPU work. None by default (a spec's specialisation axes are checked when a variant is made)."""
        return None

    def problem_covers(self, problem: str, shape) -> bool:
        """Whether a record of shape class ``problem`` is one of ``shape``'s: by default its class
        is ``shape``'s (a family whose older keys name fewer sizes says they cover more)."""
        return self.problem_key(shape) == problem

    def check_shapes(self, problem: str) -> list:
        """The shapes ``mlagen check --gpu`` times a shipped record of shape class ``problem`` on:
        by default the named shapes it covers (:meth:`problem_covers`)."""
        return [s for s in self.shapes().values() if self.problem_covers(problem, s)]

    # --- run time: one call -----------------------------------------------------------------

    @abstractmethod
    def accepts(self, spec, call) -> bool:
        """Whether ``spec``'s kernels can take this call record's tensors (alignment, layout)."""

    @abstractmethod
    def launch(self, selection, call, stream: int) -> None:
        """Launch ``selection``'s kernel on ``stream`` for a call record; no host synchronisation."""

    # --- run time: what tune and bench exercise ---------------------------------------------

    @abstractmethod
    def make_inputs(self, shape, device, seed: int = 0) -> dict[str, Any]:
        """Fresh random inputs of ``shape`` on ``device`` (never zeros or constants). A family
        with specs for other input types than bf16 also takes ``dtype`` (the spec's
        ``problem.dtype``) here and in :meth:`compare`; ``tune`` passes it for those specs."""

    def stress_inputs(self, shape, device, seed: int = 0, **dtype) -> dict[str, Any] | None:
        """Inputs of ``shape`` whose values stress what :meth:`make_inputs`' zero-mean random data
        cannot (a kernel correct on that but wrong on these), or None (the default): the tuner
        checks every variant on them too (``mlagen.verify.PARTS``: "stress"). ``dtype`` as in
        :meth:`make_inputs`."""
        return None

    @abstractmethod
    def make_outputs(self, shape, device, fill: float = float("nan")):
        """Preallocated outputs of ``shape`` filled with ``fill`` (NaN: an element a kernel never
        writes shows up in :meth:`compare`)."""

    @abstractmethod
    def check_shape(self, shape):
        """A small problem of ``shape``'s kind with awkward sizes (empty, length-1, off-tile
        pieces), which the tuner checks every variant on before the real shape."""

    @abstractmethod
    def call(self, inputs: Mapping[str, Any], *, variant=None, kernel: str | None = None, outputs=None,
             check: bool = False):
        """Run the operation on ``inputs`` (through the public entry point); ``variant`` pins a
        variant, ``kernel`` a spec; ``outputs`` are preallocated outputs to write. Returns the outputs."""

    @abstractmethod
    def reference(self, shape, inputs: Mapping[str, Any], heads: int | None = None):
        """The high-precision reference outputs of ``inputs``: of every head, or of the first
        ``heads`` (a sample that keeps the reference cheap on large shapes; :meth:`compare` then
        checks accuracy on those heads and coverage on all)."""

    @abstractmethod
    def compare(self, got, ref):
        """Compare outputs with the reference; returns an object with ``ok``, ``rel_l2`` and
        ``problem`` (None when it passes, else a sentence)."""

    def compare_stress(self, got, ref, **dtype):
        """How outputs on :meth:`stress_inputs` compare with their reference (default: :meth:`compare`;
        a family may ask more there, such as no bias)."""
        return self.compare(got, ref, **dtype)

    @abstractmethod
    def flops(self, shape) -> int:
        """FLOPs of one call by the BENCHMARKS.md convention."""

    #: The relative L2 error of the output :meth:`compare` allows (reports quote it).
    tolerance: float = 0.0

    def tolerance_for(self, shape) -> float:
        """The relative L2 error :meth:`compare` allows for ``shape`` (default :attr:`tolerance`;
        a family whose shapes differ in precision, e.g. a compute mode, says so per shape)."""
        return self.tolerance

    # --- bench --------------------------------------------------------------------------------

    def summary(self, shape) -> str:
        """A short human description of ``shape`` for reports (default: its text description)."""
        return self.describe_shape(shape)

    def peers(self) -> dict[str, Peer]:
        """The family's bench peers by name, in the order of the report's columns (a ``lead``
        peer moves to the front): ``PEERS`` of the family's ``peers`` module
        (``mlagen/families/<name>/peers.py``), none if it has no such module.

        Found by name, as :func:`get` finds the family: a peer module prepares ours through the
        family's public call, so it imports the family's package, which must not import it back."""
        module_name = f"{__package__}.{self.name}.peers"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            return {}
        return dict(module.PEERS)


_REGISTRY: dict[str, Family] = {}
_lock = threading.RLock()


def register(family: Family) -> Family:
    """Make ``family`` known by its name (a family package calls this when imported)."""
    with _lock:
        _REGISTRY[family.name] = family
    return family


def names() -> list[str]:
    """Every family under ``mlagen/families/`` (a package, or a single module), sorted; ``base``
    (the protocol) and ``kit`` (the shared call path) are none."""
    return sorted(m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)]) if m.name not in ("base", "kit"))


def get(name: str, path=None) -> Family:
    """The family named ``name``, importing its package on first use.

    Raises:
        SpecError: naming ``path`` (the spec that asked) and the known families.
    """
    family = _REGISTRY.get(name)
    if family is not None:
        return family
    with _lock:
        if name not in _REGISTRY and name in names():
            # A plugin lookup by name: the package registers itself when imported.
            importlib.import_module(f"{__package__}.{name}")
        family = _REGISTRY.get(name)
    if family is None:
        raise SpecError(path or "<spec>", "family", f"{name!r} is not one of {names()}")
    return family
