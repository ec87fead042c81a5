"""Every environment variable mlagen reads, declared once, typed.

Read a knob through its attribute (``knobs.out_dir``); the value is looked up when read, so tests
and worker processes can change the environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Knob:
    name: str
    default: str | None
    doc: str

    def raw(self) -> str | None:
        value = os.environ.get(self.name)
        return value if value not in (None, "") else self.default


OUT_DIR = Knob("MLAGEN_OUT_DIR", "out", "Directory for generated artifacts (rendered sources, cache, database).")
CACHE_DIR = Knob("MLAGEN_CACHE_DIR", None, "Compile cache directory; default <out>/cache.")
TUNING_DB = Knob("MLAGEN_TUNING_DB", None, "Tuning database file; default <out>/tuning.sqlite.")
NO_TUNED = Knob("MLAGEN_NO_TUNED", "0", "1: ignore tuning records (user and shipped); use spec defaults.")
NO_SHIPPED = Knob("MLAGEN_NO_SHIPPED", "0", "1: ignore the tuning records shipped with the package.")
FAMILY = Knob("MLAGEN_FAMILY", None, "Force a kernel spec by name (e.g. mla_prefill_sm80) instead of dispatch.")
COMPILE_WORKERS = Knob("MLAGEN_COMPILE_WORKERS", None, "Parallel compile processes for tuning; default: CPU count.")
LOG = Knob("MLAGEN_LOG", "warning", "Log level of the 'mlagen' logger (debug, info, warning).")
NVRTC_LIBRARY = Knob("MLAGEN_NVRTC_LIBRARY", None,
                     "Path of the libnvrtc.so to load instead of the nvidia-cuda-nvrtc wheel's (e.g. an older 13.x).")
CHECK_SEQLENS = Knob("MLAGEN_CHECK_SEQLENS", "0",
                     "1: mla_prefill reads device cu_seqlens back and checks them (a host sync; for debugging).")
RECORD_SHAPES = Knob("MLAGEN_RECORD_SHAPES", None,
                     "File to count the shape classes of kernel calls in (YAML; for mlagen tune --workload).")
HEAD_GROUP = Knob("MLAGEN_HEAD_GROUP", None,
                  "sm90 dense kernels: heads per group of the tile order (1: head after head); default: 8 on "
                  "causal problems without a long prefix (dynamic or static scheduler), else 1 (mla_prefill/tma.py).")
SEQ_ORDER = Knob("MLAGEN_SEQ_ORDER", "lpt",
                 "sm90 dense kernels on a batch of 2 to 32 sequences: the order their query tiles are handed out in: "
                 "lpt (the longest key range first) or batch (mla_prefill/tma.py: lpt_order).")
STAGING_MB = Knob("MLAGEN_STAGING_MB", "512",
                  "FP8 caches computed in bf16: the most memory (MiB) a call may take to stage its rows into a bf16 "
                  "workspace (worst case min(pool rows, sq x topk) x 1152 B plus the compaction's tables); a call "
                  "that could need more converts the rows in the kernel instead (slower); 0: always in the kernel "
                  "(mla_sparse_prefill/staging.py).")
PLANS = Knob("MLAGEN_PLANS", "1",
             "0: every eager kernel call takes the full path (checks, dispatch, packing) instead of a launch plan "
             "kept for its signature (mlagen/plans.py).")

HIP_CLANG = Knob("MLAGEN_HIP_CLANG", None,
                 "Offline clang for AMD targets (a path, or 'ziglang'); default: clang-22 on PATH, then the ziglang wheel.")
HIP_COMPILER = Knob("MLAGEN_HIP_COMPILER", "auto",
                    "AMD compiler: auto (hipRTC when a ROCm runtime is found, else offline clang), hiprtc or clang.")
PEERS_DIR = Knob("MLAGEN_PEERS_DIR", None, "Benchmark peers' builds (fa3/); default <repo>/../shared/peers, "
                 "else <repo>/shared/peers.")

ALL = (OUT_DIR, CACHE_DIR, TUNING_DB, NO_TUNED, NO_SHIPPED, FAMILY, COMPILE_WORKERS, LOG, NVRTC_LIBRARY, CHECK_SEQLENS,
       RECORD_SHAPES, HEAD_GROUP, SEQ_ORDER, STAGING_MB, PLANS, HIP_CLANG, HIP_COMPILER, PEERS_DIR)


def _flag(knob: Knob) -> bool:
    value = (knob.raw() or "0").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{knob.name}={value!r}: expected 0 or 1")


def _path(raw: str) -> Path:
    """A path variable's value with ``~`` expanded (a shell leaves ``VAR=~/x`` unexpanded)."""
    return Path(raw).expanduser()


def out_dir() -> Path:
    return _path(OUT_DIR.raw())


def cache_dir() -> Path:
    raw = CACHE_DIR.raw()
    return _path(raw) if raw else out_dir() / "cache"


def tuning_db() -> Path:
    raw = TUNING_DB.raw()
    return _path(raw) if raw else out_dir() / "tuning.sqlite"


def no_tuned() -> bool:
    return _flag(NO_TUNED)


def no_shipped() -> bool:
    return _flag(NO_SHIPPED)


def check_seqlens() -> bool:
    return _flag(CHECK_SEQLENS)


def record_shapes() -> str | None:
    raw = RECORD_SHAPES.raw()
    return str(_path(raw)) if raw else None


def plans() -> bool:
    return _flag(PLANS)


