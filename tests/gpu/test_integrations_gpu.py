"""Batched inputs, FlashAttention's calls and transformers' "mlagen" attention on the GPU, against
a float32 reference written from the conventions (FlashAttention's documentation, MLA.md), and the
batched folds against the packed call bit for bit."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen import layouts  # noqa: E402
from mlagen.api import mla_prefill_kernel  # noqa: E402

OUT_TOL = 2e-2   # bf16 inputs and output against a float32 reference: max |diff| / max |ref|
LSE_TOL = 2e-3


def _rnd(g, *shape):
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)


def _batched(layout: str, b=2, s=384, sk=512, h=16, seed=0):
    """q, k, v as [B, S, H, D]: contiguous (FlashAttention's), transposed [B, H, S, D] (transformers'
    q and k), or mixed (v a slice of a [B, S, H, 256] row, as transformers' DeepSeek-V3 builds it)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if layout == "bshd":
        return _rnd(g, b, s, h, 192), _rnd(g, b, sk, h, 192), _rnd(g, b, sk, h, 128)
    q, k = _rnd(g, b, h, s, 192).transpose(1, 2), _rnd(g, b, h, sk, 192).transpose(1, 2)
    v = _rnd(g, b, h, sk, 128).transpose(1, 2) if layout == "bhsd" else _rnd(g, b, sk, h, 256)[..., 128:]
    return q, k, v


def _packed_args(q, k, v):
    b, s, sk = q.shape[0], q.shape[1], k.shape[1]
    cu_q = torch.arange(b + 1, dtype=torch.int32, device="cuda") * s
    cu_k = torch.arange(b + 1, dtype=torch.int32, device="cuda") * sk
    return [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)], dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


def _reference(q, k, v, lens_q, lens_k, causal, scale):
    """float32 attention per sequence of packed [T, H, D] tensors: causal aligned bottom-right
    (query i sees key j iff j <= i + Lk - Lq), lse natural log, +inf and out 0 for a row without keys."""
    outs, lses, qs, ks = [], [], 0, 0
    for lq, lk in zip(lens_q, lens_k):
        s = torch.einsum("qhd,khd->hqk", q[qs:qs + lq].float(), k[ks:ks + lk].float()) * scale
        if causal:
            i = torch.arange(lq, device="cuda").unsqueeze(1)
            j = torch.arange(lk, device="cuda").unsqueeze(0)
            s = s.masked_fill(j > i + lk - lq, -math.inf)
        lse = s.logsumexp(-1)
        p = torch.where(torch.isfinite(lse).unsqueeze(-1), torch.exp(s - lse.unsqueeze(-1)), torch.zeros_like(s))
        outs.append(torch.einsum("hqk,khd->qhd", p, v[ks:ks + lk].float()))
        lses.append(torch.where(torch.isfinite(lse), lse, torch.full_like(lse, math.inf)))
        qs, ks = qs + lq, ks + lk
    return torch.cat(outs), torch.cat(lses, dim=1)   # [Tq, H, 128], [H, Tq]


def _close(out, ref, tol=OUT_TOL):
    err = (out.float() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
    assert err < tol, f"max |out - ref| / max |ref| = {err:.3g} (tolerance {tol})"


def _close_lse(lse, ref):
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(lse), finite) and (lse[~finite] == math.inf).all()
    err = (lse[finite] - ref[finite]).abs().max().item() if finite.any() else 0.0
    assert err < LSE_TOL * max(ref[finite].abs().max().item(), 1.0), f"lse max |diff| {err:.3g}"


