"""Test set-up shared by the GPU-free and GPU suites.

Tests marked ``gpu`` skip with a visible reason where no CUDA device is usable (the CI machine);
they run on the device machine. Generated artifacts go to a per-session directory unless
MLAGEN_OUT_DIR is set.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if not os.environ.get("MLAGEN_OUT_DIR"):
    _SESSION_OUT = tempfile.mkdtemp(prefix="mlagen-test-out-")
    os.environ["MLAGEN_OUT_DIR"] = _SESSION_OUT
    # The directory (compile cache, database, builds) is this session's own: remove it at exit,
    # so repeated runs do not fill the temporary directory.
    atexit.register(shutil.rmtree, _SESSION_OUT, ignore_errors=True)


@pytest.fixture
def spec_defaults(monkeypatch):
    """Dispatch without tuning records (``MLAGEN_NO_TUNED=1``), for tests that compare two calls bit
    for bit: that holds for one variant, and two calls of different shape classes (two pools
    against their concatenation, an FP8 cache against its dequantized copy) may find different
    records. The shipped records run in their own GPU tests."""
    monkeypatch.setenv("MLAGEN_NO_TUNED", "1")


def _gpu_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs torch with CUDA (torch is not installed)"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU; none is visible on this machine (GPU tests run on the device machine)"
    return None


GPU_SKIP_REASON = _gpu_skip_reason()


def _amd_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs torch built for ROCm (torch is not installed)"
    if not getattr(torch.version, "hip", None) or not torch.cuda.is_available():
        return ("needs an AMD GPU with ROCm and a ROCm build of torch; none here "
                "(gfx942/gfx950 kernels are compiled and checked only)")
    return None


AMD_SKIP_REASON = _amd_skip_reason()


def pytest_collection_modifyitems(config, items):
    for marker, reason in (("gpu", GPU_SKIP_REASON), ("amd", AMD_SKIP_REASON)):
        if reason is None:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


def _toolchain() -> str:
    """Which NVRTC the compile tests use (CI runs them under the oldest and the newest allowed)."""
    try:
        from mlagen.backends.cuda import NvrtcCompiler

        return f"NVRTC {NvrtcCompiler().version()} from {NvrtcCompiler.library_path()}"
    except Exception as exc:  # no cuda-bindings: the compile tests say so themselves
        return f"NVRTC unavailable ({type(exc).__name__}: {exc})"


# Loaded once, now: the NVRTC library is chosen at its first use in the process
# (MLAGEN_NVRTC_LIBRARY), which must not be a test that has cleared the environment.
TOOLCHAIN = _toolchain()


def pytest_report_header(config):
    return [f"mlagen GPU tests: {'enabled' if GPU_SKIP_REASON is None else 'skipped: ' + GPU_SKIP_REASON}",
            f"mlagen compile tests: {TOOLCHAIN}"]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    now = _toolchain()
    terminalreporter.write_line(f"mlagen compile tests ran with {now}"
                                + ("" if now == TOOLCHAIN else f" (BUT STARTED WITH {TOOLCHAIN})"))
