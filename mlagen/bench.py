"""Side-by-side measurement of mlagen against its peers, as ``../shared/BENCHMARKS.md`` prescribes.

One process, one GPU, any family. A shape (an id such as ``D1`` or ``S1``, or a description) is
read by the family it belongs to (:mod:`mlagen.shapes`); that family's peers
(:meth:`mlagen.families.base.Family.peers`: other libraries' kernels, a plain PyTorch version,
and ours through the public call) run the same problem on the same fresh ``randn`` inputs
(:meth:`~mlagen.families.base.Family.make_inputs`). Nothing here names a family.

For each shape, each peer is prepared (its own layout, padding and masks, before any timing),
checked against the family's high-precision reference on two heads (ours with NaN-poisoned
outputs; :mod:`mlagen.verify`), warmed up, then timed in interleaved rounds (peer, ours, peer,
ours ...) with CUDA events around each call and the L2 cache flushed before it, outside the
events (:mod:`mlagen.measure`). A peer's figure is the median of its round medians. A peer that
is not built, raises or computes something else is reported "n/a (why)" or "WRONG"; the run
goes on. TFLOP/s are the family's FLOPs of the problem over the time, for every peer.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import platform
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from . import families, shapes
from .errors import BenchError, PeerUnsupported
from .families.base import Family, Peer, Prepared
from .measure import MIB, L2Flush, Timing, host_time, median, percentile, time_calls  # noqa: F401  (re-exported)
from .verify import CHECK_HEADS

CELL_LIMIT = 80    # characters of an n/a or WRONG reason shown in a table cell


def _split_ids(text: str | Iterable[str]) -> list[str]:
    items = text.split(",") if isinstance(text, str) else list(text)
    return [item.strip() for item in items if item.strip()]


# --- shapes ---------------------------------------------------------------------------------


def resolve_shapes(items) -> list[tuple[Family, Any]]:
    """(family, shape) for each shape asked for, in order, each once.

    ``items``: one text or a list of texts and shapes. A text is an id (``D1``, ``S3``, any case),
    a comma-separated list of ids, one description (``b=4,q=4096,h=16,causal``,
    ``sq=4096,h=128,topk=2048,skv=8192``), a family's name (its named shapes), or ``all`` (every
    family's named shapes). Each is read by the one family that reads it. A shape object is
    taken as it is, its family found by the one whose ``describe_shape`` reads it back.

    Raises:
        ShapeError (a BenchError and ValueError): naming the text no family reads (or that
        several read) and what is allowed.
    """
    out: list[tuple[Family, Any]] = []
    for item in [items] if isinstance(items, str) or not isinstance(items, Iterable) else list(items):
        if not isinstance(item, str):
            out.append((_family_of(item), item))
            continue
        texts = [item] if "=" in item else _split_ids(item)
        if not texts:
            raise shapes.ShapeError("no shape given; give an id (such as D1 or S1) or a description")
        for text in texts:
            name = text.lower()
            if name == "all":
                out += [(fam, s) for fam in _families() for s in fam.shapes().values()]
            elif name in families.names():
                fam = families.get(name)
                out += [(fam, s) for s in fam.shapes().values()]
            else:
                fam = _reader_of(text)
                out.append((fam, fam.parse_shape(text)))
    seen, unique = set(), []
    for fam, shape in out:
        if (fam.name, shape.id) not in seen:
            seen.add((fam.name, shape.id))
            unique.append((fam, shape))
    return unique


def _families() -> list[Family]:
    return [families.get(name) for name in families.names()]


def _reader_of(text: str) -> Family:
    """The one family that reads ``text`` (the error of :func:`mlagen.shapes.parse_shape` otherwise)."""
    shapes.parse_shape(text)   # raises, naming every family's reason or the families that all read it
    return next(fam for fam in _families() if _reads(fam, text))


def _reads(fam: Family, text: str) -> bool:
    try:
        fam.parse_shape(text)
        return True
    except ValueError:
        return False


def _family_of(shape) -> Family:
    for fam in _families():
        try:
            if fam.parse_shape(fam.describe_shape(shape), id=shape.id) == shape:
                return fam
        except (ValueError, AttributeError, TypeError):
            continue
    raise shapes.ShapeError(f"shape: {shape!r} is no family's shape")


# --- peers ----------------------------------------------------------------------------------


def split_peer(name: str) -> tuple[str, str | None]:
    """``mlagen:<spec>`` -> ("mlagen", "<spec>"); ``cudnn`` -> ("cudnn", None)."""
    base, _, arg = name.partition(":")
    return base, (arg or None) if ":" in name else None


def lookup_peer(family: Family, name: str) -> tuple[Peer, str | None] | None:
    """The family's peer for a name (and the text after ``name:``), None if it has none of that name."""
    base, arg = split_peer(name)
    peer = family.peers().get(base)
    if peer is None or (arg is not None and peer.arg is None):
        return None
    return peer, arg


