"""GPU-free tests of DeepSeek-V4 on mlagen (mlagen.integrations.deepseek_v4 and the "mlagen"
attention of mlagen.integrations.transformers): the index lists built from a mask and from
positions, and a small random-weight DeepseekV4ForCausalLM (one layer of each type) through
"mlagen" against its own eager attention.

The sparse kernel is replaced by the float64 reference of MLA.md section 2
(mlagen.families.mla_sparse_prefill.reference) behind the entry point the public call reaches,
rounded to bf16 as the kernel's output is, so everything above it runs on CPU tensors. The same
model on the GPU, against the real kernel: tests/gpu/test_transformers_v4_gpu.py.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mlagen.families.mla_sparse_prefill import op as sparse_op  # noqa: E402
from mlagen.families.mla_sparse_prefill.reference import reference  # noqa: E402
from mlagen.integrations import deepseek_v4 as v4  # noqa: E402

LAYERS = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]


class FakeSparse:
    """Stands for the sparse kernel: records its calls and writes the reference's result."""

    def __init__(self):
        self.calls = []

    def run(self, q, kv, indices, *, softmax_scale, topk_length=None, attn_sink=None, out=None, max_logits=None,
            lse=None, **rest):
        assert q.dim() == 3 and q.dtype == torch.bfloat16 and indices.dtype == torch.int32
        self.calls.append(dict(q=q, kv=kv, indices=indices, topk_length=topk_length, attn_sink=attn_sink,
                               softmax_scale=softmax_scale))
        r_out, r_ml, r_lse = reference(q, kv, indices, softmax_scale=softmax_scale, topk_length=topk_length,
                                       attn_sink=attn_sink)
        if out is None:
            out = torch.empty(r_out.shape, dtype=torch.bfloat16)
            max_logits, lse = (torch.empty(r_ml.shape, dtype=torch.float32) for _ in range(2))
        out.copy_(r_out)
        max_logits.copy_(r_ml)
        lse.copy_(r_lse)
        return out, max_logits, lse


@pytest.fixture
def kernel(monkeypatch):
    fake = FakeSparse()
    monkeypatch.setattr(sparse_op, "run", fake.run)
    return fake


def _v4_transformers():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install "
                                                              "'mlagen[transformers]')")
    try:
        import transformers.models.deepseek_v4.modeling_deepseek_v4 as modeling
    except ImportError:
        pytest.skip(f"transformers {transformers.__version__} has no DeepSeek-V4 (it came with 5.17)")
    return transformers, modeling


def tiny_deepseek_v4(heads: int, attn: str, dtype, device="cpu", hidden: int = 64, vocab: int = 128,
                     window: int = 16, hca_rate: int = 8, topk: int = 5, positions: int = 256):
    """A random-weight DeepseekV4ForCausalLM, one layer of each type, V4's head (512 = 448 + 64)
    and a per-head sink drawn at random (the model initialises it to 0). Also tests/gpu's."""
    transformers, _ = _v4_transformers()
    import mlagen.integrations.transformers  # noqa: F401 (registers "mlagen")

    config = transformers.DeepseekV4Config(
        vocab_size=vocab, hidden_size=hidden, moe_intermediate_size=hidden // 2, num_hidden_layers=3,
        num_attention_heads=heads, head_dim=512, q_lora_rank=32, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, layer_types=LAYERS, mlp_layer_types=["moe"] * 3, sliding_window=window,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": hca_rate},
        o_groups=2, o_lora_rank=32, index_n_heads=4, index_head_dim=64, index_topk=topk, hc_mult=2,
        max_position_embeddings=positions)
    torch.manual_seed(0)
    model = transformers.DeepseekV4ForCausalLM._from_config(config, attn_implementation=attn, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0.0, 1.0)
    return model.to(device=device, dtype=dtype).eval()


@pytest.fixture
def hf():
    _v4_transformers()
    import mlagen.integrations.transformers as integration

    return integration


def _rows(pool, t):
    """The rows query t reads from a flat pool, as a sorted list (duplicates kept)."""
    idx = pool.indices.reshape(-1, pool.indices.shape[-1])[t]
    n = idx.shape[0] if pool.length is None else int(pool.length.reshape(-1)[t])
    return sorted(int(i) for i in idx[:n] if i >= 0)


# --- the index lists ----------------------------------------------------------------------------


@pytest.mark.parametrize("width", [0, 1, 3, 9, 12])
def test_compact_lists_each_rows_true_columns_in_order(width):
    g = torch.Generator().manual_seed(0)
    valid = torch.rand(3, 7, 12, generator=g) < 0.4
    valid[0, 0] = False          # a row with nothing
    valid[0, 1] = True           # a full row
    indices, count, overflow = v4.compact(valid, width)
    assert indices.shape == (3, 7, width) and indices.dtype == torch.int32
    for b in range(3):
        for s in range(7):
            want = valid[b, s].nonzero().flatten().tolist()
            assert indices[b, s].tolist() == (want + [-1] * width)[:width]
            assert int(count[b, s]) == min(len(want), width) and bool(overflow[b, s]) == (len(want) > width)


