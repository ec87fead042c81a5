"""The bench peers of MLA.md section 1b shapes on the GPU: tools/fa3_extra's FlashAttention-3 kernels
(256 / 256, a local window, softcap) against a float32 reference, and ``mlagen bench`` on small shapes of
GLM-5's geometry and with a window (FA3 from tools/fa3_extra, cuDNN SDPA, ours or "not supported").

The kernels must be built first (``python tools/fa3_extra/build.py``); without them these tests skip
saying so. Small shapes and few calls: these check the plumbing, never a speed.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from mlagen import bench  # noqa: E402
from mlagen.families.mla_prefill.peers import FA3_EXTRA  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _built():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("FA3's kernels are built for sm_90a only")
    why = FA3_EXTRA.why_not()
    if why is not None:
        pytest.skip(why)
    return FA3_EXTRA.load()


def _smoke():
    spec = importlib.util.spec_from_file_location("fa3_extra_smoke", ROOT / "tools" / "fa3_extra" / "smoke.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fa3_extra_smoke"] = module
    spec.loader.exec_module(module)
    return module


def test_every_fa3_extra_kernel_matches_the_reference():
    ops = _built()
    smoke = _smoke()
    names = [str(n) for n in ops.kernels()]
    assert names, "the library lists no kernel"
    assert smoke.main() == 0


def test_fa3_extra_refuses_a_kernel_it_does_not_have():
    ops = _built()
    q = torch.randn(8, 2, 64, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="no kernel built for d 64"):
        ops.fwd(q, q, q, cu, cu, 8, 8, True, -1, -1, 0.0, None)


SHAPES_1B = ["q=[300,77],k=[300,500],h=4,d=192/64/256,causal",   # GLM-5's geometry, a prefix, ragged
             "q=700,h=4,window=100/0"]                              # a window narrower than a tile row


def test_bench_runs_section_1b_shapes_with_every_peer_checked():
    _built()
    results = bench.run(SHAPES_1B, "fa3,cudnn,mlagen", iters=3, rounds=1, warmup=1)
    for r in results:
        fa3, ours = r.peers["fa3"], r.peers["mlagen"]
        assert fa3.timing is not None and fa3.check.ok, (r.shape.id, fa3.error)
        assert "tools/fa3_extra kernel" in fa3.note
        assert not ours.wrong, (r.shape.id, ours.check.problem)
        assert ours.timing is not None or ours.unsupported, (r.shape.id, ours.error)
        assert r.peers["cudnn"].timing is not None or r.peers["cudnn"].error, r.shape.id
    table = bench.format_table(results, bench.environment())
    assert "fa3 TFLOP/s" in table
