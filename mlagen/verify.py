"""Correctness of a kernel on a shape, through the family protocol (``mlagen/families/base.py``).

The family supplies the inputs, the high-precision reference, the public call and the
comparison; this module holds the procedure ``tune`` applies to every variant before timing it:
first a small problem of awkward sizes (empty, length-1 and off-tile pieces; the family's
``check_shape``), then the real shape, then the real shape on the family's ``stress_inputs`` where it
has them (values that random zero-mean data would never show a defect on: V with a channel mean for
the FP8 prefill), each with NaN-poisoned outputs so that an element the
kernel never writes shows up, each call reading its offsets back (``check=True``). Accuracy is
compared on the first ``CHECK_HEADS`` heads of the real shape (the reference of a large shape is
costly), coverage on all of them.
"""

from __future__ import annotations

from typing import Any

CHECK_HEADS = 2     # heads of the real shape compared with the reference (every head is checked for coverage)
# The checks of a variant, in order; each can run on its own. "stress" is the real shape on the family's
# stress_inputs (values random zero-mean data cannot show a defect on), where the family has them.
PARTS = ("check problem", "shape", "stress")


class Verifier:
    """Inputs, references and checks of one shape for one family, made once and used for every
    variant (a GPU worker holds one). Nothing here names a family."""

    def __init__(self, family, shape, device, seed: int = 0, heads: int = CHECK_HEADS, dtype: str = "bf16"):
        """``dtype``: the input type of the kernels verified (the spec's ``problem.dtype``); a
        family that takes other types than bf16 accepts it in make_inputs and compare."""
        self.family, self.shape, self.device = family, shape, device
        self._dtype = {} if dtype == "bf16" else {"dtype": dtype}
        self.inputs = family.make_inputs(shape, device, seed, **self._dtype)
        self.ref = family.reference(shape, self.inputs, heads)
        self.small = family.check_shape(shape)
        self.small_inputs = family.make_inputs(self.small, device, seed + 1, **self._dtype)
        self.small_ref = family.reference(self.small, self.small_inputs)
        self.stress = family.stress_inputs(shape, device, seed + 2, **self._dtype)
        self.stress_ref = None if self.stress is None else family.reference(shape, self.stress, heads)

    def verify(self, variant: Any = None, kernel: str | None = None,
               parts: tuple[str, ...] = PARTS) -> tuple[str | None, float | None]:
        """(None, largest relative error) if the kernel is right on both problems, else (what is
        wrong, the relative error of the problem that failed). ``parts`` (names from ``PARTS``)
        runs only those checks (the tuner spreads them over several GPUs); the error is None
        when none ran."""
        unknown = [p for p in parts if p not in PARTS]
        if unknown:
            raise ValueError(f"parts: {unknown[0]!r} is not one of {list(PARTS)}")
        errors = []
        for label, shape, inputs, ref in (("check problem", self.small, self.small_inputs, self.small_ref),
                                          ("shape", self.shape, self.inputs, self.ref),
                                          ("stress", self.shape, self.stress, self.stress_ref)):
            if label not in parts or inputs is None:
                continue
            outputs = self.family.make_outputs(shape, self.device)
            got = self.family.call(inputs, variant=variant, kernel=kernel, outputs=outputs, check=True)
            _synchronize(self.device)
            compare = self.family.compare_stress if label == "stress" else self.family.compare
            result = compare(got, ref, **self._dtype)
            if not result.ok:
                return f"{label}: {result.problem}", result.rel_l2
            errors.append(result.rel_l2)
        return None, max(errors) if errors else None

    def outputs(self):
        """Outputs of the real shape to time calls with (written by every call)."""
        return self.family.make_outputs(self.shape, self.device, fill=0.0)

    def call(self, variant: Any, outputs, check: bool = False):
        """The family's public call on the real shape. Timed calls leave ``check`` off: reading
        offsets back inside the timed region would add a host stall to every kernel compared."""
        return self.family.call(self.inputs, variant=variant, outputs=outputs, check=check)

    def flops(self) -> int:
        return self.family.flops(self.shape)


def _synchronize(device) -> None:
    if getattr(device, "type", device) == "cpu":
        return
    import torch

    torch.cuda.synchronize(device)