def test_compact_refuses_what_it_cannot_read():
    with pytest.raises(TypeError, match="valid: expected a bool"):
        v4.compact(torch.zeros(2, 3), 2)
    with pytest.raises(ValueError, match="width"):
        v4.compact(torch.zeros(2, 3, dtype=torch.bool), -1)


def test_mask_pool_offsets_each_sequence_into_the_flat_rows():
    kv = torch.randn(2, 5, 512).to(torch.bfloat16)
    bias = torch.full((2, 3, 5), -math.inf)
    bias[0, 0, [1, 3]] = 0
    bias[1, 2, [0, 4]] = 0
    bias[1, 1, :] = torch.finfo(torch.float32).min   # eager's "masked" value
    pool = v4.mask_pool(kv, bias, 4)
    assert pool.kv.shape == (10, 512) and pool.indices.shape == (2, 3, 4)
    assert _rows(pool, 0) == [1, 3] and _rows(pool, 5) == [5, 9] and _rows(pool, 4) == []
    assert torch.equal(pool.kv[7], kv[1, 2])
    with pytest.raises(ValueError, match="bias"):
        v4.mask_pool(kv, bias[:, :, :4], 4)


def test_window_and_compressed_pools_of_packed_sequences():
    """Two sequences, the second with a cached prefix of 6 keys (queries bottom-right aligned)."""
    cu_q = torch.tensor([0, 5, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 15], dtype=torch.int32)
    kv = torch.zeros(15, 512, dtype=torch.bfloat16)
    win = v4.window_pool(kv, cu_q, cu_k, 9, window=3)
    assert [_rows(win, t) for t in range(9)] == [[0], [0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4],
                                                  [9, 10, 11], [10, 11, 12], [11, 12, 13], [12, 13, 14]]
    cu_e = torch.tensor([0, 2, 7], dtype=torch.int32)     # 2 and 5 entries (rate 2: 5 // 2, 10 // 2)
    hca = v4.hca_pool(kv, cu_q, cu_k, cu_e, 9, rate=2, width=5)
    # positions 0..4 see floor((p+1)/2) entries; the second sequence's queries are at 6..9
    assert [_rows(hca, t) for t in range(9)] == [[], [0], [0], [0, 1], [0, 1], [2, 3, 4], [2, 3, 4, 5],
                                                  [2, 3, 4, 5], [2, 3, 4, 5, 6]]
    topk = torch.tensor([[1, -1], [0, 1], [1, 0], [0, 2], [-1, -1], [4, 0], [5, 3], [1, -1], [2, 2]])
    csa = v4.csa_pool(kv, topk, cu_q, cu_e)
    assert [_rows(csa, t) for t in range(9)] == [[1], [0, 1], [0, 1], [0], [], [2, 6], [5], [3], [4, 4]]


def test_one_pool_lists_the_union_of_the_pools_keys():
    cu = torch.tensor([0, 4], dtype=torch.int32)
    raw, comp = torch.randn(4, 512).to(torch.bfloat16), torch.randn(2, 512).to(torch.bfloat16)
    win = v4.window_pool(raw, cu, cu, 4, window=2)
    hca = v4.hca_pool(comp, cu, cu, torch.tensor([0, 2], dtype=torch.int32), 4, rate=2, width=2)
    pool = v4.one_pool(win, hca)
    assert torch.equal(pool.kv, torch.cat([raw, comp]))
    assert [_rows(pool, t) for t in range(4)] == [[0], [0, 1, 4], [1, 2, 4], [2, 3, 4, 5]]
    # valid entries first, so the one-pool call can stop at the length
    assert pool.indices[0].tolist() == [0, -1, -1, -1] and pool.length.tolist() == [1, 3, 3, 4]