# call_state reads os.environ's own mapping of encoded names to encoded values (what os.environ
# reads and writes through; a fifth of the cost of os.environ.get, on every eager call).
_ENV_DATA = getattr(os.environ, "_data", None)
_ENCODE = getattr(os.environ, "encodekey", None)
_CALL_KNOBS = (FAMILY, CHECK_SEQLENS, RECORD_SHAPES, HEAD_GROUP, STAGING_MB)
if _ENV_DATA is not None and _ENCODE is not None:
    _CALL_KEYS = tuple(_ENCODE(k.name) for k in _CALL_KNOBS)
    _PLANS_KEY = _ENCODE(PLANS.name)
    _PLANS_ON = {None, *(os.environ.encodevalue(v) for v in ("", "1"))}
else:  # pragma: no cover (another os.environ)
    _ENV_DATA = None


def call_state() -> tuple | None:
    """The knobs a kernel call reads, raw, as one part of a launch plan's signature (so changing
    one between calls takes the full path again); None when MLAGEN_PLANS is off. One function, as
    it runs on every eager call."""
    if _ENV_DATA is None:  # pragma: no cover
        if not plans():
            return None
        return tuple(os.environ.get(k.name) for k in _CALL_KNOBS)
    get = _ENV_DATA.get
    if get(_PLANS_KEY) not in _PLANS_ON and not plans():   # any other spelling as MLAGEN_PLANS reads it
        return None
    family, check, record, group, staging = _CALL_KEYS
    return (get(family), get(check), get(record), get(group), get(staging))


def staging_bytes() -> int:
    """MLAGEN_STAGING_MB in bytes (ValueError naming the knob unless a whole number >= 0)."""
    raw = STAGING_MB.raw()
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{STAGING_MB.name}={raw!r}: expected a whole number of MiB >= 0 (0: never stage)")
    return value << 20


def forced_family() -> str | None:
    return FAMILY.raw()


def head_group() -> int | None:
    raw = HEAD_GROUP.raw()
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{HEAD_GROUP.name}={raw!r}: expected a positive integer (heads per group)")
    return value


def seq_order() -> str:
    raw = SEQ_ORDER.raw()
    if raw not in ("lpt", "batch"):
        raise ValueError(f"{SEQ_ORDER.name}={raw!r}: expected lpt or batch")
    return raw


def compile_workers() -> int:
    raw = COMPILE_WORKERS.raw()
    if raw is None:
        return max(1, os.cpu_count() or 1)
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{COMPILE_WORKERS.name}={raw!r}: expected a positive integer") from None
    if value < 1:
        raise ValueError(f"{COMPILE_WORKERS.name}={raw!r}: expected a positive integer")
    return value


def nvrtc_library() -> Path | None:
    raw = NVRTC_LIBRARY.raw()
    if raw is None:
        return None
    path = _path(raw)
    if not path.is_file():
        raise ValueError(f"{NVRTC_LIBRARY.name}={raw!r}: no such file (expected the path of a libnvrtc.so)")
    if not path.name.startswith("libnvrtc"):
        # Loaded first, a library that is not NVRTC would be ignored and the wheel's NVRTC used.
        raise ValueError(f"{NVRTC_LIBRARY.name}={raw!r}: not an NVRTC library (expected libnvrtc.so*)")
    return path


def log_level() -> str:
    value = LOG.raw().strip().lower()
    if value not in ("debug", "info", "warning", "error", "critical"):
        raise ValueError(f"{LOG.name}={value!r}: expected debug, info, warning, error or critical")
    return value.upper()


def hip_clang() -> str | None:
    return HIP_CLANG.raw()


def hip_compiler() -> str:
    value = (HIP_COMPILER.raw() or "auto").strip().lower()
    if value not in ("auto", "hiprtc", "clang"):
        raise ValueError(f"{HIP_COMPILER.name}={value!r}: expected auto, hiprtc or clang")
    return value


def peers_dir() -> Path | None:
    """Where benchmark peers live: $MLAGEN_PEERS_DIR, else ``<repo>/../shared/peers``, else
    ``<repo>/shared/peers`` (``<repo>`` holds the mlagen package); None if none exists."""
    raw = PEERS_DIR.raw()
    if raw:
        return _path(raw)
    repo = Path(__file__).resolve().parent.parent
    for candidate in (repo.parent / "shared" / "peers", repo / "shared" / "peers"):
        if candidate.is_dir():
            return candidate
    return None


# The typed reader of each knob that has one: what `mlagen info` runs to say a value is invalid.
READERS = {OUT_DIR: out_dir, CACHE_DIR: cache_dir, TUNING_DB: tuning_db, NO_TUNED: no_tuned, NO_SHIPPED: no_shipped,
           COMPILE_WORKERS: compile_workers, LOG: log_level, NVRTC_LIBRARY: nvrtc_library,
           CHECK_SEQLENS: check_seqlens, RECORD_SHAPES: record_shapes, HEAD_GROUP: head_group, SEQ_ORDER: seq_order,
           STAGING_MB: staging_bytes, PLANS: plans, HIP_CLANG: hip_clang, HIP_COMPILER: hip_compiler,
           PEERS_DIR: peers_dir, FAMILY: forced_family}


def problem(knob: Knob) -> str | None:
    """Why the knob's current value is invalid (its reader's message), or None."""
    try:
        READERS[knob]()
    except ValueError as exc:
        return str(exc)
    return None
