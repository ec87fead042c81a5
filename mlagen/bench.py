"""Side-by-side measurement of mlagen against its peers, as ``../shared/BENCHMARKS.md`` prescribes.

One process, one GPU. For each dense shape (D1-D7) every peer runs the same problem on the same
fresh ``randn`` inputs:

* ``fa3``: FlashAttention-3's 192/128 varlen forward, built from ``<peers>/fa3`` (see
  :func:`fa3_status`); K is nope ‖ rope expanded to every head once, before timing, as a
  serving stack holds it. The strongest dense peer: first column of the table when present.
* ``mlagen``: the public call exactly as a user writes it, ``mlagen.mla_prefill(q, k, v,
  k_rope=..., cu_seqlens_q=..., cu_seqlens_k=..., causal=...)``: device cu_seqlens, default
  arguments, the dispatched kernel, the shared [Tk, 1, 64] rope key (the MLA case).
* ``mlagen-check``: the same with ``check_seqlens=True`` (the cu_seqlens read back and checked).
* ``mlagen:<spec>``: one kernel spec forced (``kernel=<spec>``), for comparing specs.
* ``cudnn``: PyTorch SDPA restricted to the cuDNN backend; K is nope ‖ rope expanded to every head.
* ``fa2``: PyTorch SDPA restricted to the flash backend (FlashAttention-2), V zero-padded to 192.

Peer-side preparation (concatenation, padding, [B, H, L, D] layout, masks) happens before any
timing. Each peer is first checked against the float32 reference of MLA.md on two heads (ours
with NaN-poisoned outputs; :mod:`mlagen.verify`), then warmed up, then timed in interleaved
rounds (peer, ours, peer, ours ...) with CUDA events around each call and the L2 cache flushed
before it, outside the events (:mod:`mlagen.measure`). A peer that raises or computes something
else is reported "n/a (why)"; the run goes on.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import random
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from . import knobs
from .errors import BenchError
from .families.mla_prefill import D_QK, D_V
from .measure import MIB, L2Flush, Timing, median, percentile, time_calls  # noqa: F401  (re-exported)
# The dense shapes (D1-D7, descriptions): bench times the dense family against its peers.
from .families.mla_prefill.problem import SHAPES, Shape, parse_shape, parse_shapes, ragged_lengths  # noqa: F401
# The dense family's reference and comparison: bench's peers (cuDNN, FlashAttention) run dense MLA.
from .families.mla_prefill.reference import REL_TOL, Check, compare, make_inputs, reference_heads  # noqa: F401
from .verify import CHECK_HEADS

OURS = "mlagen"
OURS_CHECKED = "mlagen-check"   # the public call with check_seqlens=True
FA3 = "fa3"
CELL_LIMIT = 80    # characters of an n/a or WRONG reason shown in a table cell


def _split_ids(text: str | Iterable[str]) -> list[str]:
    items = text.split(",") if isinstance(text, str) else list(text)
    return [item.strip() for item in items if item.strip()]


def parse_peers(text: str | Iterable[str]) -> list[str]:
    """Peer names from a comma-separated list ("mlagen,cudnn"), in order, each once.

    Raises:
        BenchError: naming each unknown peer and listing the known ones.
    """
    names = list(dict.fromkeys(n.lower() for n in _split_ids(text)))
    if not names:
        raise BenchError(f"no peer given; choose from {', '.join(PEERS)}")
    unknown = [n for n in names if n not in PEERS and not is_ours(n)]
    if unknown:
        raise BenchError(f"unknown peer {', '.join(map(repr, unknown))}; choose from {', '.join(PEERS)}, "
                         f"or {OURS}:<spec> for one kernel spec")
    return names


def is_ours(name: str) -> bool:
    """``mlagen`` (the public call), ``mlagen-check`` (with check_seqlens=True) or ``mlagen:<spec>``
    (one kernel spec forced)."""
    return name in (OURS, OURS_CHECKED) or name.startswith(OURS + ":")


def _peer_factory(name: str):
    if name.startswith(OURS + ":"):
        spec = name.split(":", 1)[1]
        return lambda shape, inputs: mlagen_peer(shape, inputs, kernel=spec)
    return PEERS[name]


def interleaving(peers: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, peer) in the order blocks are timed: each round runs every other peer, each
    followed by ours (peer, ours, peer, ours ...); without ours, or with ours alone, each once.
    Several of ours (``mlagen:<spec>``) all follow each other peer."""
    ours = [p for p in peers if is_ours(p)]
    others = [p for p in peers if not is_ours(p)]
    if ours and others:
        one_round = [name for p in others for name in (p, *ours)]
    else:
        one_round = list(peers)
    return [(r, name) for r in range(rounds) for name in one_round]