def test_attend_over_two_pools_equals_the_concatenated_pool(kernel, monkeypatch):
    g = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    raw, comp = (torch.randn(n, 512, generator=g).to(torch.bfloat16) for n in (6, 3))
    q = torch.randn(6, 4, 512, generator=g).to(torch.bfloat16)
    sink = torch.randn(4, generator=g)
    pools = [v4.window_pool(raw, cu, cu, 6, window=3), v4.hca_pool(comp, cu, cu, torch.tensor([0, 3]), 6, 2, 3)]
    got = v4.attend(q, pools, softmax_scale=0.05, attn_sink=sink)
    rows = torch.cat([raw, comp]).double()
    for t in range(6):
        keys = [i for i in _rows(pools[0], t)] + [6 + i for i in _rows(pools[1], t)]
        s = torch.einsum("hd,kd->hk", q[t].double(), rows[keys]) * 0.05
        m = torch.maximum(s.amax(-1), sink.double())
        p = torch.exp(s - m[:, None])
        want = (p @ rows[keys]) / (p.sum(-1) + torch.exp(sink.double() - m))[:, None]
        torch.testing.assert_close(got[t].double(), want, atol=2e-2, rtol=2e-2)
    # where mla_sparse_prefill takes a second pool (extra_kv), attend hands both over as they are
    seen = []

    def two_pool(q, kv, indices, *, topk_length=None, extra_kv=None, extra_indices=None, extra_topk_length=None,
                 attn_sink=None, softmax_scale=None):
        seen.append((kv, extra_kv))
        return torch.zeros(q.shape[0], q.shape[1], 512, dtype=torch.bfloat16), None, None

    monkeypatch.setattr(sparse_op, "mla_sparse_prefill", two_pool)
    v4.attend(q, pools, softmax_scale=0.05, attn_sink=sink)
    assert seen[0][0] is raw and seen[0][1] is comp


# --- transformers ---------------------------------------------------------------------------------


def test_the_mask_function_gives_v4_its_additive_mask_and_still_refuses_windows_elsewhere(hf):
    from transformers import DeepseekV4Config
    from transformers.masking_utils import sliding_window_causal_mask_function

    config = DeepseekV4Config(num_hidden_layers=3, layer_types=LAYERS, mlp_layer_types=["moe"] * 3)
    mask = hf.mlagen_mask(1, 6, 6, mask_function=sliding_window_causal_mask_function(3), config=config,
                          dtype=torch.bfloat16)
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == torch.bfloat16
    assert ((mask[0, 0] == 0).sum(-1)).tolist() == [1, 2, 3, 3, 3, 3]
    with pytest.raises(ValueError, match="a mask other than causal"):
        hf.mlagen_mask(1, 6, 6, mask_function=sliding_window_causal_mask_function(3))


def _capture(model, modeling, monkeypatch):
    """Each layer's attention call of an eager model: (module, q, kv, mask, kwargs), and the CSA
    indexer's choices."""
    calls, choices = [], []
    real = modeling.eager_attention_forward

    def spy(module, q, k, v, mask, **kw):
        calls.append((module, q, k, mask, kw))
        return real(module, q, k, v, mask, **kw)

    monkeypatch.setattr(modeling, "eager_attention_forward", spy)
    for layer in model.model.layers:
        if layer.self_attn.layer_type == "compressed_sparse_attention":
            layer.self_attn.compressor.indexer.register_forward_hook(lambda m, a, out: choices.append(out))
    return calls, choices


def test_the_mask_lists_are_the_window_and_compressed_pools_of_the_layer(hf, monkeypatch):
    """From the eager model's own call: the keys :func:`mask_pool` lists per query are those the
    position-built pools list (window, HCA entries, the indexer's CSA choice), for every layer."""
    _, modeling = _v4_transformers()
    model = tiny_deepseek_v4(4, "eager", torch.float32)
    calls, choices = _capture(model, modeling, monkeypatch)
    sq = 40
    with torch.no_grad():
        model(torch.randint(0, 128, (1, sq), generator=torch.Generator().manual_seed(1)), use_cache=False)
    assert [c[0].layer_type for c in calls] == LAYERS and len(choices) == 1
    cu = torch.tensor([0, sq], dtype=torch.int32)
    for module, q, kv, mask, kw in calls:
        keys = kv.shape[2]
        pool = v4.mask_pool(kv[:, 0].to(torch.bfloat16), mask[:, 0], hf._v4_width(module, sq, keys, 16))
        win = v4.window_pool(kv[0, 0, :sq], cu, cu, sq, window=16)
        entries = torch.tensor([0, keys - sq], dtype=torch.int32)
        if module.layer_type == "sliding_attention":
            extra = None
        elif module.layer_type == "heavily_compressed_attention":
            extra = v4.hca_pool(kv[0, 0, sq:], cu, cu, entries, sq, rate=8, width=keys - sq)
        else:
            extra = v4.csa_pool(kv[0, 0, sq:], choices[0][0], cu, entries)
        assert pool.overflow.sum() == 0
        for t in range(sq):
            want = _rows(win, t) + ([] if extra is None else [sq + i for i in _rows(extra, t)])
            assert _rows(pool, t) == sorted(want), (module.layer_type, t)


