"""GPU-free tests of mlagen.layouts (batched inputs), mlagen.integrations.flash_attn,
mlagen.integrations.transformers and the torch.ops registration at ``import mlagen``.

The kernel is replaced by the float32 reference of MLA.md (mlagen.families.mla_prefill.reference)
behind the entry point the public call reaches, so everything above it (argument conventions,
folds, masks, zero-copy hand-over) runs on CPU tensors. The same paths on the GPU, against the real
kernels, are tests/gpu/test_integrations_gpu.py.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from mlagen import layouts  # noqa: E402
from mlagen.families.mla_prefill import entry  # noqa: E402
from mlagen.families.mla_prefill.reference import reference  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _storage(t) -> int:
    return t.untyped_storage().data_ptr()


class FakeKernel:
    """Stands for the dense kernel: records what it is handed and writes the reference's result."""

    def __init__(self):
        self.calls = []

    def planned(self, *args):
        return None, None

    def run_full(self, args, sig=None):
        q, out, lse = args.q, args.out, args.lse
        assert q.dim() == 3 and q.stride(-1) == 1
        self.calls.append(args._asdict())
        traits = {n: getattr(args, n) for n in ("window_size", "chunk_size", "softcap", "attn_sink")}
        ref_out, ref_lse = reference(q, args.k, args.v, k_rope=args.k_rope, cu_seqlens_q=args.cu_seqlens_q,
                                     cu_seqlens_k=args.cu_seqlens_k, causal=args.causal,
                                     softmax_scale=args.softmax_scale, dtype=torch.float32, **traits)
        if out is None:
            out = torch.empty(ref_out.shape, dtype=torch.bfloat16)
        if lse is None:
            lse = torch.empty(ref_lse.shape, dtype=torch.float32)
        out.copy_(ref_out)
        lse.copy_(ref_lse)
        return out, lse


@pytest.fixture
def kernel(monkeypatch):
    fake = FakeKernel()
    monkeypatch.setattr(entry, "planned", fake.planned)
    monkeypatch.setattr(entry, "run_full", fake.run_full)
    return fake


def _bhsd(b, h, s, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h, s, d, generator=g).to(torch.bfloat16)


def _inputs(layout: str, b=2, s=5, sk=7, h=3, seed=0):
    """q, k, v as [B, S, H, D] in one of three memory layouts."""
    q, k, v = _bhsd(b, h, s, 192, seed), _bhsd(b, h, sk, 192, seed + 1), _bhsd(b, h, sk, 128, seed + 2)
    if layout == "bshd":       # contiguous [B, S, H, D]: FlashAttention's
        return tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))
    if layout == "bhsd":       # transposed views of contiguous [B, H, S, D]: transformers'
        return tuple(t.transpose(1, 2) for t in (q, k, v))
    # mixed: q and k as transformers gives them, v a slice of a wider [B, S, H, 256] row (its kv_b_proj)
    wide = torch.randn(b, sk, h, 256).to(torch.bfloat16)
    return q.transpose(1, 2), k.transpose(1, 2), wide[..., 128:]


def _packed(q, k, v, causal, scale=None):
    b = q.shape[0]
    cu_q = torch.arange(b + 1, dtype=torch.int32) * q.shape[1]
    cu_k = torch.arange(b + 1, dtype=torch.int32) * k.shape[1]
    flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
    return reference(*flat, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal, softmax_scale=scale,
                     dtype=torch.float32)


# --- layouts -----------------------------------------------------------------------------


