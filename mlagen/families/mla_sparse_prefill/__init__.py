"""Sparse MLA prefill (``../shared/MLA.md`` section 2, DeepSeek-V3.2 DSA): validation, launch,
reference, FLOPs and benchmark inputs.

Compile side: :class:`MlaSparsePrefillFamily` checks specs of the family (the ``gather`` ABI: raw
pointers and strides, since gathered rows cannot be described to TMA), adds the register-pool and
schedule checks to the resource model, and supplies the render context.

Run side, as functions that map onto a family protocol: :func:`prepare` (arguments -> :class:`Call`,
no host synchronisation), :func:`problem_key` (the tuning shape class), :func:`launch`,
:func:`reference`, :func:`flops` and :func:`make_inputs`. Bench peers (FlashMLA, a PyTorch gather
+ matmul, the public call): :mod:`.peers`.
"""

from __future__ import annotations

from dataclasses import replace

from ... import operands
from ...errors import SpecError
from .. import kit
from ..base import Family, register
from . import problem as _problem
from .compile import accepts, evaluate_schedule, specialization, validate_schedule
from .params import ABIS
from .problem import D_QK_VALUES, D_V, NAME, SHAPES, ProblemKey, Shape, flops, problem_key
from .reference import REL_TOL

# --- the family (compile side) --------------------------------------------------------------