@pytest.mark.parametrize("heads", [4, 64])
def test_a_deepseek_v4_model_runs_on_mlagen_as_on_eager(hf, kernel, heads):
    """Logits of the bf16 model through "mlagen" are as close to the float32 eager model's as the
    bf16 eager model's are (V4 has no SDPA); each layer is one sparse call per sequence, over the
    model's own KV rows, with the sink."""
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = tiny_deepseek_v4(heads, "eager", torch.float32)(ids, use_cache=False).logits
        bf16 = tiny_deepseek_v4(heads, "eager", torch.bfloat16)(ids, use_cache=False).logits.float()
        model = tiny_deepseek_v4(heads, "mlagen", torch.bfloat16)
        got = model(ids, use_cache=False).logits.float()
    assert len(kernel.calls) == 3 * 2
    widths = [c["indices"].shape[1] for c in kernel.calls[::2]]
    assert widths == [16, 16 + 5, 16 + 40 // 8]          # window, + top-k, + the HCA entries
    sinks = [layer.self_attn.sinks.float() for layer in model.model.layers]
    for call, sink in zip(kernel.calls[::2], sinks):
        torch.testing.assert_close(call["attn_sink"], sink)
        assert call["softmax_scale"] == 512 ** -0.5
    err, bf16_err = (got - ref).abs().max().item(), (bf16 - ref).abs().max().item()
    assert err <= 1.5 * bf16_err + 1e-3, (err, bf16_err)


def test_deepseek_v4_padding_and_decoding_with_a_cache(hf, kernel):
    """Left padding (rows masked in the window) and a cached prefill then two decoded tokens: the
    logits on valid positions match the float32 eager model's to bf16 accuracy."""
    ids = torch.randint(0, 128, (2, 36), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 36, dtype=torch.long)
    mask[1, :5] = 0
    eager = tiny_deepseek_v4(4, "eager", torch.float32)
    ours = tiny_deepseek_v4(4, "mlagen", torch.bfloat16)
    with torch.no_grad():
        ref = eager(ids, attention_mask=mask, use_cache=False).logits
        got = ours(ids, attention_mask=mask, use_cache=False).logits.float()
        valid = mask.bool()
        scale = ref[valid].abs().max().item()
        assert (got - ref)[valid].abs().max().item() < 0.05 * scale
        assert torch.isfinite(got).all()
        # prefill 34 tokens into a cache, then decode 2 one at a time
        one = ids[:1]
        e_cache, o_cache = (_cache(m(one[:, :34])) for m in (eager, ours))
        for t in (34, 35):
            e_step = eager(one[:, t:t + 1], past_key_values=e_cache)
            o_step = ours(one[:, t:t + 1], past_key_values=o_cache)
            err = (o_step.logits.float() - e_step.logits).abs().max().item()
            assert err < 0.05 * e_step.logits.abs().max().item(), (t, err)


def _cache(output):
    """The cache a forward returned (transformers renamed past_key_values to cache after 5.17)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def test_a_prepared_mask_wider_than_the_layer_allows_gives_nan_rows(hf, kernel):
    module = torch.nn.Module()
    module.layer_type, module.sliding_window = "sliding_attention", 2
    q = torch.randn(1, 2, 3, 512).to(torch.bfloat16)
    kv = torch.randn(1, 1, 3, 512).to(torch.bfloat16)
    mask = torch.zeros(1, 1, 3, 3)
    mask[0, 0, 0, 1:] = -math.inf          # row 0 sees 1 key, rows 1 and 2 see 3 > the window
    mask[0, 0, 1, 2] = -math.inf           # row 1 sees 2
    out, weights = hf.mlagen_attention_forward(module, q, kv, kv, mask, scaling=0.1, s_aux=torch.zeros(2),
                                               sliding_window=2)
    assert weights is None and out.shape == (1, 3, 2, 512)
    assert torch.isfinite(out[0, :2]).all() and torch.isnan(out[0, 2]).all()


def test_the_v4_attention_function_refuses_what_it_cannot_honour(hf, kernel):
    module = torch.nn.Module()
    q = torch.randn(1, 2, 3, 512).to(torch.bfloat16)
    kv = torch.randn(1, 1, 3, 512).to(torch.bfloat16)
    mask = torch.zeros(1, 1, 3, 3)
    with pytest.raises(TypeError, match="query: expected bf16"):
        hf.mlagen_attention_forward(module, q.float(), kv.float(), kv.float(), mask)
    with pytest.raises(ValueError, match="attention_mask: expected the additive"):
        hf.mlagen_attention_forward(module, q, kv, kv, None)
    with pytest.raises(ValueError, match="attention_mask: expected shape"):
        hf.mlagen_attention_forward(module, q, kv, kv, torch.zeros(1, 1, 3, 4))
    with pytest.raises(ValueError, match="key: expected one KV head"):
        hf.mlagen_attention_forward(module, q, q, q, mask)
    with pytest.raises(ValueError, match="value: must be the key"):
        hf.mlagen_attention_forward(module, q, kv, kv.clone(), mask)