@pytest.mark.parametrize("layout,fold", [("bshd", "tokens"), ("bhsd", "heads"), ("mixed", "batch")])
def test_a_batched_call_picks_the_fold_its_strides_allow_and_copies_nothing(kernel, layout, fold):
    import mlagen

    q, k, v = _inputs(layout)
    assert layouts.choose_fold((q, k, v)) == fold
    out, lse = mlagen.mla_prefill(q, k, v, causal=True)
    assert out.shape == (2, 5, 3, 128) and lse.shape == (2, 5, 3)
    assert len(kernel.calls) == (2 if fold == "batch" else 1)
    for call in kernel.calls:   # the kernel reads the caller's memory: views, not copies
        for name, t in (("q", q), ("k", k), ("v", v)):
            assert _storage(call[name]) == _storage(t), name
        assert _storage(call["out"]) == _storage(out) and _storage(call["lse"]) == _storage(lse)
    if fold == "heads":
        assert kernel.calls[0]["q"].shape == (5, 6, 192) and kernel.calls[0]["cu_seqlens_q"] is None
    if fold == "tokens":
        assert kernel.calls[0]["q"].shape == (10, 3, 192)
        assert kernel.calls[0]["cu_seqlens_q"].tolist() == [0, 5, 10]
        assert kernel.calls[0]["cu_seqlens_k"].tolist() == [0, 7, 14]
    ref_out, ref_lse = _packed(q, k, v, causal=True)
    torch.testing.assert_close(out.float().reshape(10, 3, 128), ref_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.reshape(10, 3), ref_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout,allowed", [("bshd", ("tokens", "batch")), ("bhsd", ("heads", "batch")),
                                            ("mixed", ("batch",))])
def test_every_fold_the_strides_allow_gives_the_same_result(kernel, layout, allowed):
    import mlagen

    q, k, v = _inputs(layout)
    assert layouts.allowed_folds((q, k, v)) == allowed
    want_out, want_lse = mlagen.mla_prefill(q, k, v, causal=False)
    for fold in allowed:
        out, lse = layouts.dense_batched(mlagen.mla_prefill, False, q, k, v, causal=False, fold=fold)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), fold


def test_a_fold_the_strides_do_not_allow_is_refused(kernel):
    import mlagen

    q, k, v = _inputs("bhsd")
    with pytest.raises(ValueError, match="fold: 'tokens' does not fit these tensors' strides \\(they allow heads, batch\\)"):
        layouts.dense_batched(mlagen.mla_prefill, False, q, k, v, fold="tokens")


def test_a_shared_k_rope_rules_out_the_heads_fold(kernel):
    import mlagen

    q, k, v = _inputs("bhsd")
    k_rope = torch.randn(2, 7, 1, 64).to(torch.bfloat16)
    nope = k[..., :128]
    assert layouts.choose_fold((q, nope, v, k_rope)) == "batch"
    out, _ = mlagen.mla_prefill(q, nope, v, k_rope=k_rope)
    assert len(kernel.calls) == 2 and kernel.calls[0]["k_rope"].shape == (7, 1, 64)
    full = torch.cat([nope, k_rope.expand(-1, -1, 3, -1)], dim=-1)
    ref_out, _ = _packed(q, full, v, causal=True)
    torch.testing.assert_close(out.float().reshape(10, 3, 128), ref_out, atol=1e-2, rtol=1e-2)


def test_batched_cu_seqlens_are_made_once(kernel):
    import mlagen

    q, k, v = _inputs("bshd")
    mlagen.mla_prefill(q, k, v)
    mlagen.mla_prefill(q, k, v)
    assert kernel.calls[0]["cu_seqlens_q"] is kernel.calls[1]["cu_seqlens_q"]