class MlaSparsePrefillFamily(kit.ShapesOf, Family):
    problem = _problem
    name = NAME

    def validate_spec(self, spec) -> None:
        problem = dict(spec.problem)
        for key, value in {"d_v": D_V, "dtype": "bf16"}.items():
            if problem.get(key) != value:
                raise SpecError(spec.path, f"problem.{key}",
                                f"{problem.get(key)!r}: this family implements {key} = {value!r}")
        for key in ("max_heads",):
            if key in problem and not (isinstance(problem[key], int) and not isinstance(problem[key], bool)
                                       and problem[key] >= 1):
                raise SpecError(spec.path, f"problem.{key}", f"{problem[key]!r}: expected a positive integer")
        formats = problem.get("preferred_kv_formats")
        allowed = list(dict(spec.specialize).get("kv_format", ()))
        if formats is not None and (not isinstance(formats, str) or not set(formats.split(",")) <= set(allowed)):
            raise SpecError(spec.path, "problem.preferred_kv_formats", f"{formats!r}: expected comma-separated "
                            f"names of the spec's kv_format values {allowed}")
        for key in ("persistent", "two_pools"):
            if key in problem and not isinstance(problem[key], bool):
                raise SpecError(spec.path, f"problem.{key}", f"{problem[key]!r}: expected true or false")
        if "compute" in problem:
            raise SpecError(spec.path, "problem.compute", "the fp8 compute mode was removed (2026-12-01): every "
                            "spec of this family computes in bf16; drop the key")
        if spec.abi not in ABIS:
            raise SpecError(spec.path, "abi", f"{spec.abi!r} is not one of {sorted(ABIS)}")
        axes = dict(spec.specialize)
        if set(axes) != {"d_qk", "paged", "kv_format"} or not set(axes["d_qk"]) <= set(D_QK_VALUES) \
                or not set(axes["paged"]) <= {False, True} or not set(axes["kv_format"]) <= set(operands.NAMES):
            raise SpecError(spec.path, "specialize", f"this family specialises on d_qk (values from "
                            f"{list(D_QK_VALUES)}), paged (false, true) and kv_format (from {list(operands.NAMES)})")
        if spec.schedule is not None:
            validate_schedule(spec)
        kit.check_default_constraints(spec)

    def check_variant(self, variant, target, resources) -> list[str]:
        fmt = operands.get(variant["kv_format"], variant["d_qk"])
        if fmt.d_qk != variant["d_qk"]:
            return [f"kv_format {fmt.name} rows hold {fmt.values} latent + {fmt.rope} rope values: d_qk must be "
                    f"{fmt.d_qk}"]
        if variant.spec.schedule is None:
            return []
        if not target.has("wgmma") or not target.has("setmaxnreg"):
            return [f"{target.name} has no wgmma/setmaxnreg; this schedule needs sm_90a"]
        s = evaluate_schedule(variant)
        reasons = []
        pool = resources.threads * min(255, 65536 // resources.threads // 8 * 8)
        total = sum(128 * wgs * regs for wgs, regs in s["roles"].values())
        if total > pool:
            reasons.append(f"register budget: roles need {total} registers, the CTA holds {pool} at launch "
                           f"({resources.threads} threads); setmaxnreg would wait forever")
        for name, (wgs, regs) in s["roles"].items():
            if not (24 <= regs <= 256 and regs % 8 == 0):
                reasons.append(f"{name} registers {regs}: setmaxnreg takes a multiple of 8 in [24, 256]")
        if s["roles"]["consumer"][0] != 2 or s["roles"]["producer"][0] != 1:
            reasons.append("this kernel has one gathering warpgroup and two consumer warpgroups")
        # Each buffer is gathered in two halves with their own barriers.
        if s["gather"]["rows"] != 64 or s["gather"]["buffers"] != 2 or s["gather"]["halves"] != 2 \
                or s["gather"]["threads_per_row"] != 8:
            reasons.append("the gather is 64 rows into 2 buffers of 2 halves, 8 threads per 128-byte row")
        return reasons

    def render_context(self, variant) -> dict:
        from ...resources import estimate

        fmt = operands.get(variant["kv_format"], variant["d_qk"])
        # The operand as data for the template: its device loader and row layout.
        kv = {"format": fmt.name, "quantized": fmt.quantized, "row_bytes": fmt.row_bytes, "value_count": fmt.values,
              "scale_block": fmt.scale_block, "scale_offset": fmt.scale_offset, "rope_offset": fmt.rope_offset,
              "rope": fmt.rope, "scale_dtype": fmt.scale_dtype, "page_scales": fmt.page_scales}
        return {"params_decl": ABIS[variant.spec.abi](fmt.name).c_declaration(),
                "smem_bytes": estimate(variant).smem_bytes, "kv": kv}

    # --- shape classes ----------------------------------------------------------------------

    def problem_key(self, shape) -> str:
        return str(problem_key(shape))

    def problem_distance(self, a: str, b: str) -> float:
        return ProblemKey.parse(a).distance(ProblemKey.parse(b))

    def specialization(self, shape) -> dict:
        return specialization(shape)

    def problem_specialization(self, problem: str) -> dict:
        key = ProblemKey.parse(problem)
        return {"d_qk": key.d_qk, "paged": key.layout == "paged", "kv_format": key.kv_format}

    def problem_covers(self, problem: str, shape) -> bool:
        """The shape's class, or a key without the pool's size (written before it was part of the
        key) of the shape's class but for that size."""
        return ProblemKey.parse(problem).covers(problem_key(shape))

    def check_shapes(self, problem: str) -> list[Shape]:
        """The named shapes the class covers (an old key without the pool's size: every pool
        size); for a quantized cache's class, the first bf16 shape it covers read from that
        format (records of them are tuned on S1's sizes)."""
        same = super().check_shapes(problem)
        key = ProblemKey.parse(problem)
        if same or key.kv_format == "bf16":
            return same
        plain = replace(key, kv_format="bf16")
        return [replace(s, kv_format=key.kv_format) for s in SHAPES.values()
                if plain.covers(problem_key(s))][:1]

    def refuses(self, spec, shape) -> str | None:
        """A spec serves its kv_format values."""
        formats = dict(spec.specialize).get("kv_format", ())
        if getattr(shape, "kv_format", "bf16") not in formats:
            return f"the shape's kv={shape.kv_format} is not one of the spec's kv_format values {list(formats)}"
        if getattr(shape, "s_kv", 0) and getattr(shape, "window", 0) and not dict(spec.problem).get("two_pools"):
            return "the shape has two KV pools; this spec's kernel reads one (problem.two_pools is not set)"
        return None

    # --- run time ---------------------------------------------------------------------------

    def accepts(self, spec, call) -> bool:
        return accepts(spec, call)

    def launch(self, selection, call, stream: int) -> None:
        from .entry import launch

        launch(selection, call, stream)

    def make_inputs(self, shape, device, seed: int = 0) -> dict:
        if getattr(shape, "window", 0):   # DeepSeek-V4: the window's pool and the compressed pool
            from .v4 import make_inputs as v4_inputs

            return v4_inputs(shape, device, seed)
        from .reference import make_inputs

        return make_inputs(shape, device, seed)

    def make_outputs(self, shape, device, fill: float = float("nan")):
        import torch

        return (torch.full((shape.sq, shape.heads, D_V), fill, dtype=torch.bfloat16, device=device),
                torch.full((shape.sq, shape.heads), fill, dtype=torch.float32, device=device),
                torch.full((shape.sq, shape.heads), fill, dtype=torch.float32, device=device))

    def check_shape(self, shape) -> Shape:
        """5 tokens, up to 20 heads (a partial 64-row group), topk 200 (not a multiple of the
        64-row block, so the last pair is part-invalid) over 300 rows, the shape's d_qk."""
        return Shape(f"check:{shape.id}", 5, min(shape.heads, 20), 200, 300, shape.d_qk, True,
                     getattr(shape, "kv_format", "bf16"))

    def call(self, inputs, *, variant=None, kernel=None, outputs=None, check=False):
        from .entry import run

        out, max_logits, lse = outputs if outputs is not None else (None, None, None)
        return run(inputs["q"], inputs["kv"], inputs["indices"], softmax_scale=inputs["softmax_scale"],
                   topk_length=inputs.get("topk_length"), attn_sink=inputs.get("attn_sink"), out=out,
                   max_logits=max_logits, lse=lse, kernel=variant if variant is not None else kernel,
                   kv_format=inputs.get("kv_format", "bf16"), **_extra(inputs))

    def reference(self, shape, inputs, heads: int | None = None):
        """The reference on the first ``heads`` heads (fp32-dequantized rows for a quantized cache)."""
        from .reference import reference

        h = inputs["q"].shape[1] if heads is None else min(heads, inputs["q"].shape[1])
        sink = inputs.get("attn_sink")
        return reference(inputs["q"][:, :h], inputs["kv"], inputs["indices"], softmax_scale=inputs["softmax_scale"],
                         topk_length=inputs.get("topk_length"), attn_sink=None if sink is None else sink[:h],
                         kv_format=inputs.get("kv_format", "bf16"), **_extra(inputs))

    def compare(self, got, ref):
        from .reference import compare

        return compare(got, ref)

    def flops(self, shape) -> int:
        """Both pools' key positions (a V4 shape's window and compressed entries), invalid ones counted."""
        return flops(shape.sq, shape.heads, getattr(shape, "keys", shape.topk), shape.d_qk)

    @property
    def tolerance(self) -> float:
        return REL_TOL


def _extra(inputs: dict) -> dict:
    """The second pool's arguments of a two-pool shape's inputs (none for one pool)."""
    return {k: inputs[k] for k in ("extra_kv", "extra_indices", "extra_topk_length", "extra_kv_format")
            if inputs.get(k) is not None}


FAMILY = register(MlaSparsePrefillFamily())

