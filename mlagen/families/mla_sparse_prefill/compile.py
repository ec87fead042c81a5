"""The compile-time side of sparse MLA prefill: which spec serves which call (its specialisation
axes, preference), the Hopper schedule's checks, render values."""

from __future__ import annotations

from ...errors import SpecError
from .params import ABIS
from .problem import NAME, is_paged

SCHEDULE_KEYS = ("roles", "gather", "consumer_split")


def family_specs():
    """The family's packaged specs, highest priority first (dispatch's list)."""
    from ...dispatch import family_specs

    return family_specs(NAME)


def specialization(call) -> dict:
    """The compile-time values a call (or Shape) needs: d_qk, whether kv is a pool of strided
    pages, and the KV format."""
    return {"d_qk": call.d_qk, "paged": is_paged(call), "kv_format": getattr(call, "kv_format", "bf16")}


def accepts(spec, call) -> bool:
    """Whether ``spec`` can serve ``call`` (a Call or a Shape): its ABI, its specialisation axes
    hold the call's values, and a call with a second pool needs a two-pool kernel."""
    axes = dict(spec.specialize)
    return (spec.abi in ABIS and all(v in axes.get(k, ()) for k, v in specialization(call).items())
            and (getattr(call, "extra", None) is None or two_pools(spec)))


def two_pools(spec) -> bool:
    """Whether the spec's kernel reads a second KV pool (``problem.two_pools``, MLA.md 2b)."""
    return bool(dict(spec.problem).get("two_pools", False))


def two_pool_targets() -> list[str]:
    """The targets of the family's specs whose kernels read two pools."""
    return sorted({t for s in family_specs() if two_pools(s) for t in s.targets})


def preferred(spec, call) -> bool:
    """Whether dispatch may choose ``spec`` for ``call`` unasked: a spec with ``problem.max_heads``
    (a kernel for few heads, correct for any count) is chosen only up to that many heads, and one
    with ``problem.preferred_kv_formats`` (comma-separated names) only for caches of those formats
    (it reads the others when asked by name)."""
    problem = dict(spec.problem)
    fmt = getattr(call, "kv_format", "bf16")
    formats = problem.get("preferred_kv_formats")
    return call.heads <= problem.get("max_heads", call.heads) and (formats is None or fmt in formats.split(","))


def kv_format_targets(kv_format: str) -> list[str]:
    """The targets of the family's specs that read ``kv_format`` caches."""
    return sorted({t for s in family_specs() if kv_format in dict(s.specialize).get("kv_format", ())
                   for t in s.targets})



def validate_schedule(spec) -> None:
    from ... import expr

    sched = spec.schedule
    if not isinstance(sched, dict) or set(sched) != set(SCHEDULE_KEYS):
        raise SpecError(spec.path, "schedule", f"expected the keys {list(SCHEDULE_KEYS)}")
    known = ({k for k, _ in spec.problem} | {k for k, _ in spec.derived} | {k for k, _ in spec.specialize}
             | {t.name for t in spec.tunables})

    def check(value, where):
        try:
            e = expr.parse(value)
        except expr.ExprError as exc:
            raise SpecError(spec.path, where, str(exc)) from None
        if e.names - known:
            raise SpecError(spec.path, where, f"unknown name(s) {sorted(e.names - known)}")

    roles = sched["roles"]
    if not isinstance(roles, dict) or list(roles) != ["producer", "consumer"]:
        raise SpecError(spec.path, "schedule.roles", "expected the roles producer and consumer, in that order")
    for name, body in roles.items():
        if not isinstance(body, dict) or set(body) != {"warpgroups", "registers", "tasks"}:
            raise SpecError(spec.path, f"schedule.roles.{name}", "expected keys warpgroups, registers, tasks")
        check(body["warpgroups"], f"schedule.roles.{name}.warpgroups")
        check(body["registers"], f"schedule.roles.{name}.registers")
    gather = sched["gather"]
    keys = {"rows", "buffers", "halves", "threads_per_row", "l2_evict_last"}
    if not isinstance(gather, dict) or set(gather) != keys:
        raise SpecError(spec.path, "schedule.gather", f"expected keys {sorted(keys)}")
    for k, value in gather.items():
        check(value, f"schedule.gather.{k}")
    split = sched["consumer_split"]
    if split != {"scores": "alternate_blocks", "output_columns": "halves"}:
        raise SpecError(spec.path, "schedule.consumer_split",
                        "this kernel splits scores by alternate blocks and the output columns in halves")


def evaluate_schedule(variant) -> dict:
    from ... import expr

    env = variant.env()
    sched = variant.spec.schedule
    roles = {name: (int(expr.parse(b["warpgroups"])(env)), int(expr.parse(b["registers"])(env)))
             for name, b in sched["roles"].items()}
    gather = {k: expr.parse(v)(env) for k, v in sched["gather"].items()}
    return {"roles": roles, "gather": gather}