def _known(fams: Iterable[Family]) -> str:
    parts = []
    for fam in fams:
        names = list(fam.peers())
        names += [f"{n}:<{p.arg}>" for n, p in fam.peers().items() if p.arg]
        parts.append(f"{', '.join(names)} ({fam.name})")
    return "; ".join(parts)


def parse_peers(text: str | Iterable[str], fams: Iterable[Family] | None = None) -> list[str]:
    """Peer names from a comma-separated list ("mlagen,cudnn"), in order, each once; each must be
    a peer of one of ``fams`` (default: every family).

    Raises:
        BenchError: naming each unknown peer and listing each family's peers.
    """
    fams = list(fams) if fams is not None else _families()
    names = list(dict.fromkeys(n.lower() for n in _split_ids(text)))
    if not names:
        raise BenchError(f"no peer given; choose from {_known(fams)}")
    unknown = [n for n in names if not any(lookup_peer(f, n) for f in fams)]
    if unknown:
        raise BenchError(f"unknown peer {', '.join(map(repr, unknown))}; choose from {_known(fams)}")
    return names


def default_peers(family: Family, log: Callable[[str], None] | None = None) -> list[str]:
    """The family's default peers that can run here, in its order; each one that cannot gets one
    line (``fa3 skipped: <why>``) in ``log``."""
    names = []
    for name, peer in family.peers().items():
        if not peer.default:
            continue
        why = peer.status()
        if why is None:
            names.append(name)
        elif log is not None:
            log(f"{name} skipped: {why}")
    return names


def format_peer_list() -> str:
    """Each family's peers, one line each: name, what it is, whether it runs by default, and
    whether it can run here (else why not)."""
    lines = []
    for fam in _families():
        if not fam.peers():
            continue
        lines.append(f"{fam.name} (shapes {', '.join(fam.shapes()) or 'by description'}):")
        for name, peer in fam.peers().items():
            why = peer.status()
            tags = [t for t, on in (("ours", peer.ours), ("default", peer.default), ("first column", peer.lead)) if on]
            label = name + (f"[:<{peer.arg}>]" if peer.arg else "")
            lines.append(f"  {label:20s} {peer.summary}" + (f" [{', '.join(tags)}]" if tags else "")
                         + ("" if why is None else f"; unavailable: {why}"))
    return "\n".join(lines)


def interleaving(peers: list[str], rounds: int, ours: Iterable[str]) -> list[tuple[int, str]]:
    """(round, peer) in the order blocks are timed: each round runs every other peer, each
    followed by ours (peer, ours, peer, ours ...); without ours, or with ours alone, each once.
    Several of ours (``mlagen``, ``mlagen:<spec>``, ``mlagen-check``) all follow each other peer,
    in an order reversed every other round: otherwise every peer's block would follow the same one
    of ours, and a block that leaves the GPU idle part of the time (``mlagen-check`` synchronises
    the host on every call) would always hand the peers a cooler GPU than ours get."""
    ours = set(ours)
    mine = [p for p in peers if p in ours]
    others = [p for p in peers if p not in ours]
    order = []
    for r in range(rounds):
        if mine and others:
            mine_r = mine if r % 2 == 0 else mine[::-1]
            order += [(r, name) for p in others for name in (p, *mine_r)]
        else:
            order += [(r, name) for name in peers]
    return order


# --- running --------------------------------------------------------------------------------


@dataclass
class PeerResult:
    """What one peer did on one shape: a timing, or ``error`` (why it is n/a, or WRONG);
    ``unsupported``: the peer has no way to run the shape (no kernel for its geometry or mask)."""

    name: str
    timing: Timing | None = None
    check: Any = None           # the family's comparison (ok, max_abs, rel_l2, lse_max_abs, problem)
    error: str | None = None
    note: str = ""
    ours: bool = False
    lead: bool = False
    host: float | None = None   # CPU seconds per call (measure.host_time)
    unsupported: bool = False

    @property
    def wrong(self) -> bool:
        return self.check is not None and not self.check.ok


