"""How long the tuner's measuring process takes to start, on any machine.

Starts :class:`mlagen.tune.worker.GpuWorker` for D1 ``--repeat`` times in a row, as a tune starts
its worker and restarts it after each crash or hang, and prints each start's seconds. Where no
GPU is usable the process fails right after importing torch and looking for a device: that is
the time the start method itself decides (a fresh interpreter importing torch, or a fork of a
server that imported it once); with a GPU it is the whole start (CUDA context, inputs, references).

    python tools/profile_worker_start.py --repeat 4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlagen import spec as spec_mod  # noqa: E402
from mlagen.errors import TuningError  # noqa: E402
from mlagen.tune.worker import GpuWorker  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=4)
    args = p.parse_args(argv)
    spec = spec_mod.load("mla_prefill_sm90")
    from mlagen.families.mla_prefill.problem import SHAPES

    for i in range(args.repeat):
        w = GpuWorker(str(spec.path), SHAPES["D1"], 0, 3, 60.0)
        t0 = time.perf_counter()
        try:
            w.start()
            how = "ready"
        except TuningError as exc:
            how = "failed: " + str(exc).splitlines()[0][:80]
        print(f"start {i + 1}: {time.perf_counter() - t0:.2f} s ({how})", flush=True)
        w.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
