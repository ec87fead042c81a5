"""How the tuner's measuring process starts (CPU): forked from a server that imported torch once,
with the environment its parent has when it starts it."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

from mlagen import spec as spec_mod
from mlagen.errors import TuningError
from mlagen.families.mla_prefill.problem import SHAPES
from mlagen.tune import worker as worker_mod

S90 = spec_mod.load("mla_prefill_sm90")


def test_the_worker_takes_the_environment_its_parent_sends(monkeypatch):
    """A process forked from the fork server has the server's environment, from when the server
    started; the worker replaces it with the parent's (a tune's MLAGEN_CACHE_DIR, where its
    compiles went), then sets its GPU."""
    torch = pytest.importorskip("torch")
    from mlagen import measure, runtime, verify

    seen = {}

    class FakeVerifier:
        def __init__(self, family, shape, device, seed, dtype="bf16"):
            seen.update(os.environ)

    monkeypatch.setattr(os, "environ", {"MLAGEN_CACHE_DIR": "/the/servers/cache", "STALE": "1"})
    monkeypatch.setattr(verify, "Verifier", FakeVerifier)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(measure, "L2Flush", lambda device: None)
    monkeypatch.setattr(runtime, "device_info", lambda i: type("I", (), {"name": "Fake", "sm_count": 132,
                                                                        "driver_version": "13.0"})())
    parent, child = multiprocessing.Pipe()
    environ = {"MLAGEN_CACHE_DIR": "/the/tunes/cache", "PATH": "/bin"}
    thread = threading.Thread(target=worker_mod._worker_main,
                              args=(child, S90.path, SHAPES["D1"], 0, 2, "3", environ))
    thread.daemon = True
    thread.start()
    assert parent.poll(30), "the worker did not start"
    assert parent.recv()[0] == "ready"
    parent.send(None)
    thread.join(5)
    assert seen == {**environ, "CUDA_VISIBLE_DEVICES": "3"}


def test_restarts_fork_from_a_server_that_imported_torch(monkeypatch):
    """Every start of a GpuWorker (the first, and each after a crash or hang) comes from the fork
    server where the platform has one; on a machine without a GPU each fails at once with the
    worker's own one-line reason, as a spawned one did."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the worker would start")
    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork server on this platform")
    monkeypatch.setitem(worker_mod._START, "method", None)
    for _ in range(2):
        w = worker_mod.GpuWorker(str(S90.path), SHAPES["D1"], 0, 3, 60.0, setup_timeout_s=120)
        with pytest.raises(TuningError, match="the GPU worker failed to start: "):
            w.start()
        w.stop()
    assert worker_mod._START["method"] == "forkserver"
    assert "torch" in worker_mod.PRELOAD