@dataclass
class Result:
    """One shape's measurements, peers in the order asked."""

    family: Family
    shape: Any
    peers: dict[str, PeerResult]
    iters: int
    rounds: int
    telemetry: str | None = None   # clocks and power seen right after the timed rounds

    @property
    def flops(self) -> int:
        return self.family.flops(self.shape)

    @property
    def description(self) -> str:
        return self.family.summary(self.shape)

    def tflops(self, name: str, seconds: float | None = None) -> float | None:
        """TFLOP/s of ``name`` at ``seconds`` per call (default: its median); None if not timed."""
        peer = self.peers.get(name)
        if peer is None or peer.timing is None:
            return None
        return self.flops / (seconds if seconds is not None else peer.timing.median) / 1e12

    def ratio(self, name: str, other: str) -> float | None:
        """Speed of ``name`` over ``other`` (ratio of median times inverted); None if either is missing."""
        a, b = self.tflops(name), self.tflops(other)
        return None if a is None or b is None else a / b

    def ours(self) -> list[str]:
        return [n for n, p in self.peers.items() if p.ours]

    def others(self) -> list[str]:
        return [n for n, p in self.peers.items() if not p.ours]


def _log_stderr(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _reason(exc: BaseException, caught: Iterable[warnings.WarningMessage] = ()) -> str:
    """One line: the exception's type and first line, then the warnings raised before it (SDPA
    says why each backend refused in warnings, and raises only "No available kernel")."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    said = dict.fromkeys(" ".join(str(w.message).split()) for w in caught)
    return "; ".join([text, *said])


def run(shape_ids, peers=None, iters: int = 50, rounds: int = 3, warmup: int = 5, seed: int = 0, *,
        device=None, progress: Callable[[str], None] | None = None) -> list[Result]:
    """Measure ``peers`` on each shape as BENCHMARKS.md prescribes; one :class:`Result` per shape.

    Args:
        shape_ids: what :func:`resolve_shapes` reads: ids ("D1,S1", a list of ids, "all", a
            family's name), descriptions, or a family's shape objects.
        peers: peer names (``mlagen:<spec>`` included) in the order they run in each round; a
            shape runs those its family has. :class:`~mlagen.families.base.Peer` objects may be
            given too (run for every shape). Default: each family's :func:`default_peers`.
        iters: timed calls per block (BENCHMARKS.md asks for at least 50).
        rounds: interleaved rounds; each peer gets one block per round, ours one after each peer.
        warmup: untimed calls per peer after its correctness check.
        seed: seed of the random inputs.
        device: CUDA device (default: the current one).
        progress: called with one line per step (default: print to stderr).

    Raises:
        BenchError: unknown shape or peer, bad counts, or no GPU. A peer's own failure is not
        raised: it becomes that peer's ``error`` in the result.
    """
    import torch

    items = resolve_shapes(shape_ids)
    log = progress or _log_stderr
    fams = list({fam.name: fam for fam, _ in items}.values())
    given = None if peers is None else [peers] if isinstance(peers, (str, Peer)) else list(peers)
    names = None
    if given is not None:
        texts = [p for p in given if isinstance(p, str)]
        names = parse_peers(",".join(texts), fams) if texts else []
        objects = [p for p in given if isinstance(p, Peer)]
    if iters < 1 or rounds < 1 or warmup < 0:
        raise BenchError(f"need iters >= 1, rounds >= 1 and warmup >= 0; got {iters}, {rounds}, {warmup}")
    if not torch.cuda.is_available():
        raise BenchError("bench needs a CUDA GPU, and torch sees none")
    device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
    flush = L2Flush(device)
    per_family = {}
    for fam in fams:
        if names is None:
            per_family[fam.name] = default_peers(fam, log)
        else:
            per_family[fam.name] = [n for n in names if lookup_peer(fam, n)] + objects
    return [_bench_shape(fam, shape, per_family[fam.name], iters, rounds, warmup, seed, device, flush, log)
            for fam, shape in items]


def _bench_shape(family, shape, names, iters, rounds, warmup, seed, device, flush, log) -> Result:
    import torch

    log(f"{shape.id}: {family.summary(shape)}; {family.flops(shape) / 1e12:.2f} TFLOP per call")
    inputs = family.make_inputs(shape, device, seed)
    ref = family.reference(shape, inputs, CHECK_HEADS)
    outcomes, ready = {}, {}
    for item in names:
        outcome, prepared = _prepare(family, item, shape, inputs, ref, warmup, log)
        outcomes[outcome.name] = outcome
        if prepared is not None:
            ready[outcome.name] = prepared
    _time_rounds(family, shape, ready, outcomes, iters, rounds, flush, log)
    result = Result(family, shape, outcomes, iters, rounds, _telemetry_text(gpu_telemetry(device)))
    del inputs, ref, ready
    torch.cuda.empty_cache()
    return result


def _prepare(family, item, shape, inputs, ref, warmup, log) -> tuple[PeerResult, Prepared | None]:
    """Build, check and warm up one peer; a failure at any step makes it n/a for this shape."""
    import torch

    if isinstance(item, Peer):
        name, peer, arg = item.name, item, None
    else:
        name = item
        peer, arg = lookup_peer(family, name)
    outcome = PeerResult(name, ours=peer.ours, lead=peer.lead)
    why = peer.status()
    if why is not None:
        outcome.error = why
        log(f"{shape.id} {name}: n/a ({why})")
        return outcome, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            prepared = peer.prepare(shape, inputs, arg)
            outcome.note = prepared.note
            got = prepared.checked_call()   # also the first call: compiles, builds cuDNN graphs
            outcome.check = family.compare(got, ref)
            del got
            for _ in range(warmup if outcome.check.ok else 0):
                prepared.fn()
            torch.cuda.synchronize()
            if outcome.check.ok:
                outcome.host = host_time(prepared.fn)
        except PeerUnsupported as exc:
            outcome.error, outcome.unsupported = str(exc), True
            log(f"{shape.id} {name}: not supported ({outcome.error})")
            return outcome, None
        except Exception as exc:  # a peer's failure is a result, not a crash
            outcome.error = _reason(exc, caught)
            log(f"{shape.id} {name}: n/a ({outcome.error})")
            return outcome, None
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if not outcome.check.ok:
        outcome.error = f"WRONG: {outcome.check.problem}"
        log(f"{shape.id} {name}: {outcome.error}")
        return outcome, None
    c = outcome.check
    log(f"{shape.id} {name}: ready (max abs err {c.max_abs:.1e}, rel L2 {c.rel_l2:.1e})")
    return outcome, prepared


def _time_rounds(family, shape, ready, outcomes, iters, rounds, flush, log) -> None:
    blocks: dict[str, list[list[float]]] = {name: [] for name in ready}
    ours = [n for n in ready if outcomes[n].ours]
    flops = family.flops(shape)
    for rnd, name in interleaving(list(ready), rounds, ours):
        if name not in ready:
            continue
        try:
            samples = time_calls(ready[name].fn, iters, flush)
        except Exception as exc:
            outcomes[name].error = _reason(exc)
            log(f"{shape.id} {name}: n/a ({outcomes[name].error})")
            del ready[name]
            continue
        blocks[name].append(samples)
        mid = median(samples)
        log(f"{shape.id} round {rnd + 1}/{rounds} {name}: {mid * 1e3:.3f} ms, {flops / mid / 1e12:.1f} TFLOP/s")
    for name in ready:
        outcomes[name].timing = Timing(blocks[name])


# --- environment ----------------------------------------------------------------------------


_SMI_FIELDS = ("uuid", "driver_version", "clocks.sm", "clocks.max.sm", "power.draw", "power.limit")


def gpu_telemetry(device=None) -> dict[str, str]:
    """nvidia-smi's driver version, SM clock (now and max) and power (draw and limit) for
    ``device``; empty if nvidia-smi is missing or fails."""
    try:
        text = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(_SMI_FIELDS)}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [dict(zip(_SMI_FIELDS, (c.strip() for c in line.split(",")))) for line in text.splitlines() if line.strip()]
    uuid = _torch_uuid(device)
    mine = [r for r in rows if uuid and r.get("uuid", "").removeprefix("GPU-") == uuid]
    if mine or len(rows) == 1:
        return (mine or rows)[0]
    return {}


def _torch_uuid(device) -> str | None:
    try:
        import torch

        index = device if device is not None else torch.cuda.current_device()
        return str(torch.cuda.get_device_properties(index).uuid).removeprefix("GPU-")
    except Exception:
        return None


def _telemetry_text(t: dict[str, str]) -> str | None:
    if not t:
        return None
    return f"SM clock {t.get('clocks.sm')} (max {t.get('clocks.max.sm')}), power {t.get('power.draw')} " \
           f"of {t.get('power.limit')}"


def _nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception as exc:
        return f"unknown ({_reason(exc)})"


def environment(device=None) -> dict[str, str]:
    """What the figures depend on: device, clocks and power seen now, driver, torch, CUDA, cuDNN,
    NVRTC and mlagen versions, and the date (UTC)."""
    import torch

    from . import __version__

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "mlagen": __version__, "torch": torch.__version__, "cuda (torch)": str(torch.version.cuda),
           "cudnn": str(torch.backends.cudnn.version()), "nvrtc": _nvrtc_version(),
           "python": platform.python_version()}
    if not torch.cuda.is_available():
        env["device"] = "none (torch sees no CUDA GPU)"
        return env
    index = torch.device(device).index if device is not None else torch.cuda.current_device()
    p = torch.cuda.get_device_properties(index if index is not None else 0)
    env["device"] = f"{p.name}, {p.multi_processor_count} SMs, sm_{p.major}{p.minor}, L2 {p.L2_cache_size // MIB} MiB"
    telemetry = gpu_telemetry(index)
    env["driver"] = telemetry.get("driver_version") or _driver_version(index)
    if telemetry:
        env["clocks / power (at start)"] = _telemetry_text(telemetry)
    return env


def _driver_version(index) -> str:
    try:
        from .runtime import device_info

        return device_info(index or 0).driver_version
    except Exception as exc:
        return f"unknown ({_reason(exc)})"


# --- reports --------------------------------------------------------------------------------


def _short(text: str, limit: int | None = None) -> str:
    text = " ".join(str(text).split())
    return text if limit is None or len(text) <= limit else text[:limit - 1] + "…"


def _tolerances(results) -> str:
    """The tolerance the error column was judged by: one value, or one per shape where they differ
    (a family whose shapes differ in precision says so per shape)."""
    tols = {r.shape.id: r.family.tolerance_for(r.shape) for r in results}
    if len(set(tols.values())) == 1:
        return f"{next(iter(tols.values())):g}"
    return ", ".join(f"{t:g} ({sid})" for sid, t in tols.items())


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _peer_cell(result: Result, name: str) -> str:
    peer = result.peers.get(name)
    if peer is None:
        return "—"
    if peer.wrong:
        return _short(f"WRONG ({peer.check.problem})", CELL_LIMIT)
    if peer.timing is None:
        return _short(f"{'not supported' if peer.unsupported else 'n/a'} ({peer.error})", CELL_LIMIT)
    t = peer.timing
    fast, slow = t.spread
    return (f"{result.tflops(name):.1f} [{result.tflops(name, t.p80):.1f}–{result.tflops(name, t.p20):.1f}], "
            f"rounds {result.tflops(name, slow):.1f}–{result.tflops(name, fast):.1f}")


def _ratio_cell(result: Result, name: str, other: str) -> str:
    r = result.ratio(name, other)
    return "—" if r is None else f"{r:.2f}×"


def _check_cell(result: Result, name: str) -> str:
    peer = result.peers.get(name)
    c = peer.check if peer is not None else None
    if c is None:
        return "—"
    text = f"max abs {c.max_abs:.1e}, rel L2 {c.rel_l2:.1e}"
    if c.lse_max_abs is not None:
        text += f", lse {c.lse_max_abs:.1e}"
    return text if c.ok else f"WRONG: {c.problem}; {text}"


def _peer_order(results: list[Result]) -> list[str]:
    """Peers in the order run, the family's lead peer (its strongest: FlashAttention-3,
    FlashMLA) first when present."""
    lead = {n for r in results for n, p in r.peers.items() if p.lead}
    names = list(dict.fromkeys(name for r in results for name in r.peers))
    return sorted(names, key=lambda n: n not in lead)


def _by_family(results: list[Result]) -> list[list[Result]]:
    groups: dict[str, list[Result]] = {}
    for r in results:
        groups.setdefault(r.family.name, []).append(r)
    return list(groups.values())


def format_table(results: list[Result], env: dict[str, str]) -> str:
    """A Markdown report: the environment, the protocol, one table row per shape, then notes
    (how peers were adapted, full n/a reasons, clocks seen after each shape). Shapes of several
    families get one table per family (their peers differ), each under the family's name."""
    lines = ["# mlagen bench", ""] + [f"- {k}: {v}" for k, v in env.items()] + [""]
    groups = _by_family(results)
    for group in groups:
        if len(groups) > 1:
            lines += [f"## {group[0].family.name}", ""]
        lines += _family_table(group)
    notes = _notes(results)
    if notes:
        lines += ["", "Notes:"] + notes
    return "\n".join(lines) + "\n"


def _family_table(results: list[Result]) -> list[str]:
    names = _peer_order(results)
    ours = [n for n in names if any(r.peers[n].ours for r in results if n in r.peers)]
    others = [n for n in names if n not in ours]
    pairs = [(a, b) for a in ours for b in others]
    header = (["shape", "description"] + [f"{n} TFLOP/s" for n in names] + [f"{a} / {b}" for a, b in pairs]
              + [f"{a} error" for a in ours])
    rows = []
    for r in results:
        rows.append([r.shape.id, r.description] + [_peer_cell(r, n) for n in names]
                    + [_ratio_cell(r, a, b) for a, b in pairs] + [_check_cell(r, a) for a in ours])
    r0 = results[0]
    lines = [f"{r0.rounds} interleaved rounds (peer, ours, peer, ours ...; several of ours in an order reversed "
             f"every other round) of {r0.iters} timed calls per block, "
             "L2 flushed before each call. A cell is TFLOP/s at the median of the block medians, "
             "[at the p80 – p20 call times, all blocks pooled], then the range over the block medians. "
             f"Ratios are of the medians. Error: ours against the float32 reference on heads 0–{CHECK_HEADS - 1}; "
             f"WRONG above a relative L2 error of {_tolerances(results)} or on any NaN.", ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(_escape(_short(c)) for c in row) + " |" for row in rows]
    return lines + _host_table(results, names)


def _host_table(results: list[Result], names: list[str]) -> list[str]:
    """CPU time per call of each peer: what an eager caller pays whatever the GPU does."""
    if not any(p.host is not None for r in results for p in r.peers.values()):
        return []

    def cell(r: Result, n: str) -> str:
        p = r.peers.get(n)
        return "—" if p is None or p.host is None else f"{p.host * 1e6:.0f}"

    header = ["shape"] + [f"{n} host µs/call" for n in names]
    return ["", "Host (CPU) time per call, µs: the fastest of 5 runs of 20 calls back to back, divided by 20 "
            "(the caller's cost per call whatever the GPU does; the times above do not show it while the "
            "GPU is the slower).", "",
            "| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"] + [
            "| " + " | ".join([r.shape.id] + [cell(r, n) for n in names]) + " |" for r in results]


def _notes(results: list[Result]) -> list[str]:
    notes = []
    for r in results:
        for name, peer in r.peers.items():
            if peer.note:
                notes.append(f"- {r.shape.id} {name}: {peer.note}")
            if peer.error and len(_short(f"n/a ({peer.error})")) > CELL_LIMIT:
                notes.append(f"- {r.shape.id} {name}: {_short(peer.error)}")
        if r.telemetry:
            notes.append(f"- {r.shape.id} GPU right after timing: {r.telemetry}")
    return notes


def _shape_fields(shape) -> dict:
    if not dataclasses.is_dataclass(shape):
        return {}
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(shape).items() if k != "id"}