def test_batched_outputs_given_are_written_in_place(kernel):
    import mlagen

    q, k, v = _inputs("bhsd")
    out = torch.empty(2, 5, 3, 128, dtype=torch.bfloat16)
    lse = torch.empty(2, 5, 3)
    got_out, got_lse = mlagen.mla_prefill(q, k, v, out=out, lse=lse)
    assert got_out is out and got_lse is lse
    ref_out, _ = _packed(q, k, v, causal=True)
    torch.testing.assert_close(out.float().reshape(10, 3, 128), ref_out, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("change,match", [
    (dict(cu_seqlens_q=torch.tensor([0, 5], dtype=torch.int32)), "cu_seqlens_q: batched"),
    (dict(k="3d"), "k: q is batched"),
    (dict(v="batch1"), "v: has batch 1, q has 2"),
    (dict(lse=torch.empty(2, 3, 5, 1)), "lse: q is batched"),
])
def test_bad_batched_arguments_name_the_argument(kernel, change, match):
    import mlagen

    q, k, v = _inputs("bshd")
    args = dict(k=k, v=v)
    if change.get("k") == "3d":
        args["k"] = k[0]
    elif change.get("v") == "batch1":
        args["v"] = v[:1]
    else:
        args.update(change)
    with pytest.raises(ValueError, match=match):
        mlagen.mla_prefill(q, **args)


def test_a_sparse_batch_folds_into_tokens_or_goes_per_sequence(monkeypatch):
    import mlagen
    from mlagen.families.mla_sparse_prefill import op as sparse_op

    calls = []

    def fake_run(q, kv, indices, *, out=None, max_logits=None, lse=None, topk_length=None, **rest):
        calls.append((q, indices, topk_length))
        rows = kv.float()[indices.clamp(min=0).long()]                      # [Sq, topk, 576]
        s = torch.einsum("shd,skd->shk", q.float(), rows) * rest["softmax_scale"]
        if out is None:
            out, max_logits, lse = (torch.empty(q.shape[0], q.shape[1], *d, dtype=t)
                                    for d, t in (((512,), torch.bfloat16), ((), torch.float32), ((), torch.float32)))
        out.copy_(torch.einsum("shk,skd->shd", s.softmax(-1), rows[..., :512]))
        lse.copy_(s.logsumexp(-1))
        max_logits.copy_(s.amax(-1))
        return out, max_logits, lse

    monkeypatch.setattr(sparse_op, "run", fake_run)
    kv = torch.randn(40, 576).to(torch.bfloat16)
    q = torch.randn(2, 3, 4, 576).to(torch.bfloat16)
    indices = torch.randint(0, 40, (2, 3, 8), dtype=torch.int32)
    out, ml, lse = mlagen.mla_sparse_prefill(q, kv, indices, softmax_scale=0.05)
    assert out.shape == (2, 3, 4, 512) and ml.shape == lse.shape == (2, 3, 4)
    assert len(calls) == 1 and calls[0][0].shape == (6, 4, 576) and _storage(calls[0][0]) == _storage(q)
    want = [mlagen.mla_sparse_prefill(q[b], kv, indices[b], softmax_scale=0.05) for b in range(2)]
    torch.testing.assert_close(out, torch.stack([w[0] for w in want]))
    torch.testing.assert_close(lse, torch.stack([w[2] for w in want]))
    calls.clear()
    qt = torch.randn(2, 4, 3, 576).to(torch.bfloat16).transpose(1, 2)   # not foldable into tokens
    mlagen.mla_sparse_prefill(qt, kv, indices, softmax_scale=0.05)
    assert len(calls) == 2 and all(_storage(c[0]) == _storage(qt) for c in calls)


# --- FlashAttention's calls ---------------------------------------------------------------


def _varlen_inputs(lens_q=(3, 6), lens_k=(5, 6), h=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, h, 192, generator=g).to(torch.bfloat16)
    k = torch.randn(tk, h, 192, generator=g).to(torch.bfloat16)
    v = torch.randn(tk, h, 128, generator=g).to(torch.bfloat16)
    cu_q, cu_k = (torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32) for lens in (lens_q, lens_k))
    return q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)