# --- batched inputs -------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout,fold", [("bshd", "tokens"), ("bhsd", "heads"), ("mixed", "batch")])
def test_batched_inputs_match_the_reference_and_the_packed_call(layout, fold, causal):
    q, k, v = _batched(layout, seed=("bshd", "bhsd", "mixed").index(layout) + 10 * causal)
    assert layouts.choose_fold((q, k, v)) == fold
    out, lse = mlagen.mla_prefill(q, k, v, causal=causal)
    flat, cu = _packed_args(q, k, v)
    ref_out, ref_lse = _reference(*flat, [384, 384], [512, 512], causal, 192 ** -0.5)
    _close(out.reshape(-1, 16, 128), ref_out)
    _close_lse(lse.reshape(-1, 16).t(), ref_lse)
    packed_out, packed_lse = mlagen.mla_prefill(*flat, causal=causal, **cu)
    if fold == "tokens":   # the same call as the packed one
        assert torch.equal(out.reshape(-1, 16, 128), packed_out) and torch.equal(lse.reshape(-1, 16), packed_lse)
    # With the packed call's kernel forced, every fold computes the same bits: each (sequence,
    # head) problem is the same arithmetic wherever the fold puts it.
    variant = mla_prefill_kernel(*flat, causal=causal, **cu).variant
    forced_packed = mlagen.mla_prefill(*flat, causal=causal, kernel=variant, **cu)
    for f in layouts.allowed_folds((q, k, v)):
        got = layouts.dense_batched(mlagen.mla_prefill, False, q, k, v, causal=causal, kernel=variant, fold=f)
        assert torch.equal(got[0].reshape(-1, 16, 128), forced_packed[0]), f"out, fold {f}"
        assert torch.equal(got[1].reshape(-1, 16), forced_packed[1]), f"lse, fold {f}"


def test_batched_calls_trace_under_torch_compile_fullgraph():
    q, k, v = _batched("bhsd", seed=7)

    def layer(q, k, v):
        out, lse = mlagen.mla_prefill(q * 0.5, k, v, causal=True)
        return out.float() + 1, lse * 2

    eager = layer(q, k, v)
    torch._dynamo.reset()
    got = torch.compile(layer, fullgraph=True)(q, k, v)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


def test_a_batched_call_is_captured_in_a_cuda_graph():
    q, k, v = _batched("bshd", b=3, seed=8)
    mlagen.mla_prefill(q[:2], k[:2], v[:2])   # builds the kernel (batch 2: batch 3's cu_seqlens are not made yet)
    want_out, want_lse = mlagen.mla_prefill(q, k, v)
    layouts._cu_cache.clear()
    out, lse = torch.empty_like(want_out), torch.empty_like(want_lse)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):   # its cu_seqlens are made inside the capture, so not kept for eager calls
        mlagen.mla_prefill(q, k, v, out=out, lse=lse)
    assert not layouts._cu_cache
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


# --- FlashAttention's calls -----------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_varlen_func_against_flash_attentions_conventions(causal):
    g = torch.Generator(device="cuda").manual_seed(11)
    lens_q, lens_k = [200, 1, 0, 333], [200, 300, 17, 1000]   # a prefix of cached keys, a sequence without queries
    h = 8
    q, k, v = _rnd(g, sum(lens_q), h, 192), _rnd(g, sum(lens_k), h, 192), _rnd(g, sum(lens_k), h, 128)
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")  # noqa: E731
    out, lse = mlagen.flash_attn_varlen_func(q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k),
                                             causal=causal, return_softmax_lse=True)
    assert out.shape == (sum(lens_q), h, 128) and lse.shape == (h, sum(lens_q)) and lse.is_contiguous()
    ref_out, ref_lse = _reference(q, k, v, lens_q, lens_k, causal, 192 ** -0.5)   # softmax_scale default
    _close(out, ref_out)
    _close_lse(lse, ref_lse)
    as_window = mlagen.flash_attn_varlen_func(q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k),
                                              window_size=(-1, 0) if causal else (-1, -1))
    assert torch.equal(as_window, out)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_flash_attn_func_against_flash_attentions_conventions(layout):
    q, k, v = _batched(layout, b=2, s=256, sk=640, h=8, seed=12)
    out, lse, probs = mlagen.flash_attn_func(q, k, v, causal=True, softmax_scale=0.08, return_attn_probs=True)
    assert probs is None and out.shape == (2, 256, 8, 128) and lse.shape == (2, 8, 256) and lse.is_contiguous()
    flat, _ = _packed_args(q, k, v)
    ref_out, ref_lse = _reference(*flat, [256, 256], [640, 640], True, 0.08)
    _close(out.reshape(-1, 8, 128), ref_out)
    _close_lse(lse.permute(1, 0, 2).reshape(8, -1), ref_lse)


# --- transformers ----------------------------------------------------------------------------


