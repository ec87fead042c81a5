"""Dense problem shapes: the BENCHMARKS.md ids, shape descriptions, and weighted workloads.

``tune`` and ``bench`` name what they run with these. A shape is a packed batch of sequences
with one head count and one mask. It is written either as an id of ``../shared/BENCHMARKS.md``
(``D1`` ... ``D7``) or as a description: comma-separated ``key=value`` items and a bare mask word::

    b=4,q=4096,k=4096,h=16,causal     # 4 sequences of 4096 queries and keys, 16 heads, causal
    q=[300,1200,77],h=128             # ragged: one sequence per length (b = 3), k = q, causal
    q=2048,k=16384,h=128              # 2048 new tokens after a 14336-token cached prefix
    b=2,q=8192,h=16,none              # no mask

``b`` is the batch (default 1, or the length of a ``q`` list), ``q`` the query length or a list of
them, ``k`` the key length or list (default: ``q``; ``k > q`` is a cached prefix), ``h`` the head
count (required), and the mask word ``causal`` (default) or ``none``.

A workload file (YAML) is a weighted list of shapes, e.g. what ``MLAGEN_RECORD_SHAPES`` wrote::

    family: mla_prefill
    shapes:
      - {shape: "b=4,q=4096,k=4096,h=16,causal", weight: 120}
      - {shape: D4, weight: 3}

Importing this module imports neither torch nor a GPU library.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .errors import ShapeError
from .families import mla_prefill as family

MASK_WORDS = ("causal", "none")
GRAMMAR = "b=<batch>, q=<len> or q=[l1,l2,...], k=<len> or list (default q), h=<heads>, and causal or none"
WORKLOAD_FAMILY = "mla_prefill"


@dataclass(frozen=True)
class Shape:
    """One dense problem: a packed batch of sequences with one head count and one mask.

    ``q_lens[b]`` / ``k_lens[b]`` are the query / key lengths of sequence b; with ``causal`` the
    mask is bottom-right aligned (MLA.md section 1), so ``k_lens[b] - q_lens[b]`` keys are a
    cached prefix every query sees. ``id`` names it in reports: a BENCHMARKS.md id or the
    canonical description (:meth:`describe_text`).
    """

    id: str
    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    heads: int
    causal: bool

    def __post_init__(self):
        if not self.q_lens or len(self.q_lens) != len(self.k_lens):
            raise ShapeError(f"shape {self.id}: q_lens and k_lens must list the same sequences, "
                             f"got {len(self.q_lens)} and {len(self.k_lens)}")

    @property
    def batch(self) -> int:
        return len(self.q_lens)

    @property
    def total_q(self) -> int:
        return sum(self.q_lens)

    @property
    def total_k(self) -> int:
        return sum(self.k_lens)

    @property
    def packed(self) -> bool:
        """Whether the kernel gets cu_seqlens (a batch of one is passed as a plain sequence)."""
        return self.batch > 1

    @property
    def uniform(self) -> bool:
        """Every sequence has the same lengths, so SDPA can take the batch in one [B, H, L, D] call."""
        return len(set(self.q_lens)) == 1 and len(set(self.k_lens)) == 1

    def cu_seqlens(self) -> tuple[list[int], list[int]]:
        """Offsets of the packed batch: ([0, q_0, q_0 + q_1, ...], [0, k_0, ...])."""
        cu_q, cu_k = [0], [0]
        for lq, lk in zip(self.q_lens, self.k_lens):
            cu_q.append(cu_q[-1] + lq)
            cu_k.append(cu_k[-1] + lk)
        return cu_q, cu_k

    def sequence_lengths(self) -> list[tuple[int, int, int, int]]:
        """(q_start, len_q, k_start, len_k) per sequence."""
        cu_q, cu_k = self.cu_seqlens()
        return family.sequence_lengths(cu_q, cu_k, self.total_q, self.total_k)

    def flops(self) -> int:
        """FLOPs of one call by the BENCHMARKS.md convention (visible pairs only)."""
        return family.flops(self.sequence_lengths(), self.heads, self.causal)

    @property
    def description(self) -> str:
        """Human-readable: ``4 × 4096, H 16, causal``."""
        if self.uniform and self.q_lens[0] == self.k_lens[0]:
            lengths = f"{self.batch} × {self.q_lens[0]}"
        elif self.uniform:
            lq, lk = self.q_lens[0], self.k_lens[0]
            lengths = f"{self.batch} × {lq} new after {lk - lq} cached (Lk {lk})"
        else:
            lengths = (f"{self.batch} ragged, {min(self.q_lens)}–{max(self.q_lens)} "
                       f"(mean {self.total_q // self.batch})")
        return f"{lengths}, H {self.heads}, {'causal' if self.causal else 'no mask'}"

    def describe_text(self) -> str:
        """The canonical description, which :func:`parse_shape` reads back into this shape."""
        return family.describe_shape(self)


def ragged_lengths(count: int, low: int, high: int, seed: int) -> tuple[int, ...]:
    """``count`` lengths drawn uniformly from [low, high] (inclusive) by ``random.Random(seed)``.

    Python's ``Random.randint`` with an integer seed gives the same sequence on every platform
    and Python version since 3.2, so the D4 lengths are stable.
    """
    rng = random.Random(seed)
    return tuple(rng.randint(low, high) for _ in range(count))


_D4_LENGTHS = ragged_lengths(16, 128, 4096, seed=0)

#: The dense shapes of BENCHMARKS.md. D4 draws its 16 lengths (Lq = Lk per sequence) with
#: ``random.Random(0).randint(128, 4096)``, one call per sequence in order; D5 is a chunk of
#: 2048 new tokens after a 14336-token cached prefix; D7 is a TP8 slice (16 heads).
SHAPES: dict[str, Shape] = {s.id: s for s in (
    Shape("D1", (8192,), (8192,), 128, True),
    Shape("D2", (4096,) * 4, (4096,) * 4, 16, True),
    Shape("D3", (8192,) * 2, (8192,) * 2, 16, False),
    Shape("D4", _D4_LENGTHS, _D4_LENGTHS, 128, True),
    Shape("D5", (2048,), (14336 + 2048,), 128, True),
    Shape("D6", (512,) * 32, (512,) * 32, 128, True),
    Shape("D7", (2048,) * 8, (2048,) * 8, 16, True),
)}


# --- parsing ----------------------------------------------------------------------------------


def parse_shape(text: str) -> Shape:
    """One shape from an id of BENCHMARKS.md (``D1`` ... ``D7``, any case) or a description
    (the module docstring has the grammar; the family parses it, so ``MLAGEN_RECORD_SHAPES``
    files and ``--shape`` read the same text).

    Raises:
        ShapeError (a ValueError): naming the bad item and what is allowed.
    """
    if not isinstance(text, str):
        raise ShapeError(f"shape: expected a string, got {type(text).__name__}")
    raw = text.strip()
    if not raw:
        raise ShapeError(f"empty shape; give an id ({', '.join(SHAPES)}) or a description ({GRAMMAR})")
    if raw.upper() in SHAPES:
        return SHAPES[raw.upper()]
    if "=" not in raw and raw.lower() not in MASK_WORDS:
        raise ShapeError(f"unknown shape id {raw!r}; choose from {', '.join(SHAPES)}, or describe one: {GRAMMAR}")
    try:
        parsed = family.parse_shape(raw)
    except ValueError as exc:
        raise ShapeError(f"{exc}; allowed: {GRAMMAR}") from None
    if not sum(parsed.q_lens) or not sum(parsed.k_lens):
        raise ShapeError(f"shape {raw!r}: no {'query' if not sum(parsed.q_lens) else 'key'} rows; "
                         "lengths must add up to at least 1")
    shape = Shape("", tuple(parsed.q_lens), tuple(parsed.k_lens), parsed.heads, parsed.causal)
    return Shape(family.describe_shape(shape), shape.q_lens, shape.k_lens, shape.heads, shape.causal)


def parse_shapes(text: str | Iterable[str]) -> list[Shape]:
    """Shapes from a comma-separated list of ids (``"D1,D3"``; ``"all"`` for every id), or from an
    iterable whose items are ids or descriptions; in order, each once.

    Raises:
        ShapeError (a ValueError): naming each unknown id and listing the known ones.
    """
    if isinstance(text, str):
        ids = [i.strip() for i in text.split(",") if i.strip()]
        if any("=" in i for i in ids) or any(i.lower() in MASK_WORDS for i in ids):
            return [parse_shape(text)]  # one description, not a list of ids
    else:
        ids = [i.strip() for i in text if i.strip()]
    if not ids:
        raise ShapeError(f"no shape given; choose from {', '.join(SHAPES)} or 'all'")
    if any(i.lower() == "all" for i in ids):
        return list(SHAPES.values())
    unknown = [i for i in ids if i.upper() not in SHAPES and "=" not in i]
    if unknown:
        raise ShapeError(f"unknown shape id {', '.join(map(repr, unknown))}; choose from {', '.join(SHAPES)} "
                         f"or 'all', or describe one: {GRAMMAR}")
    out = [parse_shape(i) for i in ids]
    return list({s.id: s for s in out}.values())


# --- workloads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadItem:
    shape: Shape
    weight: float


def parse_workload(doc, source: str = "<workload>") -> list[WorkloadItem]:
    """A workload document (parsed YAML) into weighted shapes, in file order.

    Raises:
        ShapeError (a ValueError): naming the file, the entry and what is allowed.
    """
    if not isinstance(doc, dict):
        raise ShapeError(f"{source}: expected a mapping with 'family' and 'shapes'")
    unknown = set(doc) - {"family", "shapes"}
    if unknown:
        raise ShapeError(f"{source}: unknown key {sorted(unknown)[0]!r}; allowed: family, shapes")
    fam = doc.get("family", WORKLOAD_FAMILY)
    if fam != WORKLOAD_FAMILY:
        raise ShapeError(f"{source}: family: {fam!r}; this tuner reads {WORKLOAD_FAMILY!r} workloads")
    entries = doc.get("shapes")
    if not isinstance(entries, list) or not entries:
        raise ShapeError(f"{source}: shapes: expected a non-empty list of {{shape: ..., weight: ...}}")
    items = []
    for i, entry in enumerate(entries):
        where = f"{source}: shapes[{i}]"
        if isinstance(entry, str):
            entry = {"shape": entry}
        if not isinstance(entry, dict) or "shape" not in entry:
            raise ShapeError(f"{where}: expected {{shape: <id or description>, weight: <number>}}")
        extra = set(entry) - {"shape", "weight"}
        if extra:
            raise ShapeError(f"{where}: unknown key {sorted(extra)[0]!r}; allowed: shape, weight")
        weight = entry.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise ShapeError(f"{where}.weight: expected a positive number, got {weight!r}")
        try:
            shape = parse_shape(str(entry["shape"]))
        except ShapeError as exc:
            raise ShapeError(f"{where}.shape: {exc}") from None
        items.append(WorkloadItem(shape, float(weight)))
    return items


def load_workload(path: str | Path) -> list[WorkloadItem]:
    """Read a workload YAML file (format in the module docstring)."""
    import yaml

    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text())
    except FileNotFoundError:
        raise ShapeError(f"{p}: no such workload file") from None
    except yaml.YAMLError as exc:
        raise ShapeError(f"{p}: not YAML ({str(exc).splitlines()[0]})") from None
    return parse_workload(doc, str(p))