# --- peers ----------------------------------------------------------------------------------


@dataclass
class Peer:
    """One way to run a shape, prepared: ``fn`` is the timed call (its result is dropped);
    ``checked_call`` runs the problem once more and returns (out [Tq, H, 128], lse [Tq, H] or
    None) in the packed layout for the correctness check. ``note`` says how the peer was adapted."""

    name: str
    fn: Callable[[], Any]
    checked_call: Callable[[], tuple[Any, Any]]
    note: str = ""


def mlagen_peer(shape: Shape, inputs: dict, kernel: str | None = None, check_seqlens: bool | None = None) -> Peer:
    """Our kernel through the public API, called exactly as a user writes it: device cu_seqlens,
    the shared rope key, every other argument at its default. ``check_seqlens=True`` makes the
    ``mlagen-check`` peer; ``kernel`` forces a spec (``mlagen:<spec>``). The checked call
    poisons ``out`` and ``lse`` with NaN so a row the kernel never writes shows up."""
    import torch

    from . import api

    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    kwargs = {"k_rope": inputs["k_rope"], "cu_seqlens_q": inputs["cu_seqlens_q"],
              "cu_seqlens_k": inputs["cu_seqlens_k"], "causal": shape.causal}
    extra = {}
    if kernel is not None:
        extra["kernel"] = kernel
    if check_seqlens is not None:
        extra["check_seqlens"] = check_seqlens

    def fn():
        return api.mla_prefill(q, k, v, **kwargs, **extra)

    def checked_call():
        out = torch.full((shape.total_q, shape.heads, D_V), math.nan, dtype=torch.bfloat16, device=q.device)
        lse = torch.full((shape.total_q, shape.heads), math.nan, dtype=torch.float32, device=q.device)
        got_out, got_lse = api.mla_prefill(q, k, v, out=out, lse=lse, **kwargs, **extra)
        if got_out.data_ptr() != out.data_ptr() or got_lse.data_ptr() != lse.data_ptr():
            raise BenchError("mla_prefill returned new tensors instead of the out= / lse= given to it")
        return got_out, got_lse

    name = OURS if kernel is None else f"{OURS}:{kernel}"
    if check_seqlens:
        name = OURS_CHECKED
    sel = api.mla_prefill_kernel(q, k, v, **kwargs, **({"kernel": kernel} if kernel else {}))
    how = "public call, default arguments" if not extra else ", ".join(f"{a}={b!r}" for a, b in extra.items())
    return Peer(name, fn, checked_call, f"{how}; shared k_rope [Tk, 1, 64]; {sel.variant.symbol} ({sel.origin})")


def mlagen_checked_peer(shape: Shape, inputs: dict) -> Peer:
    """The public call with ``check_seqlens=True``: what checking the offsets costs."""
    return mlagen_peer(shape, inputs, check_seqlens=True)


FA3_BUILD_HINT = "build it on the GPU machine with: bash <peers>/fa3/run_remote.sh (about 2 minutes)"


def fa3_status() -> tuple[str | None, str]:
    """(path of ``fa3_peer.py``, "") if FlashAttention-3's peer build is present, else (None, why not)."""
    import os

    root = knobs.peers_dir()
    if root is None:
        return None, f"no peers directory (set {knobs.PEERS_DIR.name}, or put it at <repo>/../shared/peers)"
    wrapper = root / "fa3" / "fa3_peer.py"
    if not wrapper.is_file():
        return None, f"{wrapper} not found"
    so = os.environ.get("FA3_PEER_SO") or os.path.join(os.environ.get("FA3_PEER_BUILD", str(wrapper.parent / "build")),
                                                       "fa3_peer_C.so")
    if not os.path.exists(so):
        return None, f"FlashAttention-3 is not built ({so} not found); {FA3_BUILD_HINT}"
    return str(wrapper), ""


