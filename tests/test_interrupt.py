"""Ctrl-C stops `mlagen build --all` at once: pending compiles cancelled, workers terminated,
exit status 130, no traceback (the terminal sends SIGINT to the whole process group)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.mark.slow
def test_ctrl_c_stops_build_all_within_two_seconds(tmp_path):
    env = {**os.environ, "MLAGEN_OUT_DIR": str(tmp_path / "out"), "MLAGEN_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "mlagen.cli", "build", "mla_prefill_sm80", "--all", "-j", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        assert proc.stderr.readline().startswith("building 256 variant(s)")
        # Wait until compiles are under way in the workers (the first results are in).
        deadline = time.monotonic() + 60
        seen = []
        while len(seen) < 3 and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if line.startswith("[") and " ok " in line:
                seen.append(line)
        assert len(seen) == 3, "no compile finished within 60 s"
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # as the terminal does: the parent and every worker
        _, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-2000:]
    assert elapsed < 2.0, f"took {elapsed:.1f} s to stop"
    assert err.rstrip().endswith("interrupted") and "Traceback" not in err, err[-2000:]
    done = [line for line in err.splitlines() if line.startswith("[")]
    assert len(done) + len(seen) < 256  # it did not compile the rest first
    time.sleep(1.0)  # nothing of the group still runs (an exited child the container's init has not
    # reaped yet shows as a zombie, state Z, which holds no resources)
    left = subprocess.run(["pgrep", "-a", "-r", "R,S,D,T", "-g", str(proc.pid)], capture_output=True,
                          text=True).stdout.strip()
    assert left == "", f"processes left: {left}"


_POOL_SCRIPT = """
import multiprocessing.resource_tracker as rt, sys, time
from mlagen.build import compile_pool
pool = compile_pool(2)
futures = [pool.submit(time.sleep, 60) for _ in range(2)]
while len(pool._processes) < 2:
    time.sleep(0.05)
time.sleep(1.0)  # the workers have run their initializer
print(" ".join(str(p) for p in [*pool._processes, rt._resource_tracker._pid]), flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_no_compile_process_outlives_a_killed_parent(sig):
    """Issue 42 point 11: after SIGTERM, SIGHUP or SIGKILL of the parent (no handler of its own can
    run for the last), its compile workers and multiprocessing's resource tracker are gone
    within 2 s."""
    import os
    import time

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    proc = subprocess.Popen([sys.executable, "-c", _POOL_SCRIPT], stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 3, pids
        proc.send_signal(sig)
        proc.wait(10)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        left = [p for p in pids if _alive(p)]
        assert not left, f"still alive 2 s after {sig.name}: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