def _fa_reference(q, k, v, lens_q, lens_k, causal, scale):
    """Attention per FlashAttention's documentation: scores q.k * scale (default 1/sqrt(headdim)),
    causal aligned to the bottom-right corner; lse the natural-log logsumexp, [H, total_q]."""
    outs, lses, qs, ks = [], [], 0, 0
    for lq, lk in zip(lens_q, lens_k):
        s = torch.einsum("qhd,khd->hqk", q[qs:qs + lq].double(), k[ks:ks + lk].double()) * scale
        if causal:
            i = torch.arange(lq).unsqueeze(1)
            j = torch.arange(lk).unsqueeze(0)
            s = s.masked_fill(j > i + lk - lq, -math.inf)
        lses.append(s.logsumexp(-1))
        outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), v[ks:ks + lk].double()))
        qs, ks = qs + lq, ks + lk
    return torch.cat(outs), torch.cat(lses, dim=1)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_varlen_func_follows_flash_attentions_conventions(kernel, causal):
    import mlagen

    q, k, v, cu_q, cu_k, mq, mk = _varlen_inputs()
    out, lse = mlagen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal, return_softmax_lse=True)
    assert kernel.calls[-1]["softmax_scale"] == pytest.approx(192 ** -0.5)
    assert out.shape == (9, 2, 128) and lse.shape == (2, 9) and lse.is_contiguous() and lse.dtype == torch.float32
    ref_out, ref_lse = _fa_reference(q, k, v, (3, 6), (5, 6), causal, 192 ** -0.5)
    torch.testing.assert_close(out.double(), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-4, rtol=1e-4)
    plain = mlagen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    assert isinstance(plain, torch.Tensor)
    three = mlagen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal, return_attn_probs=True)
    assert len(three) == 3 and three[2] is None and torch.equal(three[1], lse)


def test_flash_attn_func_returns_flash_attentions_layouts(kernel):
    import mlagen

    q, k, v = _inputs("bshd", b=2, s=4, sk=6, h=3)
    out, lse = mlagen.flash_attn_func(q, k, v, causal=True, softmax_scale=0.1, return_softmax_lse=True)
    assert out.shape == (2, 4, 3, 128) and lse.shape == (2, 3, 4) and lse.is_contiguous()
    flat = [t.reshape(-1, *t.shape[2:]) for t in (q, k, v)]
    ref_out, ref_lse = _fa_reference(*flat, (4, 4), (6, 6), True, 0.1)
    torch.testing.assert_close(out.double().reshape(8, 3, 128), ref_out, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), ref_lse.reshape(3, 2, 4).transpose(0, 1), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("window,causal,want,passed", [
    ((-1, -1), False, False, (-1, -1)), ((-1, -1), True, True, (-1, -1)), ((-1, 0), False, True, (-1, -1)),
    ((6, -1), False, False, (-1, -1)), ((100, 100), True, True, (-1, -1)), ((-1, 3), True, True, (-1, -1)),
    ((2, 0), False, False, (2, 0)), ((2, 5), True, False, (2, 0)), ((3, 1), False, False, (3, 1))])
def test_flash_attn_window_sizes_follow_flash_attentions_rules(kernel, window, causal, want, passed):
    import mlagen

    q, k, v, cu_q, cu_k, mq, mk = _varlen_inputs()
    mlagen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=causal, window_size=window)
    assert kernel.calls[-1]["causal"] is want and kernel.calls[-1]["window_size"] == passed


def test_flash_attn_passes_softcap_and_windows_through(kernel):
    import mlagen

    q, k, v, cu_q, cu_k, mq, mk = _varlen_inputs()
    out = mlagen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, window_size=(1, 0), softcap=5.0)
    call = kernel.calls[-1]
    assert call["softcap"] == 5.0 and call["window_size"] == (1, 0)
    plain = mlagen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    assert not torch.equal(out, plain)   # the window and the cap changed the result
    with pytest.raises(ValueError, match="flash_attn_varlen_func: window_size:"):
        mlagen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, window_size=(-2, 0))
    with pytest.raises(ValueError, match="flash_attn_varlen_func: softcap:"):
        mlagen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, softcap=-1.0)


@pytest.mark.parametrize("change,arg", [
    (dict(dropout_p=0.1), "dropout_p"), (dict(alibi_slopes=torch.zeros(2)), "alibi_slopes"),
    (dict(block_table=torch.zeros(2, 1, dtype=torch.int32)), "block_table"),
    (dict(seqused_k=torch.zeros(2, dtype=torch.int32)), "seqused_k"),
    (dict(return_softmax_lse=True, return_attn_probs=True), "return_attn_probs"),
])
def test_flash_attn_arguments_mlagen_cannot_honour_raise_naming_them(kernel, change, arg):
    import mlagen

    q, k, v, cu_q, cu_k, mq, mk = _varlen_inputs()
    with pytest.raises(ValueError, match=f"flash_attn_varlen_func: {arg}:"):
        mlagen.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, **change)
    assert not kernel.calls