def _load_fa3():
    import importlib.util
    import sys

    path, why = fa3_status()
    if path is None:
        raise BenchError(why)
    module = sys.modules.get("fa3_peer")
    if module is None:
        spec = importlib.util.spec_from_file_location("fa3_peer", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["fa3_peer"] = module
    module.load()
    return module


def fa3_peer(shape: Shape, inputs: dict) -> Peer:
    """FlashAttention-3's varlen forward (d_qk 192 / d_v 128). FA3 takes K with the rope part
    expanded to every head: built once here, outside the timed call, as a serving stack holds
    it. A batch of one gets cu_seqlens [0, T] (the varlen API, as vLLM and SGLang call it)."""
    import torch

    fa3 = _load_fa3()
    q, v, device = inputs["q"], inputs["v"], inputs["q"].device
    k = torch.cat([inputs["k"], inputs["k_rope"].expand(-1, shape.heads, -1)], dim=-1).contiguous()
    cu_q, cu_k = inputs["cu_seqlens_q"], inputs["cu_seqlens_k"]
    if cu_q is None:
        cu_q = torch.tensor([0, shape.total_q], dtype=torch.int32, device=device)
        cu_k = torch.tensor([0, shape.total_k], dtype=torch.int32, device=device)
    max_q, max_k = max(shape.q_lens), max(shape.k_lens)

    def fn():
        return fa3.fwd(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                       causal=shape.causal)

    def checked_call():
        out, lse = fn()
        return out, lse.transpose(0, 1)   # FA3's lse is [H, Tq]

    return Peer(FA3, fn, checked_call, "K nope ‖ rope expanded to [Tk, H, 192] once, before timing; varlen API")


def cudnn_peer(shape: Shape, inputs: dict) -> Peer:
    """PyTorch SDPA on the cuDNN backend (d_qk 192 / d_v 128 natively)."""
    from torch.nn.attention import SDPBackend

    return sdpa_peer(shape, inputs, name="cudnn", backend=SDPBackend.CUDNN_ATTENTION, pad_v=False,
                     lower_right="dense")


def fa2_peer(shape: Shape, inputs: dict) -> Peer:
    """PyTorch SDPA on the flash backend (FlashAttention-2), which needs d_v = d_qk: V padded to 192."""
    from torch.nn.attention import SDPBackend

    return sdpa_peer(shape, inputs, name="fa2", backend=SDPBackend.FLASH_ATTENTION, pad_v=True,
                     lower_right="bias")


def sdpa_peer(shape: Shape, inputs: dict, *, name: str, backend, pad_v: bool, lower_right: str) -> Peer:
    """``scaled_dot_product_attention`` restricted to ``backend`` on copies laid out [B, H, L, D].

    SDPA takes no packed batch: uniform lengths run as one batched call, ragged ones as one call
    per sequence (all inside the timed call). SDPA's ``is_causal`` is top-left aligned, right only
    when Lq = Lk; otherwise the bottom-right mask is either ``"dense"``, an additive bf16 [Lq, Lk]
    mask built before timing, or ``"bias"``, ``causal_lower_right`` (which picks its kernel itself,
    ignoring ``sdpa_kernel``: for the flash backend we first make sure it will pick flash).
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    calls = _sdpa_calls(shape, inputs, pad_v, lower_right)
    if backend == SDPBackend.FLASH_ATTENTION:
        _require_flash_for_bias(calls)
    scale = 1.0 / math.sqrt(D_QK)

    def fn():
        with sdpa_kernel(backend):
            return [F.scaled_dot_product_attention(q, k, v, scale=scale, **mask) for q, k, v, mask in calls]

    def checked_call():
        outs = fn()
        return torch.cat([o[..., :D_V].transpose(1, 2).reshape(-1, shape.heads, D_V) for o in outs]), None

    notes = []
    if pad_v:
        notes.append(f"V zero-padded to {D_QK}")
    if not shape.uniform:
        notes.append(f"per-sequence calls ({shape.batch} SDPA calls per timed call; SDPA takes no packed batch)")
    if shape.causal and any(lq != lk for lq, lk in zip(shape.q_lens, shape.k_lens)):
        notes.append("bottom-right causal as a dense additive [Lq, Lk] mask (SDPA's is_causal is top-left, and "
                     "causal_lower_right never dispatches to cuDNN)" if lower_right == "dense"
                     else "bottom-right causal through causal_lower_right (flash kernel)")
    return Peer(name, fn, checked_call, "; ".join(notes))


def _bhsd(t, batch: int):
    """[batch * L, H, D] packed rows → contiguous [batch, H, L, D]."""
    return t.unflatten(0, (batch, -1)).transpose(1, 2).contiguous()


def _sdpa_calls(shape: Shape, inputs: dict, pad_v: bool, lower_right: str) -> list[tuple]:
    """(q, k, v, mask kwargs) per SDPA call, every tensor prepared."""
    import torch

    q, v = inputs["q"], inputs["v"]
    k = torch.cat([inputs["k"], inputs["k_rope"].expand(-1, shape.heads, -1)], dim=-1)
    if pad_v:
        v = torch.nn.functional.pad(v, (0, D_QK - D_V))
    if shape.uniform:
        groups = [(slice(0, shape.total_q), slice(0, shape.total_k), shape.batch, shape.q_lens[0], shape.k_lens[0])]
    else:
        groups = [(slice(qs, qs + lq), slice(ks, ks + lk), 1, lq, lk) for qs, lq, ks, lk in shape.sequence_lengths()]
    return [(_bhsd(q[qs], b), _bhsd(k[ks], b), _bhsd(v[ks], b), _sdpa_mask(lq, lk, shape.causal, lower_right, q.device))
            for qs, ks, b, lq, lk in groups]


def _sdpa_mask(lq: int, lk: int, causal: bool, lower_right: str, device) -> dict:
    import torch

    if not causal:
        return {}
    if lq == lk:
        return {"is_causal": True}
    if lower_right == "bias":
        from torch.nn.attention.bias import causal_lower_right

        return {"attn_mask": causal_lower_right(lq, lk)}
    visible = torch.ones(lq, lk, dtype=torch.bool, device=device).tril(diagonal=lk - lq)
    bias = torch.zeros(1, 1, lq, lk, dtype=torch.bfloat16, device=device).masked_fill(~visible, -math.inf)
    return {"attn_mask": bias}


def _require_flash_for_bias(calls: list[tuple]) -> None:
    from torch.backends.cuda import SDPAParams, can_use_flash_attention
    from torch.nn.attention.bias import CausalBias

    for q, k, v, mask in calls:
        if isinstance(mask.get("attn_mask"), CausalBias) and not can_use_flash_attention(
                SDPAParams(q, k, v, None, 0.0, False, False)):
            raise BenchError("the flash kernel cannot take this shape with a bottom-right causal mask, and "
                             "causal_lower_right would silently run another kernel")


#: Peer factories by name: each takes (shape, inputs) and returns a prepared :class:`Peer`.
PEERS: dict[str, Callable[[Shape, dict], Peer]] = {FA3: fa3_peer, OURS: mlagen_peer, OURS_CHECKED: mlagen_checked_peer,
                                                   "cudnn": cudnn_peer, "fa2": fa2_peer}
PEER_NAMES = tuple(PEERS)


def default_peers(log: Callable[[str], None] | None = None) -> list[str]:
    """fa3 (if its build is present; else one line says why it is skipped), cudnn, mlagen."""
    path, why = fa3_status()
    if path is None and log is not None:
        log(f"fa3 skipped: {why}")
    return ([FA3] if path else []) + ["cudnn", OURS]


# --- running --------------------------------------------------------------------------------


@dataclass
class PeerResult:
    """What one peer did on one shape: a timing, or ``error`` (why it is n/a, or WRONG)."""

    name: str
    timing: Timing | None = None
    check: Check | None = None
    error: str | None = None
    note: str = ""

    @property
    def wrong(self) -> bool:
        return self.check is not None and not self.check.ok


@dataclass
class Result:
    """One shape's measurements, peers in the order asked."""

    shape: Shape
    peers: dict[str, PeerResult]
    iters: int
    rounds: int
    telemetry: str | None = None   # clocks and power seen right after the timed rounds

    def tflops(self, name: str, seconds: float | None = None) -> float | None:
        """TFLOP/s of ``name`` at ``seconds`` per call (default: its median); None if not timed."""
        peer = self.peers.get(name)
        if peer is None or peer.timing is None:
            return None
        return self.shape.flops() / (seconds if seconds is not None else peer.timing.median) / 1e12

    def ratio(self, name: str, other: str) -> float | None:
        """Speed of ``name`` over ``other`` (ratio of median times inverted); None if either is missing."""
        a, b = self.tflops(name), self.tflops(other)
        return None if a is None or b is None else a / b


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
        shape_ids: shape ids ("D1,D2", a list of ids, or "all") or :class:`Shape` objects.
        peers: peer names (see ``PEERS``), in the order they run in each round; default
            :func:`default_peers`.
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

    shapes = [s for item in ([shape_ids] if isinstance(shape_ids, (str, Shape)) else shape_ids)
              for s in ([item] if isinstance(item, Shape) else parse_shapes(item))]
    log = progress or _log_stderr
    names = parse_peers(peers) if peers is not None else default_peers(log)
    if iters < 1 or rounds < 1 or warmup < 0:
        raise BenchError(f"need iters >= 1, rounds >= 1 and warmup >= 0; got {iters}, {rounds}, {warmup}")
    if not torch.cuda.is_available():
        raise BenchError("bench needs a CUDA GPU, and torch sees none")
    device = torch.device(device if device is not None else f"cuda:{torch.cuda.current_device()}")
    flush = L2Flush(device)
    return [_bench_shape(shape, names, iters, rounds, warmup, seed, device, flush, log) for shape in shapes]


def _bench_shape(shape, names, iters, rounds, warmup, seed, device, flush, log) -> Result:
    import torch

    log(f"{shape.id}: {shape.description}; {shape.flops() / 1e12:.2f} TFLOP per call")
    inputs = make_inputs(shape, device, seed)
    ref = reference_heads(shape, inputs, CHECK_HEADS)
    outcomes, ready = {}, {}
    for name in names:
        outcomes[name], peer = _prepare(name, shape, inputs, ref, warmup, log)
        if peer is not None:
            ready[name] = peer
    _time_rounds(shape, ready, outcomes, iters, rounds, flush, log)
    result = Result(shape, outcomes, iters, rounds, _telemetry_text(gpu_telemetry(device)))
    del inputs, ref, ready
    torch.cuda.empty_cache()
    return result


def _prepare(name, shape, inputs, ref, warmup, log) -> tuple[PeerResult, Peer | None]:
    """Build, check and warm up one peer; a failure at any step makes it n/a for this shape."""
    import torch

    outcome = PeerResult(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            peer = _peer_factory(name)(shape, inputs)
            outcome.note = peer.note
            out, lse = peer.checked_call()   # also the first call: compiles, builds cuDNN graphs
            outcome.check = compare(out, lse, *ref)
            del out, lse
            for _ in range(warmup if outcome.check.ok else 0):
                peer.fn()
            torch.cuda.synchronize()
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
    return outcome, peer


def _time_rounds(shape, ready, outcomes, iters, rounds, flush, log) -> None:
    blocks: dict[str, list[list[float]]] = {name: [] for name in ready}
    for rnd, name in interleaving(list(ready), rounds):
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
        log(f"{shape.id} round {rnd + 1}/{rounds} {name}: {mid * 1e3:.3f} ms, "
            f"{shape.flops() / mid / 1e12:.1f} TFLOP/s")
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


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _peer_cell(result: Result, name: str) -> str:
    peer = result.peers.get(name)
    if peer is None:
        return "—"
    if peer.wrong:
        return _short(f"WRONG ({peer.check.problem})", CELL_LIMIT)
    if peer.timing is None:
        return _short(f"n/a ({peer.error})", CELL_LIMIT)
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
    """Peers in the order run, FlashAttention-3 (the strongest dense peer) first when present."""
    names = list(dict.fromkeys(name for r in results for name in r.peers))
    return sorted(names, key=lambda n: n != FA3)


def format_table(results: list[Result], env: dict[str, str]) -> str:
    """A Markdown report: the environment, the protocol, one table row per shape, then notes
    (how peers were adapted, full n/a reasons, clocks seen after each shape)."""
    names = _peer_order(results)
    ours = [n for n in names if is_ours(n)]
    others = [n for n in names if not is_ours(n)]
    pairs = [(a, b) for a in ours for b in others]
    header = (["shape", "description"] + [f"{n} TFLOP/s" for n in names] + [f"{a} / {b}" for a, b in pairs]
              + [f"{a} error" for a in ours])
    rows = []
    for r in results:
        rows.append([r.shape.id, r.shape.description] + [_peer_cell(r, n) for n in names]
                    + [_ratio_cell(r, a, b) for a, b in pairs] + [_check_cell(r, a) for a in ours])
    lines = ["# mlagen bench", ""] + [f"- {k}: {v}" for k, v in env.items()] + [""]
    if results:
        r0 = results[0]
        lines += [f"{r0.rounds} interleaved rounds (peer, ours, peer, ours ...) of {r0.iters} timed calls per block, "
                  "L2 flushed before each call. A cell is TFLOP/s at the median of the block medians, "
                  "[at the p80 – p20 call times, all blocks pooled], then the range over the block medians. "
                  f"Ratios are of the medians. Error: ours against the float32 reference on heads 0–{CHECK_HEADS - 1}; "
                  f"WRONG above a relative L2 error of {REL_TOL:g} or on any NaN.", ""]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---" for _ in header) + "|")
    lines += ["| " + " | ".join(_escape(_short(c)) for c in row) + " |" for row in rows]
    notes = _notes(results)
    if notes:
        lines += ["", "Notes:"] + notes
    return "\n".join(lines) + "\n"


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


def results_to_json(results: list[Result], env: dict[str, str]) -> str:
    """Every measurement (per-call seconds per block included) and the environment, as JSON text."""
    def peer_dict(r: Result, p: PeerResult) -> dict:
        d = {"note": p.note, "error": p.error, "check": None, "timing": None}
        if p.check is not None:
            d["check"] = {"max_abs": p.check.max_abs, "rel_l2": p.check.rel_l2, "lse_max_abs": p.check.lse_max_abs,
                          "problem": p.check.problem}
        if p.timing is not None:
            t = p.timing
            d["timing"] = {"median_s": t.median, "p20_s": t.p20, "p80_s": t.p80, "block_medians_s": t.block_medians,
                           "tflops": r.tflops(p.name), "blocks_s": t.blocks}
        return d

    doc = {"environment": env, "results": [{
        "shape": r.shape.id, "description": r.shape.description, "q_lens": list(r.shape.q_lens),
        "k_lens": list(r.shape.k_lens), "heads": r.shape.heads, "causal": r.shape.causal, "flops": r.shape.flops(),
        "iters": r.iters, "rounds": r.rounds, "telemetry": r.telemetry,
        "peers": {name: peer_dict(r, p) for name, p in r.peers.items()},
        "ratios": {f"{a}/{b}": r.ratio(a, b) for a in r.peers if is_ours(a) for b in r.peers if not is_ours(b)},
    } for r in results]}
    return json.dumps(doc, indent=1)


def write_markdown(path: str | Path, results: list[Result], env: dict[str, str]) -> None:
    """Write :func:`format_table` to ``path`` atomically (readers see the old file or the new one)."""
    from .cache import atomic_write

    atomic_write(path, format_table(results, env).encode())
