"""The measuring worker: one process per GPU that owns its CUDA context, checks and times variants."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
import traceback

from .. import dispatch
from .. import spec as spec_mod
from .. import variant as variant_mod
from ..errors import MlagenError, TuningError
from .config import family_of



def _worker_main(conn, spec_path: str, shape, seed: int, warmup: int, visible: str | None,
                 environ: dict | None = None) -> None:
    """Runs in a worker process: owns one GPU's CUDA context, the inputs and the references.
    ``environ``: the parent's environment when it started the process (a process forked from
    the fork server would otherwise have the server's, from when that started).

    Requests are ``{"values": ..., "iters": n, "warmup": w, "verify": parts}``: check the variant
    with those parts of :data:`mlagen.verify.PARTS` (None: every part not checked here before;
    the tuner spreads a variant's checks over its GPUs), then time it with ``w`` calls to warm up
    (default: the ``warmup`` given at start) and ``n`` timed calls, if the checks passed. The
    answer says how long loading, checking and timing took (``load_s``, ``verify_s``,
    ``time_s``), so the tuner can say where its GPU time went."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    if visible is not None:  # before anything initialises CUDA in this process
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    try:
        import torch

        from .. import measure, verify
        from ..runtime import device_info

        spec = spec_mod.load(spec_path)
        family = family_of(spec)
        device = torch.device("cuda", torch.cuda.current_device())
        trial = verify.Verifier(family, shape, device, seed, dtype=str(dict(spec.problem).get("dtype", "bf16")))
        flush = measure.L2Flush(device)
        info = device_info(device.index)
        conn.send(("ready", {"device": info.name, "sm_count": info.sm_count, "driver": info.driver_version,
                             "pci": getattr(info, "pci", "")}))
    except Exception:
        conn.send(("setup_failed", traceback.format_exc()))
        return

    checked: dict[variant_mod.Variant, dict[str, float]] = {}   # parts passed here, with their errors
    while True:
        msg = conn.recv()
        if msg is None:
            return
        t0 = time.perf_counter()
        v = variant_mod.make(spec, msg["values"])
        try:
            sel = dispatch.dispatcher().select(family.name, "", {}, device.index, None, variant=v)
        except MlagenError as exc:
            conn.send({"outcome": "launch_error", "detail": str(exc)})
            continue
        t1 = time.perf_counter()
        try:
            done = checked.setdefault(v, {})
            parts = msg.get("verify")
            parts = [p for p in (verify.PARTS if parts is None else parts) if p not in done]
            spent = {}
            for part in parts:
                t = time.perf_counter()
                problem, err = trial.verify(v, parts=(part,))
                spent[part] = time.perf_counter() - t
                if problem is not None:
                    conn.send({"outcome": "wrong_result", "max_error": err, "detail": problem})
                    break
                done[part] = err
            else:
                t2 = time.perf_counter()
                outputs = trial.outputs()
                for _ in range(msg.get("warmup", warmup)):
                    trial.call(v, outputs)
                samples = measure.time_calls(lambda: trial.call(v, outputs), msg["iters"], flush)
                med = measure.median(samples)
                conn.send({"outcome": "ok", "time_ms": med * 1e3, "tflops": trial.flops() / med / 1e12,
                           "max_error": max((e for e in done.values() if e is not None), default=None),
                           "registers": sel.binary.resources.registers,
                           "spills": sel.binary.resources.spill_stores + sel.binary.resources.spill_loads,
                           "load_s": t1 - t0, "verify_s": t2 - t1, "time_s": time.perf_counter() - t2,
                           "checks_s": spent})
        except Exception as exc:
            # A CUDA error poisons the context: report and exit so the parent starts a fresh worker.
            conn.send({"outcome": "crash", "detail": f"{type(exc).__name__}: {exc}"})
            return


@contextlib.contextmanager
def _main_not_imported():
    """Processes spawned meanwhile do not import this process's ``__main__`` first (what spawn
    does to find functions defined there; the worker's are all in mlagen). Started from a Dask
    worker, whose ``__main__`` is its command line module, that import is most of ``distributed``:
    3 to 4 s of a 4 s start on a loaded 2-core machine, 0.4 s without it (2026-12-02)."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if k in main.__dict__}
    main.__spec__ = None
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


PRELOAD = ("torch",)   # what the fork server imports once, so no worker start imports it again
_START = {"method": None}   # the start method in use here: "forkserver", or "spawn" once it failed


def _context():
    """The measuring processes' start method: a fork server that has imported torch (``PRELOAD``)
    where the platform has one, else spawn. A spawned worker imports torch itself, seconds of every
    start: a tune starts one per GPU and class and again after every crash or hang (D1's random
    samples hold illegal-address kernels: three restarts in a 24-trial tune on the H200,
    2026-12-02). A process forked from the server has torch imported and no CUDA context (the
    server never touches CUDA), so its CUDA start is as a spawned process's."""
    if _START["method"] is None:
        _START["method"] = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    ctx = multiprocessing.get_context(_START["method"])
    if _START["method"] == "forkserver":
        ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


class GpuWorker:
    """A worker process on one GPU with a per-trial timeout; restarted after a crash or a hang.

    ``device`` is a CUDA ordinal as this process sees it; the worker sees only that GPU.
    ``import_main=False`` starts the process without importing this process's ``__main__``
    (:func:`_main_not_imported`; the cluster runner's Dask workers). The process comes from
    :func:`_context` (a fork server with torch imported, else spawn)."""

    def __init__(self, spec_path: str, shape, seed: int, warmup: int, timeout_s: float, device: int | None = None,
                 setup_timeout_s: float = 300.0, import_main: bool = True):
        self.args = (spec_path, shape, seed, warmup, _visible_name(device))
        self.device = device
        self.timeout_s = timeout_s
        self.setup_timeout_s = setup_timeout_s
        self.import_main = import_main
        self.proc = None
        self.conn = None
        self._stopping = False

    def start(self) -> dict:
        ctx = _context()
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, *self.args, dict(os.environ)), daemon=True)
        try:
            with contextlib.nullcontext() if self.import_main else _main_not_imported():
                self.proc.start()
        except Exception:
            if _START["method"] == "spawn":
                raise
            _START["method"] = "spawn"   # no fork server here (a sandbox without its socket): as before
            parent.close()
            child.close()
            return self.start()
        child.close()
        self.conn = parent
        if not parent.poll(self.setup_timeout_s):
            self.stop()
            raise TuningError(f"the GPU worker did not start within {self.setup_timeout_s:.0f} s")
        try:
            kind, payload = parent.recv()
        except EOFError:
            self.stop()
            raise TuningError("the GPU worker died while starting (no GPU? see stderr)") from None
        if kind != "ready":
            self.stop()
            last = payload.strip().splitlines()[-1] if payload.strip() else "unknown error"
            raise TuningError(f"the GPU worker failed to start: {last}\n{payload}")
        return payload

    def run(self, values: dict, iters: int, warmup: int | None = None, verify: tuple[str, ...] | None = None) -> dict:
        """Measure one variant (the request of :func:`_worker_main`); starts the worker first if
        it is not running."""
        if self.proc is None or not self.proc.is_alive():
            self.start()
        msg = {"values": values, "iters": iters, "verify": verify}
        if warmup is not None:
            msg["warmup"] = warmup
        self.conn.send(msg)
        if not self.conn.poll(self.timeout_s):
            self.stop()
            return {"outcome": "hang", "detail": f"no result within {self.timeout_s:.0f} s; worker killed"}
        try:
            result = self.conn.recv()
        except EOFError:
            code = self.proc.exitcode if self.proc else None
            self.stop()
            return {"outcome": "crash", "detail": f"worker process died (exit code {code})"}
        if result.get("outcome") == "crash":
            self.stop()
        return result

    def ask_stop(self) -> None:
        """Tell the worker to exit, without waiting (:meth:`stop` waits)."""
        if self.proc is not None and self.proc.is_alive() and not self._stopping:
            self._stopping = True
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.ask_stop()
                self.proc.join(2)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)
        self.proc = None
        self.conn = None
        self._stopping = False


def _visible_name(device: int | None) -> str | None:
    """The CUDA_VISIBLE_DEVICES entry of ordinal ``device`` as this process numbers it."""
    if device is None:
        return None
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    if current:
        names = [n.strip() for n in current.split(",") if n.strip()]
        if device >= len(names):
            raise TuningError(f"--devices {device}: only {len(names)} GPU(s) visible (CUDA_VISIBLE_DEVICES={current})")
        return names[device]
    return str(device)


def parse_devices(text: str) -> tuple[int, ...]:
    """``"0,1"`` into (0, 1). Raises ValueError naming the bad entry."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit():
            raise ValueError(f"--devices: {item!r} is not a GPU index; expected a list like 0,1")
        if int(item) in out:
            raise ValueError(f"--devices: {item} is listed twice")
        out.append(int(item))
    return tuple(out)


def default_devices() -> tuple[int, ...]:
    """Every visible GPU of the same kind (name and SM count) as device 0."""
    from ..runtime import device_count, device_info

    first = device_info(0)
    return tuple(i for i in range(device_count())
                 if (device_info(i).name, device_info(i).sm_count) == (first.name, first.sm_count))


# --- search strategies ------------------------------------------------------------------------
