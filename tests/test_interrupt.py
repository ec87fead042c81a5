"""Ctrl-C stops `mlagen build --all` at once: pending compiles cancelled, workers terminated,
exit status 130, no traceback (the terminal sends SIGINT to the whole process group)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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