def test_flash_attn_grouped_query_heads_raise_naming_k(kernel):
    import mlagen

    q, k, v = _inputs("bshd")
    with pytest.raises(ValueError, match="flash_attn_func: k: has 1 heads"):
        mlagen.flash_attn_func(q, k[:, :, :1], v[:, :, :1])


def test_flash_attn_vllm_keywords_are_accepted(kernel):
    import mlagen

    q, k, v, cu_q, cu_k, mq, mk = _varlen_inputs()
    out = torch.empty(9, 2, 128, dtype=torch.bfloat16)
    got = mlagen.flash_attn_varlen_func(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq,
                                        max_seqlen_k=mk, softmax_scale=0.07, causal=True, out=out, fa_version=3,
                                        num_splits=1, scheduler_metadata=None)
    assert got is out and kernel.calls[-1]["softmax_scale"] == 0.07


# --- transformers -------------------------------------------------------------------------


def tiny_deepseek(heads: int, attn: str, dtype, device="cpu", hidden: int = 64, vocab: int = 128, rank: int = 32,
                  positions: int = 64):
    """A random-weight DeepseekV3ForCausalLM with MLA's head geometry (also tests/gpu's)."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install "
                                                              "'mlagen[transformers]')")
    import mlagen.integrations.transformers  # noqa: F401 (registers "mlagen")

    config = transformers.DeepseekV3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden, moe_intermediate_size=hidden // 4,
        num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=heads, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
        q_lora_rank=rank, kv_lora_rank=rank, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        max_position_embeddings=positions)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM._from_config(config, attn_implementation=attn, dtype=torch.float32)
    return model.to(device=device, dtype=dtype).eval()


@pytest.fixture
def hf():
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'mlagen[transformers]')")
    import mlagen.integrations.transformers as integration

    return integration


def test_importing_the_integration_registers_mlagen(hf):
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    assert AttentionInterface()["mlagen"] is hf.mlagen_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["mlagen"] is hf.mlagen_mask


@pytest.mark.parametrize("heads", [8, 64])   # DeepSeek-V3-like (128 heads, here fewer) and Kimi-K2 (64)
def test_a_deepseek_v3_model_runs_on_mlagen_as_on_eager(hf, kernel, monkeypatch, heads):
    """Logits of the bf16 model through "mlagen" are as close to the float32 eager model's as
    SDPA's; the kernel is handed the model's own q / k / v memory."""
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = tiny_deepseek(heads, "eager", torch.float32)(ids).logits
        sdpa = tiny_deepseek(heads, "sdpa", torch.bfloat16)(ids).logits.float()
        handed = []
        real = hf.mla_prefill

        def spy(q, k, v, **kw):
            handed.append({_storage(t) for t in (q, k, v)})
            return real(q, k, v, **kw)

        monkeypatch.setattr(hf, "mla_prefill", spy)
        got = tiny_deepseek(heads, "mlagen", torch.bfloat16)(ids).logits.float()
    assert len(handed) == 2 and len(kernel.calls) == 2 * 2    # 2 layers; per sequence (v's strides: see layouts)
    for storages, call in zip(handed, kernel.calls[::2]):
        assert {_storage(call[n]) for n in ("q", "k", "v")} <= storages
    err, sdpa_err = (got - ref).abs().max().item(), (sdpa - ref).abs().max().item()
    assert err <= 1.5 * sdpa_err + 1e-3, (err, sdpa_err)


def test_padding_is_unpadded_to_packed_sequences(hf, kernel):
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :3] = 0   # left padding of the second sequence
    with torch.no_grad():
        ref = tiny_deepseek(8, "eager", torch.float32)(ids, attention_mask=mask).logits
        got = tiny_deepseek(8, "mlagen", torch.bfloat16)(ids, attention_mask=mask).logits.float()
    call = kernel.calls[0]
    assert call["cu_seqlens_q"].tolist() == [0, 8, 13] and call["cu_seqlens_k"].tolist() == [0, 8, 13]
    valid = mask.bool()
    assert (got - ref)[valid].abs().max().item() < 0.1
    assert torch.isfinite(got).all()


def test_the_mask_function_is_flash_attentions_and_refuses_other_masks(hf):
    from transformers.masking_utils import sliding_window_causal_mask_function

    mask = torch.ones(2, 6, dtype=torch.bool)
    assert hf.mlagen_mask(2, 6, 6, attention_mask=mask) is None      # nothing padded: no mask
    mask[0, 0] = False
    assert torch.equal(hf.mlagen_mask(2, 6, 6, attention_mask=mask), mask)
    with pytest.raises(ValueError, match="a mask other than causal"):
        hf.mlagen_mask(2, 6, 6, mask_function=sliding_window_causal_mask_function(4))


def test_the_attention_function_refuses_dropout_and_prepared_masks(hf, kernel):
    q = _bhsd(1, 2, 4, 192, 0)
    v = _bhsd(1, 2, 4, 128, 1)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="dropout"):
        hf.mlagen_attention_forward(module, q, q, v, None, dropout=0.1)
    with pytest.raises(ValueError, match="attention_mask: expected the"):
        hf.mlagen_attention_forward(module, q, q, v, torch.zeros(1, 1, 4, 4))
    out, weights = hf.mlagen_attention_forward(module, q, q, v, None, scaling=0.2)
    assert out.shape == (1, 4, 2, 128) and weights is None and kernel.calls[-1]["softmax_scale"] == 0.2


# --- torch.ops.mlagen after import mlagen ---------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


OPS = "print(all(hasattr(torch.ops.mlagen, n) for n in ('mla_prefill', 'mla_prefill_out', 'mla_sparse_prefill')))"


@pytest.mark.parametrize("order", ["import torch, mlagen", "import mlagen, torch", "import mlagen.expr, torch"])
def test_torch_ops_resolve_after_importing_mlagen_and_torch_in_any_order(order):
    proc = _python(f"{order}\n{OPS}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


def test_importing_mlagen_alone_does_not_import_torch():
    proc = _python("import sys, mlagen; print('torch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_torch_still_imports_when_mlagens_ops_cannot_register():
    proc = _python("import sys, warnings\nwarnings.simplefilter('always')\nimport mlagen\n"
                   "sys.modules['mlagen.api'] = None\nimport torch\nprint(torch.ones(2).sum().item())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2.0"
    assert "torch.ops.mlagen.* are not registered" in proc.stderr


def test_torchs_module_keeps_its_own_loader():
    proc = _python("import mlagen, torch\nprint(type(torch.__spec__.loader).__module__, "
                   "type(torch.__loader__).__name__)")
    assert proc.returncode == 0, proc.stderr
    assert "mlagen" not in proc.stdout


@pytest.mark.parametrize("argv", [["-m", "mlagen.cli", "--help"],
                                  ["-c", "import sys; sys.argv = ['mlagen', '--help']; from mlagen.cli import main; "
                                         "main()"]])
def test_the_cli_starts_without_importing_torch(argv):
    proc = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")}
    assert "mlagen" in imported and "torch" not in imported


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "mixed"])
def test_traced_batched_calls_equal_eager_ones(kernel, layout):
    """Traced, the functional op allocates and the result is viewed back (no mutated views in
    the graph); torch.compile (fullgraph, aot_eager: no compiler needed) gives the eager result."""
    import mlagen

    q, k, v = _inputs(layout)
    want = mlagen.mla_prefill(q, k, v)
    got = layouts.dense_batched(mlagen.mla_prefill, True, q, k, v)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: mlagen.mla_prefill(q * 1, k, v), fullgraph=True, backend="aot_eager")
    assert all(torch.equal(a, b) for a, b in zip(compiled(q, k, v), want))
