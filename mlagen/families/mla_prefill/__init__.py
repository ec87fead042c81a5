"""Dense MLA prefill (``../shared/MLA.md`` section 1): the family of ``mla_prefill_sm80`` and
``mla_prefill_sm90``.

Modules, in the order a call meets them:

* compile time: :mod:`.problem` (constants, the dense ``Shape``, the BENCHMARKS.md ids D1-D11 and
  the description grammar, shape classes, FLOPs), :mod:`.traits` (head geometry, mask and score
  traits), :mod:`.params` (the kernel parameter structs and the values a call gives them),
  :mod:`.schedule` (the Hopper barrier schedule), :mod:`.compile` (spec checks, pruning, render
  values, which specs a call can take);
* run time: :mod:`.call` (the call's arguments as one ``DenseArgs``, checked into a ``Call``;
  what ``MLAGEN_RECORD_SHAPES`` notes), :mod:`.tma` (the sm90 launcher), :mod:`.entry` (launch
  plans, prepare, select, launch), :mod:`.op` (the torch custom ops and the public
  ``mla_prefill``), :mod:`.reference` (reference, inputs, comparison);
* bench: :mod:`.peers` (FlashAttention-3, cuDNN, FlashAttention-2 and the public call).

``FAMILY`` implements :class:`mlagen.families.base.Family`. Importing this package does not
import torch; it re-exports nothing: import a name from the module that defines it.
"""

from __future__ import annotations

from .. import kit
from ..base import Family, register
from . import compile as _compile
from . import problem as _problem
from .compile import accepts
from .problem import GEOMETRIES, ProblemKey, Shape, shape_flops
from .reference import REL_TOL


class MlaPrefillFamily(kit.ShapesOf, Family):
    """Dense MLA prefill: q [Tq, H, 192], k/v [Tk, H, 128] (+ k_rope) -> out [Tq, H, 128], lse [Tq, H];
    other head geometries, masks and score traits by MLA.md section 1b."""

    name = "mla_prefill"
    problem = _problem

    def validate_spec(self, spec) -> None:
        _compile.validate_spec(spec)

    def check_variant(self, variant, target, resources) -> list[str]:
        return _compile.check_variant(variant, target, resources)

    def render_context(self, variant) -> dict:
        return _compile.render_context(variant)

    def problem_key(self, shape) -> str:
        return str(_problem.shape_key(shape))

    def problem_distance(self, a: str, b: str) -> float:
        return ProblemKey.parse(a).distance(ProblemKey.parse(b))

    def specialization(self, shape) -> dict:
        return _problem.shape_key(shape).specialization()

    def problem_specialization(self, problem: str) -> dict:
        return ProblemKey.parse(problem).specialization()

    def check_shapes(self, problem: str) -> list[Shape]:
        """The named shapes of the class, else one sequence of the class's lengths and heads (a
        record tuned on a described shape, such as 1 x 8192 with 64 heads)."""
        # The key names the geometry, mask and score traits, so a named shape of the class has them too.
        same = super().check_shapes(problem)
        if same:
            return same
        key = ProblemKey.parse(problem)
        # A window or chunk a quarter of the queries long stands for the class's sizes.
        mask = {"window": f"window={max(1, key.q_per_seq // 4)}/0", "chunked": f"chunk={max(1, key.q_per_seq // 4)}"}
        traits = "".join((f",d={'/'.join(map(str, GEOMETRIES[key.geometry]))}",
                          ",softcap=30" if "softcap" in key.score else "", ",sink" if "sink" in key.score else ""))
        return [self.parse_shape(f"b=1,q={key.q_per_seq},k={key.k_per_seq},h={key.heads},"
                                 f"{mask.get(key.mask, key.mask)}{traits}", id=problem)]

    def accepts(self, spec, call) -> bool:
        return accepts(spec, call)

    def launch(self, selection, call, stream: int) -> None:
        from .entry import launch

        launch(selection, call, stream)

    def make_inputs(self, shape, device, seed: int = 0, dtype: str = "bf16") -> dict:
        """Random inputs of ``shape``; ``dtype`` "fp8_e4m3" / "fp8_e4m3fnuz" gives quantized
        operands with descale factors (not part of the shape grammar: tune and bench use bf16)."""
        from .reference import make_inputs

        return make_inputs(shape, device, seed, dtype)

    def stress_inputs(self, shape, device, seed: int = 0, dtype: str = "bf16") -> dict | None:
        """FP8: V with a channel mean (reference.make_stress_inputs); None for bf16."""
        from .reference import make_stress_inputs

        return make_stress_inputs(shape, device, seed, dtype)

    def make_outputs(self, shape, device, fill: float = float("nan")):
        import torch

        tq = sum(shape.q_lens)
        return (torch.full((tq, shape.heads, shape.dims[2]), fill, dtype=torch.bfloat16, device=device),
                torch.full((tq, shape.heads), fill, dtype=torch.float32, device=device))

    def check_shape(self, shape) -> Shape:
        """Five sequences of 1, 77, 0, 300 and 129 queries (a cached prefix of 0, 0, 5, 33, 0
        keys when causal; other key lengths when not), the shape's mask and traits, at most 16 heads."""
        from dataclasses import replace

        k_lens = (1, 77, 5, 333, 129) if shape.mask != "none" else (3, 50, 5, 333, 200)
        return replace(shape, id=f"check:{getattr(shape, 'id', '')}", q_lens=(1, 77, 0, 300, 129), k_lens=k_lens,
                       heads=min(shape.heads, 16))

    def call(self, inputs, *, variant=None, kernel=None, outputs=None, check=False):
        """``mla_prefill`` on ``inputs`` (from :meth:`make_inputs`); ``outputs`` = (out, lse) to
        write. ``check`` reads the cu_seqlens back and checks them (a host sync: not for timing)."""
        from .op import mla_prefill

        out, lse = outputs if outputs is not None else (None, None)
        traits = {name: inputs[name] for name in ("window_size", "chunk_size", "softcap", "attn_sink")
                  if name in inputs}
        return mla_prefill(inputs["q"], inputs["k"], inputs["v"], k_rope=inputs.get("k_rope"),
                           cu_seqlens_q=inputs.get("cu_seqlens_q"), cu_seqlens_k=inputs.get("cu_seqlens_k"),
                           causal=inputs.get("causal", True), out=out, lse=lse, check_seqlens=check, **traits,
                           kernel=variant if variant is not None else kernel, q_descale=inputs.get("q_descale"),
                           k_descale=inputs.get("k_descale"), v_descale=inputs.get("v_descale"))

    def reference(self, shape, inputs, heads: int | None = None):
        from .reference import reference_heads

        return reference_heads(shape, inputs, heads)

    def compare(self, got, ref, dtype: str = "bf16"):
        """The result against the reference; fp8 inputs (``dtype``) allow FP8_REL_TOL."""
        from .reference import FP8_REL_TOL, REL_TOL, compare

        return compare(got[0], got[1], ref[0], ref[1], rel_tol=REL_TOL if dtype == "bf16" else FP8_REL_TOL)

    def compare_stress(self, got, ref, dtype: str = "bf16"):
        """:meth:`compare`, and no bias beyond reference.STRESS_BIAS (for the stress inputs: V with a
        channel mean)."""
        from .reference import compare_bias

        return compare_bias(got[0], ref[0], self.compare(got, ref, dtype=dtype))

    def flops(self, shape) -> int:
        return shape_flops(shape)

    tolerance = REL_TOL   # bf16 inputs

    def summary(self, shape) -> str:
        """``1 × 8192, H 128, causal``."""
        return shape.description


FAMILY = register(MlaPrefillFamily())
