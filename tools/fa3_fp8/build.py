#!/usr/bin/env python3
"""Build FlashAttention-3's FP8 forward (d_qk 192 / d_v 128, e4m3 in, bf16 out, varlen, causal and not) as a
benchmark peer for mlagen's dense FP8 kernel, on the GPU machine (about 2 minutes on 16 cores).

FA3's sources, its CUTLASS headers and the compiler flags come from the bf16 peer in ``<peers>/fa3``
(``MLAGEN_PEERS_DIR``, else ``<repo>/../shared/peers``, else ``<repo>/shared/peers``): this script runs that
peer's ``build_fa3.py`` with this folder's two FP8 leaves (``inst_*_varlen.cu``) and op (``fa3_fp8_api.cpp``).

    python tools/fa3_fp8/build.py [--build-dir out/fa3_fp8] [--jobs N] [--force]

Result: ``<build-dir>/fa3_fp8_C.so``, loaded by ``tools/fa3_fp8/fa3_fp8.py`` (``torch.ops.fa3_fp8.fwd``) and by
``python -m mlagen.families.mla_prefill.tools --fa3-fp8``.
"""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)

from mlagen import knobs  # noqa: E402


def main() -> int:
    peers = knobs.peers_dir()
    script = peers / "fa3" / "build_fa3.py" if peers else None
    if script is None or not script.is_file():
        print(f"fa3_fp8: the FA3 peer's build_fa3.py is not found (peers directory: {peers}); set MLAGEN_PEERS_DIR",
              file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("build_fa3", script)
    fa3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fa3)
    fa3.EXT_NAME = "fa3_fp8_C"
    fa3.KERNEL_TUS = {"causal_varlen_e4m3": os.path.join(HERE, "inst_causal_varlen.cu"),
                      "noncausal_varlen_e4m3": os.path.join(HERE, "inst_noncausal_varlen.cu"),
                      "prepare_scheduler": fa3.KERNEL_TUS["prepare_scheduler"]}
    fa3.VARIANTS = {"all": list(fa3.KERNEL_TUS)}
    fa3.API_SRC = os.path.join(HERE, "fa3_fp8_api.cpp")
    fa3.INCLUDE_DIRS = [*fa3.INCLUDE_DIRS, HERE]
    argv = sys.argv[1:]
    if not any(a == "--build-dir" or a.startswith("--build-dir=") for a in argv):
        argv = ["--build-dir", os.path.join(REPO, "out", "fa3_fp8"), *argv]
    sys.argv = [str(script), "--variants", "all", *argv]
    fa3.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