def _model(heads: int, attn: str, dtype):
    # The GPU-free tests' model, by file (a "tests" package installed elsewhere could shadow ours).
    spec = importlib.util.spec_from_file_location("_test_integrations_cpu",
                                                  Path(__file__).resolve().parents[1] / "test_integrations.py")
    cpu_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpu_tests)
    return cpu_tests.tiny_deepseek(heads, attn, dtype, device="cuda", hidden=256, vocab=512, rank=64, positions=1024)


@pytest.mark.parametrize("heads", [128, 64])   # DeepSeek-V3 and Kimi-K2
def test_deepseek_v3_through_mlagen_is_as_close_to_eager_as_sdpa(heads):
    ids = torch.randint(0, 512, (2, 300), device="cuda", generator=torch.Generator(device="cuda").manual_seed(3))
    with torch.no_grad():
        ref = _model(heads, "eager", torch.float32)(ids).logits
        sdpa = _model(heads, "sdpa", torch.bfloat16)(ids).logits.float()
        got = _model(heads, "mlagen", torch.bfloat16)(ids).logits.float()
    err, sdpa_err = (got - ref).abs().max().item(), (sdpa - ref).abs().max().item()
    assert err <= 1.5 * sdpa_err + 1e-3, f"mlagen {err:.3g} from eager, sdpa {sdpa_err:.3g}"


def test_deepseek_v3_padding_through_mlagen_matches_eager():
    ids = torch.randint(0, 512, (3, 160), device="cuda", generator=torch.Generator(device="cuda").manual_seed(4))
    mask = torch.ones(3, 160, dtype=torch.long, device="cuda")
    mask[1, :40] = 0     # left padding
    mask[2, 150:] = 0    # right padding
    with torch.no_grad():
        ref = _model(16, "eager", torch.float32)(ids, attention_mask=mask).logits
        sdpa = _model(16, "sdpa", torch.bfloat16)(ids, attention_mask=mask).logits.float()
        got = _model(16, "mlagen", torch.bfloat16)(ids, attention_mask=mask).logits.float()
    valid = mask.bool()
    err, sdpa_err = ((got - ref)[valid].abs().max().item(), (sdpa - ref)[valid].abs().max().item())
    assert err <= 1.5 * sdpa_err + 1e-3, f"mlagen {err:.3g} from eager, sdpa {sdpa_err:.3g}"


def test_the_transformers_attention_function_traces_under_torch_compile_fullgraph():
    pytest.importorskip("transformers", reason="transformers is not installed")
    from mlagen.integrations.transformers import mlagen_attention_forward

    g = torch.Generator(device="cuda").manual_seed(5)
    q, k, v = _rnd(g, 2, 16, 256, 192), _rnd(g, 2, 16, 256, 192), _rnd(g, 2, 16, 256, 128)
    module = torch.nn.Module()
    module.is_causal = True

    def attend(q, k, v):
        return mlagen_attention_forward(module, q, k, v, None, scaling=0.1)[0]

    eager = attend(q, k, v)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(attend, fullgraph=True)(q, k, v), eager)


def test_a_workload_recorded_through_flash_attn_varlen_func_loads_for_tuning(tmp_path, monkeypatch):
    """docs/integration.md's tuning step: MLAGEN_RECORD_SHAPES counts what the serving calls ran,
    and ``mlagen tune --workload`` reads the file (here: its loader, without tuning)."""
    from mlagen import shapelog
    from mlagen.shapes import load_workload

    path = tmp_path / "shapes.yaml"
    monkeypatch.setenv("MLAGEN_RECORD_SHAPES", str(path))
    shapelog.reset()
    try:
        g = torch.Generator(device="cuda").manual_seed(13)
        q, k, v = _rnd(g, 600, 8, 192), _rnd(g, 600, 8, 192), _rnd(g, 600, 8, 128)
        cu = torch.tensor([0, 200, 600], dtype=torch.int32, device="cuda")
        for _ in range(2):
            mlagen.flash_attn_varlen_func(q, k, v, cu, cu, 400, 400, causal=True)
        shapelog.flush()
        family, shapes = shapelog.read(path)
        assert family == "mla_prefill" and shapes == [{"shape": "b=2,q=300,h=8,causal", "weight": 2}]
        assert len(load_workload(path)) == 1
    finally:
        shapelog.reset()
