"""The barrier schedule of warp-specialized Hopper kernels, described in the spec and checked here.

A spec's ``schedule`` section names the warp roles (how many warpgroups each, their register
budget and their tasks), the pipelines between roles (stages, producer, consumer), the ordering
between consumer warpgroups, intra-warpgroup overlap, the tile scheduler, the cluster size and
the swizzle of every TMA operand. Values are expressions over the spec's tunables, so the tuner
searches the schedule like any other parameter.

``validate_spec`` checks the structure when the spec loads; ``check_variant`` checks one variant
against the hardware budgets (registers per SM, setmaxnreg limits, TMA box limits, swizzle width
against tile width) before anything is compiled, with a message that says which budget broke and
by how much.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from ... import expr
from ...errors import SpecError

ROLE_KEYS = ("warpgroups", "registers", "tasks")
PRODUCER_KEYS = ROLE_KEYS + ("load_warps",)
PRODUCER_TASKS = ("load_q", "load_k", "load_v")
CONSUMER_TASKS = ("mma_qk", "softmax", "mma_pv", "store_o")
PIPELINE_KEYS = ("stages", "producer", "consumer")
TOP_KEYS = ("roles", "pipelines", "consumer_order", "intra_warpgroup_overlap", "scheduler", "cluster", "epilogue",
            "swizzle")
ORDERS = ("none", "pingpong")
SCHEDULERS = ("static", "persistent", "dynamic")
# The output through shared memory and a TMA store, staged in the Q tile (tma) or in the V stage the
# last P V read (vtma, which lets the next tile's Q load under this tile's last P V and epilogue),
# or registers straight to global (direct).
EPILOGUES = ("tma", "vtma", "direct")
SWIZZLES = (32, 64, 128)
CLUSTERS = (1, 2)  # CTAs per cluster; 2 shares each K/V tile between a pair of query tiles (multicast)
OPERANDS = ("q", "k", "v")
REGS_PER_SM = 65536
TMA_BOX_MAX = 256

# The kernel's fixed structure: which role runs which device function (templates/include/mlagen/sm90).
ROLE_ENTRY = {"producer": ("producer", PRODUCER_TASKS), "consumer": ("consumer", CONSUMER_TASKS)}


def element_bytes(spec) -> int:
    """Bytes per element of Q, K and V: 2 for bf16, 1 for the fp8 types (problem.dtype)."""
    return 2 if dict(spec.problem).get("dtype", "bf16") == "bf16" else 1


def _section(spec) -> dict:
    sched = spec.schedule
    if not isinstance(sched, dict):
        raise SpecError(spec.path, "schedule", "a TMA kernel needs a schedule mapping")
    return sched


def _expr(spec, value, key: str, known: set) -> expr.Expr:
    try:
        e = expr.parse(value)
    except expr.ExprError as exc:
        raise SpecError(spec.path, key, str(exc)) from None
    unknown = e.names - known
    if unknown:
        raise SpecError(spec.path, key, f"unknown name(s) {sorted(unknown)}")
    return e


def _known_names(spec) -> set:
    return ({k for k, _ in spec.problem} | {k for k, _ in spec.derived} | {k for k, _ in spec.specialize}
            | {t.name for t in spec.tunables})


def validate_spec(spec) -> None:
    """Structure of the schedule section; raises SpecError naming the key."""
    sched = _section(spec)
    for key in sched:
        if key not in TOP_KEYS:
            raise SpecError(spec.path, f"schedule.{key}", f"unknown key; allowed: {', '.join(TOP_KEYS)}")
    for key in TOP_KEYS:
        if key not in sched:
            raise SpecError(spec.path, f"schedule.{key}", "required key is missing")
    known = _known_names(spec)
    roles = sched["roles"]
    if not isinstance(roles, dict) or list(roles) != list(ROLE_ENTRY):
        raise SpecError(spec.path, "schedule.roles",
                        f"this kernel has the roles {list(ROLE_ENTRY)} in that order, got {list(roles) if isinstance(roles, dict) else roles!r}")
    for name, body in roles.items():
        where = f"schedule.roles.{name}"
        keys = PRODUCER_KEYS if name == "producer" else ROLE_KEYS
        if not isinstance(body, dict) or set(body) != set(keys):
            raise SpecError(spec.path, where, f"expected keys {list(keys)}")
        if name == "producer":
            _expr(spec, body["load_warps"], f"{where}.load_warps", known)
        _expr(spec, body["warpgroups"], f"{where}.warpgroups", known)
        _expr(spec, body["registers"], f"{where}.registers", known)
        expected = ROLE_ENTRY[name][1]
        if not isinstance(body["tasks"], list) or sorted(body["tasks"]) != sorted(expected):
            raise SpecError(spec.path, f"{where}.tasks", f"the {name} role of this kernel does {list(expected)}")
    pipes = sched["pipelines"]
    if not isinstance(pipes, dict) or not pipes:
        raise SpecError(spec.path, "schedule.pipelines", "expected a mapping of pipelines")
    for name, body in pipes.items():
        where = f"schedule.pipelines.{name}"
        if not isinstance(body, dict) or set(body) != set(PIPELINE_KEYS):
            raise SpecError(spec.path, where, f"expected keys {list(PIPELINE_KEYS)}")
        for end in ("producer", "consumer"):
            if body[end] not in roles:
                raise SpecError(spec.path, f"{where}.{end}", f"{body[end]!r} is not a role ({', '.join(roles)})")
        _expr(spec, body["stages"], f"{where}.stages", known)
    if set(pipes) != {"q", "kv"}:
        raise SpecError(spec.path, "schedule.pipelines", "this kernel has the pipelines q and kv")
    for key in ("consumer_order", "intra_warpgroup_overlap", "scheduler", "cluster", "epilogue"):
        _expr(spec, sched[key], f"schedule.{key}", known)
    sw = sched["swizzle"]
    if not isinstance(sw, dict) or set(sw) != set(OPERANDS):
        raise SpecError(spec.path, "schedule.swizzle", f"expected one swizzle per TMA operand: {list(OPERANDS)}")
    for op in OPERANDS:
        _expr(spec, sw[op], f"schedule.swizzle.{op}", known)


@dataclass(frozen=True)
class Role:
    name: str
    entry: str
    first_wg: int
    warpgroups: int
    registers: int
    tasks: tuple[str, ...]

    @property
    def end_wg(self) -> int:
        return self.first_wg + self.warpgroups


@dataclass(frozen=True)
class Schedule:
    roles: tuple[Role, ...]
    load_warps: int  # warps of the producer that issue loads: 1 (Q, K, V) or 2 (Q and K | V)
    stages: dict
    consumer_order: str
    overlap: bool
    scheduler: str
    cluster: int
    epilogue: str
    swizzle: dict

    @property
    def warpgroups(self) -> int:
        return sum(r.warpgroups for r in self.roles)

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    def grid(self, tiles: int, sm_count: int) -> int:
        """CTAs to launch for ``tiles`` cluster tiles: the host half of the tile scheduler (the
        device half, ``get_next_work``, is in the sm90 headers). ``static``: one cluster per
        tile; ``persistent`` and ``dynamic``: at most one cluster per ``cluster`` SMs, looping
        over tiles. Always a multiple of the cluster size (the kernel's ``__cluster_dims__``)."""
        clusters = tiles if self.scheduler == "static" else min(tiles, sm_count // self.cluster)
        return clusters * self.cluster

    @property
    def entry_register_cap(self) -> int:
        """Registers per thread the kernel starts with (launch bounds: threads, 1 block per SM)."""
        return min(255, REGS_PER_SM // self.threads // 8 * 8)


@functools.lru_cache(maxsize=4096)
def evaluate(variant) -> Schedule:
    """The variant's schedule with every expression evaluated (cached: launches read it)."""
    spec = variant.spec
    sched = _section(spec)
    env = variant.env()
    known = _known_names(spec)
    roles, first = [], 0
    for name, body in sched["roles"].items():
        wgs = int(_expr(spec, body["warpgroups"], "", known)(env))
        regs = int(_expr(spec, body["registers"], "", known)(env))
        roles.append(Role(name, ROLE_ENTRY[name][0], first, wgs, regs, tuple(body["tasks"])))
        first += wgs
    stages = {name: int(_expr(spec, body["stages"], "", known)(env)) for name, body in sched["pipelines"].items()}
    load_warps = int(_expr(spec, sched["roles"]["producer"]["load_warps"], "", known)(env))
    value = {k: _expr(spec, sched[k], "", known)(env) for k in ("consumer_order", "intra_warpgroup_overlap",
                                                                "scheduler", "cluster", "epilogue")}
    swizzle = {op: int(_expr(spec, sched["swizzle"][op], "", known)(env)) for op in OPERANDS}
    return Schedule(tuple(roles), load_warps, stages, str(value["consumer_order"]), bool(value["intra_warpgroup_overlap"]),
                    str(value["scheduler"]), int(value["cluster"]), str(value["epilogue"]), swizzle)


def check_variant(variant, target, resources) -> list[str]:
    """Budget checks of one variant; each broken rule is one sentence."""
    reasons: list[str] = []
    if not target.has("wgmma") or not target.has("setmaxnreg"):
        return [f"{target.name} has no wgmma/setmaxnreg; this schedule needs sm_90a"]
    try:
        s = evaluate(variant)
    except expr.ExprError as exc:
        return [f"schedule failed to evaluate: {exc}"]
    env = variant.env()
    by_name = {r.name: r for r in s.roles}
    producer, consumer = by_name["producer"], by_name["consumer"]

    if producer.warpgroups != 1:
        reasons.append(f"the producer role is one warpgroup, got {producer.warpgroups}")
    if s.load_warps not in (1, 2):
        reasons.append(f"load_warps {s.load_warps}: the producer loads with one warp or two (Q and K | V)")
    if consumer.warpgroups < 1:
        reasons.append("at least one consumer warpgroup is needed")
    if s.threads != resources.threads:
        reasons.append(f"the roles add up to {s.threads} threads but the resource model says {resources.threads}")
    for r in s.roles:
        if not (24 <= r.registers <= 256 and r.registers % 8 == 0):
            reasons.append(f"{r.name} registers {r.registers}: setmaxnreg takes a multiple of 8 in [24, 256]")
    # setmaxnreg moves registers within the CTA's allocation at launch (threads x the entry cap),
    # not the whole register file: a schedule asking for more waits in setmaxnreg.inc forever.
    total = sum(128 * r.warpgroups * r.registers for r in s.roles)
    pool = s.threads * s.entry_register_cap
    if total > pool:
        terms = " + ".join(f"{r.name} {r.warpgroups}x128x{r.registers}" for r in s.roles)
        reasons.append(f"register budget: {terms} = {total} exceeds the {pool} registers the CTA holds at launch "
                       f"({s.threads} threads x {s.entry_register_cap}) by {total - pool}; setmaxnreg would wait "
                       "forever")
    if s.consumer_order not in ORDERS:
        reasons.append(f"consumer_order {s.consumer_order!r} is not one of {list(ORDERS)}")
    elif s.consumer_order == "pingpong" and consumer.warpgroups != 2:
        reasons.append(f"pingpong alternates two consumer warpgroups, this schedule has {consumer.warpgroups}")
    if s.scheduler not in SCHEDULERS:
        reasons.append(f"scheduler {s.scheduler!r} is not one of {list(SCHEDULERS)}")
    if s.epilogue not in EPILOGUES:
        reasons.append(f"epilogue {s.epilogue!r} is not one of {list(EPILOGUES)}")
    elif s.epilogue == "vtma" and env["block_n"] < env["block_m"]:
        reasons.append(f"epilogue vtma stages the {env['block_m']}-row output in one V stage of block_n "
                       f"{env['block_n']} rows: needs block_n >= block_m")
    elif s.epilogue == "vtma" and not s.overlap:
        reasons.append("epilogue vtma keeps the last P V's V stage until the output is stored; without overlap "
                       "that stage is released inside the last step (use tma or direct)")
    if s.cluster not in CLUSTERS:
        reasons.append(f"cluster {s.cluster}: must be one of {list(CLUSTERS)} CTAs")
    elif s.cluster > 1 and s.scheduler == "dynamic":
        reasons.append(f"cluster {s.cluster} needs a static or persistent scheduler: the CTAs of a cluster must "
                       "agree on their tiles, and the dynamic queue hands each CTA its own")
    if s.stages.get("q") != 1:
        reasons.append(f"the q pipeline has one stage in this kernel, got {s.stages.get('q')}")
    if not 2 <= s.stages.get("kv", 0) <= 4:
        reasons.append(f"the kv pipeline needs 2 to 4 stages, got {s.stages.get('kv')}")

    block_m, block_n = env["block_m"], env["block_n"]
    if block_m != 64 * consumer.warpgroups:
        reasons.append(f"block_m {block_m} must be 64 rows per consumer warpgroup ({64 * consumer.warpgroups})")
    for name, rows in (("block_m", block_m), ("block_n", block_n)):
        if rows > TMA_BOX_MAX:
            reasons.append(f"{name} {rows} exceeds the TMA box limit of {TMA_BOX_MAX} rows by {rows - TMA_BOX_MAX}")
    elem = element_bytes(variant.spec)
    mma_k = 32 // elem
    if block_n % mma_k:
        reasons.append(f"block_n {block_n} must be a multiple of {mma_k} (the k-step of P V)")
    if elem == 1 and s.epilogue == "tma":
        reasons.append("epilogue tma stages the bf16 output in the Q tile, which is too small with fp8 inputs "
                       f"({env['d_v'] * 2} B rows vs {env['d_qk']} B); use epilogue direct")
    if s.cluster in CLUSTERS and s.cluster > 1 and block_n % (8 * s.cluster):
        reasons.append(f"cluster {s.cluster}: each CTA loads block_n / {s.cluster} = {block_n / s.cluster:g} rows of "
                       "every K/V tile, which must be a whole number of 8-row swizzle atoms")
    # Row bytes of each operand's tiles (V^T with fp8: d_v rows of block_n keys); Q's swizzle
    # also lays out the bf16 output staged in the Q tile.
    rows = {"q": block_m, "k": block_n, "v": block_n if elem == 2 else env["d_v"]}
    widths = {"q": [env["d_qk"] * elem, env["d_v"] * 2], "k": [env["d_nope"] * elem, env["d_rope"] * elem],
              "v": [env["d_v"] * 2] if elem == 2 else [block_n]}
    for op, sw in s.swizzle.items():
        if sw in SWIZZLES and (rows[op] * sw) % (8 * sw):
            reasons.append(f"swizzle.{op}: a box of {rows[op]} rows of {sw} B does not end on the {8 * sw}-byte "
                           "swizzle atom the next box must start on")
    for op, sw in s.swizzle.items():
        if sw not in SWIZZLES:
            reasons.append(f"swizzle.{op} {sw}: must be one of {list(SWIZZLES)} bytes")
            continue
        for row_bytes in widths[op]:
            if row_bytes % sw:
                reasons.append(f"swizzle.{op} {sw} B does not divide the {row_bytes} B rows of that operand")
    return reasons


def render_schedule(variant) -> Schedule:
    return evaluate(variant)