def results_to_json(results: list[Result], env: dict[str, str]) -> str:
    """Every measurement (per-call seconds per block included) and the environment, as JSON text."""
    def peer_dict(r: Result, p: PeerResult) -> dict:
        d = {"note": p.note, "error": p.error, "check": None, "timing": None, "host_s": p.host,
             "unsupported": p.unsupported}
        if p.check is not None:
            d["check"] = {"max_abs": p.check.max_abs, "rel_l2": p.check.rel_l2, "lse_max_abs": p.check.lse_max_abs,
                          "problem": p.check.problem}
        if p.timing is not None:
            t = p.timing
            d["timing"] = {"median_s": t.median, "p20_s": t.p20, "p80_s": t.p80, "block_medians_s": t.block_medians,
                           "tflops": r.tflops(p.name), "blocks_s": t.blocks}
        return d

    doc = {"environment": env, "results": [{
        "family": r.family.name, "shape": r.shape.id, "description": r.description, **_shape_fields(r.shape),
        "flops": r.flops, "iters": r.iters, "rounds": r.rounds, "telemetry": r.telemetry,
        "peers": {name: peer_dict(r, p) for name, p in r.peers.items()},
        "ratios": {f"{a}/{b}": r.ratio(a, b) for a in r.ours() for b in r.others()},
    } for r in results]}
    return json.dumps(doc, indent=1)


def write_markdown(path: str | Path, results: list[Result], env: dict[str, str]) -> None:
    """Write :func:`format_table` to ``path`` atomically (readers see the old file or the new one)."""
    from .cache import atomic_write

    atomic_write(path, format_table(results, env).encode())
