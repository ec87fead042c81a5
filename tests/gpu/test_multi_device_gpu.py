"""Calls on tensors of a device other than torch's current one (a process that drives several
GPUs: tensors on cuda:1 while the current device is 0, and the reverse), each family's first
call in a fresh process, so the kernel is loaded on that path: the result is the reference's,
and the caller's current device is unchanged. Needs two GPUs (nvidia-h200-x2 on the device
machine); tests/test_runtime_devices.py checks the loaders GPU-free."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import sys
    import torch
    import mlagen
    from mlagen import operands
    from mlagen.families.mla_sparse_prefill import reference as sp_ref
    from mlagen.families.mla_prefill.reference import reference as dense_ref

    current, other = int(sys.argv[1]), int(sys.argv[2])
    torch.cuda.set_device(current)
    dev = torch.device("cuda", other)
    g = torch.Generator(device=dev).manual_seed(7)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=dev).to(torch.bfloat16)

    # dense: one ragged batch, causal
    cu = torch.tensor([0, 300, 1000], dtype=torch.int32, device=dev)
    q, k, v, kr = rnd(1000, 16, 192), rnd(1000, 16, 128), rnd(1000, 16, 128), rnd(1000, 1, 64)
    out, lse = mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    assert out.device == dev and torch.cuda.current_device() == current
    ref_out, ref_lse = dense_ref(q, k, v, k_rope=kr, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
    err = ((out.float() - ref_out).norm() / ref_out.norm()).item()
    assert err < 1e-2 and (lse - ref_lse).abs().max().item() < 2e-3, ("dense", err)

    # sparse: bf16 rows, then the FP8 paged cache (bf16 compute)
    inp = sp_ref.make_inputs({"sq": 64, "heads": 64, "topk": 256, "s_kv": 2000}, dev, seed=3)
    got = mlagen.mla_sparse_prefill(**inp)
    ref = sp_ref.reference(inp["q"], inp["kv"], inp["indices"], softmax_scale=inp["softmax_scale"],
                           attn_sink=inp["attn_sink"])
    assert sp_ref.compare(got, ref).ok, "sparse bf16"
    inp = sp_ref.make_inputs({"sq": 64, "heads": 128, "topk": 256, "s_kv": 2000, "kv_format": "fp8_v32"}, dev,
                             seed=4)
    got = mlagen.mla_sparse_prefill(**inp)
    assert got[0].device == dev and torch.cuda.current_device() == current
    rows = operands.dequantize(inp["kv"], operands.get("fp8_v32"), round_bf16=True)  # what the kernel computes on
    ref = sp_ref.reference(inp["q"], rows, inp["indices"], softmax_scale=inp["softmax_scale"],
                           attn_sink=inp["attn_sink"])
    assert sp_ref.compare(got, ref).ok, "sparse fp8_v32"
    torch.cuda.synchronize(dev)
    print("ok")
''')


@pytest.mark.parametrize("current,other", [(0, 1), (1, 0)])
def test_tensors_on_another_device_than_the_current_one(current, other):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(current), str(other)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout[-2000:] + run.stderr[-4000:]
