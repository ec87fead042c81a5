"""transformers' DeepSeek-V4 through attn_implementation="mlagen" on the GPU: a small
random-weight DeepseekV4ForCausalLM with V4's attention geometry (head 512, window 128, CSA with
the indexer's top-k over a 4x pool, HCA over a 128x pool, a per-head sink) against its own eager
attention in float32.

Two checks, two tolerances:
* each layer's attention, on the inputs the float32 eager model hands its attention function
  rounded to bf16 (what mlagen reads), against eager attention in float32 on the same rounded
  inputs: max |diff| / max |ref| < 2e-2, the bound of the other bf16-kernel-against-float32 tests
  (tests/gpu/test_integrations_gpu.py OUT_TOL): the kernel rounds P and its output to bf16;
* the logits of the bf16 model through "mlagen" against the float32 eager model's, within 1.5x
  (+ 1e-3) of how far the bf16 eager model's are: V4 has no SDPA, so bf16 eager is the bf16
  baseline (the V3 test uses SDPA's); the rest of the model's bf16 rounding is in both.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

OUT_TOL = 2e-2
SEQ = 600          # 150 CSA entries (top-k 64 of them), 4 HCA entries, windows of 128


def _cpu_tests():
    # The GPU-free tests' model, by file (a "tests" package installed elsewhere could shadow ours).
    spec = importlib.util.spec_from_file_location("_test_transformers_v4_cpu",
                                                  Path(__file__).resolve().parents[1] / "test_transformers_v4.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CPU = _cpu_tests()


def _model(heads: int, attn: str, dtype):
    return CPU.tiny_deepseek_v4(heads, attn, dtype, device="cuda", hidden=256, vocab=512, window=128, hca_rate=128,
                                topk=64, positions=4096)


def _ids(batch: int, seq: int, seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 512, (batch, seq), device="cuda", generator=gen)


@pytest.mark.parametrize("heads", [8, 64, 128])   # TP-sharded, V4-Flash, V4-Pro
def test_each_v4_layers_attention_matches_eager_in_float32(heads, monkeypatch):
    _, modeling = CPU._v4_transformers()
    from mlagen.integrations.transformers import mlagen_attention_forward

    model = _model(heads, "eager", torch.float32)
    eager = modeling.eager_attention_forward
    calls, _ = CPU._capture(model, modeling, monkeypatch)
    with torch.no_grad():
        model(_ids(2, SEQ, 1), use_cache=False)
    assert [c[0].layer_type for c in calls] == CPU.LAYERS
    for module, q, kv, mask, kw in calls:
        qb, kvb = q.to(torch.bfloat16), kv.to(torch.bfloat16)
        with torch.no_grad():
            ref, _ = eager(module, qb.float(), kvb.float(), kvb.float(), mask, **kw)
            got, _ = mlagen_attention_forward(module, qb, kvb, kvb, mask.to(torch.bfloat16), **kw)
        assert got.shape == ref.shape and torch.isfinite(got).all(), module.layer_type
        err = (got.float() - ref).abs().max().item() / ref.abs().max().item()
        print(f"H {heads} {module.layer_type}: max |out - ref| / max |ref| = {err:.3g}")
        assert err < OUT_TOL, f"{module.layer_type}: max |out - ref| / max |ref| = {err:.3g}"


@pytest.mark.parametrize("heads", [64, 128])
def test_a_v4_model_through_mlagen_is_as_close_to_eager_as_bf16_eager(heads):
    ids = _ids(2, SEQ, 2)
    with torch.no_grad():
        ref = _model(heads, "eager", torch.float32)(ids, use_cache=False).logits
        bf16 = _model(heads, "eager", torch.bfloat16)(ids, use_cache=False).logits.float()
        got = _model(heads, "mlagen", torch.bfloat16)(ids, use_cache=False).logits.float()
    err, bf16_err = (got - ref).abs().max().item(), (bf16 - ref).abs().max().item()
    print(f"H {heads} logits: mlagen {err:.3g} from float32 eager, bf16 eager {bf16_err:.3g}")
    assert err <= 1.5 * bf16_err + 1e-3, f"mlagen {err:.3g} from eager, bf16 eager {bf16_err:.3g}"


def test_v4_padding_and_decoding_through_mlagen_match_eager():
    ids = _ids(2, 300, 3)
    mask = torch.ones(2, 300, dtype=torch.long, device="cuda")
    mask[1, :40] = 0     # left padding
    eager, bf16, ours = (_model(64, a, d) for a, d in (("eager", torch.float32), ("eager", torch.bfloat16),
                                                       ("mlagen", torch.bfloat16)))
    valid = mask.bool()
    with torch.no_grad():
        ref = eager(ids, attention_mask=mask, use_cache=False).logits
        base = bf16(ids, attention_mask=mask, use_cache=False).logits.float()
        got = ours(ids, attention_mask=mask, use_cache=False).logits.float()
        err, bf16_err = (got - ref)[valid].abs().max().item(), (base - ref)[valid].abs().max().item()
        print(f"padded logits: mlagen {err:.3g} from float32 eager, bf16 eager {bf16_err:.3g}")
        assert err <= 1.5 * bf16_err + 1e-3, f"padded: mlagen {err:.3g} from eager, bf16 eager {bf16_err:.3g}"
        # prefill 290 tokens into the model's cache, then decode the rest one token at a time
        one = ids[:1]
        caches = [CPU._cache(m(one[:, :290])) for m in (eager, bf16, ours)]
        errs, bf16_errs = [], []
        for t in range(290, 300):
            e, b, o = (m(one[:, t:t + 1], past_key_values=c).logits.float()
                       for m, c in zip((eager, bf16, ours), caches))
            errs.append((o - e).abs().max().item())
            bf16_errs.append((b - e).abs().max().item())
        print(f"decoding: mlagen {max(errs):.3g} from float32 eager, bf16 eager {max(bf16_errs):.3g}")
        assert max(errs) <= 1.5 * max(bf16_errs) + 1e-3, f"decoding: mlagen {errs} from eager, bf16 eager {bf16_errs}"


def test_v4_attention_through_mlagen_never_synchronises_the_host(monkeypatch):
    """The index lists come from the mask on the device: after a first call (which may compile),
    a layer's call runs under torch's sync debug mode set to raise on any synchronisation."""
    _, modeling = CPU._v4_transformers()
    from mlagen.integrations.transformers import mlagen_attention_forward

    model = _model(64, "eager", torch.bfloat16)
    calls, _ = CPU._capture(model, modeling, monkeypatch)
    with torch.no_grad():
        model(_ids(2, SEQ, 4), use_cache=False)
        for module, q, kv, mask, kw in list(calls):
            first, _ = mlagen_attention_forward(module, q, kv, kv, mask, **kw)
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                again, _ = mlagen_attention_forward(module, q, kv, kv, mask, **kw)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            assert torch.equal(first, again), module.layer_type
