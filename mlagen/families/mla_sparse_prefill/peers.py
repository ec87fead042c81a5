"""Sparse MLA prefill's bench peers (``mlagen bench``; ``../shared/BENCHMARKS.md``).

Every peer runs the same problem on the same inputs (:func:`make_inputs`: fresh ``randn`` q and
kv [s_kv, 1, d_qk], indices [Sq, 1, topk] a uniform choice without repetition, the sink on):

* ``flashmla``: FlashMLA's SM90 sparse prefill (``flash_mla_sparse_fwd``), built from
  ``<peers>/flashmla`` (see :data:`FLASHMLA`). Its kernel takes 64 or 128 heads and topk a
  multiple of 128: other problems are padded once, before timing, as serving stacks pad them
  (q with zero heads, 16 to 64 at TP8; indices with -1, which are invalid entries), and the
  padded heads' outputs are dropped. The strongest sparse peer: the first column.
* ``naive``: PyTorch gather + matmul (:func:`naive`), what a model falls back to without a kernel.
* ``mlagen``: the public call exactly as a user writes it, ``mlagen.mla_sparse_prefill(q, kv,
  indices, softmax_scale=..., attn_sink=...)`` (plus ``kv_format=`` for a shape
  with a quantized cache): default arguments, the dispatched kernel;
  ``mlagen:<spec>`` forces one kernel spec, ``mlagen:<kernel symbol>`` one variant.

Checked calls return (out, max_logits, lse), what the family's ``compare`` takes.
"""

from __future__ import annotations

import math

from ...errors import BenchError
from ...peers import ExternalBuild
from ..base import Peer, Prepared

FLASHMLA = ExternalBuild("flashmla", "flashmla_sparse_peer", "flashmla_sparse_sm90_C.so", "FLASHMLA_PEER_SO",
                         "FLASHMLA_PEER_BUILD", "FlashMLA",
                         "build it on the GPU machine with: bash <peers>/flashmla/run_remote.sh (about 1 minute)")
FLASHMLA_HEADS = (64, 128)   # head counts FlashMLA's SM90 sparse kernel takes
FLASHMLA_TOPK = 128          # topk must be a multiple of this


def flashmla_padding(heads: int, topk: int) -> tuple[int, int]:
    """(heads, topk) FlashMLA runs a problem with: the next head count it takes, topk rounded up
    to a multiple of 128.

    Raises:
        BenchError: for more heads than it takes.
    """
    fit = [h for h in FLASHMLA_HEADS if h >= heads]
    if not fit:
        raise BenchError(f"FlashMLA's SM90 kernel takes at most {FLASHMLA_HEADS[-1]} heads, the shape has {heads}")
    return fit[0], -(-topk // FLASHMLA_TOPK) * FLASHMLA_TOPK


def _one_pool(inputs: dict) -> tuple[dict, str]:
    """A two-pool shape's inputs as one pool (v4.server_concat, built once, before timing), with
    the report's note; other inputs as they are."""
    if "extra_kv" not in inputs:
        return inputs, ""
    from .v4 import one_pool_inputs

    return one_pool_inputs(inputs), ("on one pool: the window's raw rows and the compressed rows concatenated once, "
                                     "before timing (flashmla-concat times the concatenation too)")


def flashmla_peer(shape, inputs: dict, arg: str | None = None, *, sparse_fwd=None, concat: bool = False) -> Prepared:
    """FlashMLA's ``flash_mla_sparse_fwd`` on the same inputs, padded where its kernel needs it
    (before timing: the padded copies are made once, as a serving stack keeps them). A two-pool
    (DeepSeek-V4) shape runs on the concatenated pool: built once before timing, or with
    ``concat`` (the ``flashmla-concat`` peer) by every timed call, as a server without a
    two-pool kernel builds it per layer and step. ``sparse_fwd`` stands in for the built library
    (tests)."""
    import torch

    fwd = sparse_fwd if sparse_fwd is not None else FLASHMLA.load().sparse_fwd
    two = inputs
    if concat and "extra_kv" not in inputs:
        raise BenchError("flashmla-concat is for two-pool (DeepSeek-V4 CSA / HCA) shapes: this one has one pool")
    inputs, pool_note = _one_pool(inputs)
    q, kv, indices = inputs["q"], inputs["kv"], inputs["indices"]
    sink, length, scale = inputs.get("attn_sink"), inputs.get("topk_length"), inputs["softmax_scale"]
    sq, heads, d_qk = q.shape
    kv = kv.reshape(-1, 1, d_qk)                  # FlashMLA's [s_kv, 1, d_qk]
    indices = indices.reshape(sq, 1, -1)          # and [Sq, 1, topk]
    topk = indices.shape[-1]
    padded_heads, padded_topk = flashmla_padding(heads, topk)
    notes = []
    if padded_heads != heads:
        q_pad = q.new_zeros((sq, padded_heads, d_qk))
        q_pad[:, :heads] = q
        q = q_pad
        if sink is not None:
            sink_pad = sink.new_zeros((padded_heads,))
            sink_pad[:heads] = sink
            sink = sink_pad
        notes.append(f"q zero-padded to {padded_heads} heads (from {heads}) once, before timing, as serving "
                     f"stacks pad for FlashMLA's SM90 kernel (64 or 128 heads); the {padded_heads - heads} padded "
                     "heads are computed and dropped")
    if padded_topk != topk:
        idx_pad = torch.full((sq, 1, padded_topk), -1, dtype=indices.dtype, device=indices.device)
        idx_pad[..., :topk] = indices
        indices = idx_pad
        notes.append(f"indices padded with -1 (invalid entries) from topk {topk} to {padded_topk} (a multiple "
                     f"of {FLASHMLA_TOPK}, which FlashMLA needs)")

    if pool_note:
        notes.insert(0, pool_note)

    def plain():
        return fwd(q, kv, indices, scale, 512, sink, length)

    fn = plain
    if concat:
        from .v4 import server_concat

        if padded_topk != topk:
            raise BenchError(f"flashmla-concat: the concatenated lists have {topk} entries, not a multiple of "
                             f"{FLASHMLA_TOPK} (FlashMLA's rule); pick window + topk that is")

        notes[0] = ("every call concatenates first (v4.server_concat: the window's raw rows gathered, the compressed "
                    "rows after them, the index lists rewritten), then runs FlashMLA on the result")

        def concatenating():
            kv_cat, idx_cat = server_concat(two)
            return fwd(q, kv_cat.unsqueeze(1), idx_cat.unsqueeze(1), scale, 512, sink, length)

        fn = concatenating

    def checked_call():
        out, max_logits, lse = fn()
        return out[:, :heads], max_logits[:, :heads], lse[:, :heads]

    return Prepared(fn, checked_call, "; ".join(notes))


def flashmla_concat_peer(shape, inputs: dict, arg: str | None = None, *, sparse_fwd=None) -> Prepared:
    return flashmla_peer(shape, inputs, arg, sparse_fwd=sparse_fwd, concat=True)


def naive(q, kv, indices, softmax_scale: float, attn_sink=None, topk_length=None, chunk: int = 128):
    """MLA.md section 2 as PyTorch gather + matmul, ``chunk`` query tokens at a time (bf16
    matmuls with fp32 accumulation, scores kept in fp32, fp32 softmax): the selected rows are gathered into a
    [chunk, topk, d_qk] tensor, scored, softmaxed and multiplied. Invalid entries are masked, a
    row with none gives out 0, max_logits -inf, lse +inf. Returns (out, max_logits, lse)."""
    import torch

    rows = kv.reshape(-1, kv.shape[-1])
    n = rows.shape[0]
    idx = indices.reshape(indices.shape[0], -1)
    sq, heads, _ = q.shape
    topk = idx.shape[1]
    out = torch.empty((sq, heads, 512), dtype=torch.bfloat16, device=q.device)
    max_logits = torch.empty((sq, heads), dtype=torch.float32, device=q.device)
    lse = torch.empty((sq, heads), dtype=torch.float32, device=q.device)
    pos = torch.arange(topk, device=q.device)
    for t0 in range(0, sq, chunk):
        t1 = min(sq, t0 + chunk)
        i = idx[t0:t1].long()
        valid = (i >= 0) & (i < n)
        if topk_length is not None:
            valid &= pos < topk_length[t0:t1, None]
        g = rows[i.clamp(0, max(n - 1, 0))]                                     # [c, topk, d_qk]
        s = _scores(q[t0:t1], g) * softmax_scale                              # [c, heads, topk]
        s.masked_fill_(~valid[:, None, :], -math.inf)
        m = s.amax(-1, keepdim=True)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m_safe)
        total = p.sum(-1, keepdim=True)
        den = total if attn_sink is None else total + torch.exp(attn_sink.view(1, -1, 1) - m_safe)
        o = torch.matmul((p / den).to(torch.bfloat16), g[..., :512])
        out[t0:t1] = o.masked_fill(total == 0, 0)          # 0 / 0 in rows with no valid entry
        max_logits[t0:t1] = m[..., 0]
        lse[t0:t1] = torch.where(total > 0, m_safe + torch.log(total), math.inf)[..., 0]
    return out, max_logits, lse


def _scores(q, g):
    """q [c, H, d] @ g [c, k, d]^T in fp32: bf16 operands on the tensor cores where torch can write
    fp32 results (``bmm`` with ``out_dtype`` on CUDA), else an fp32 matmul. Scores rounded to
    bf16 would put max_logits and lse off by up to 2^-9 of their value, at the check's tolerance."""
    import torch

    if q.is_cuda:
        try:
            return torch.bmm(q, g.transpose(1, 2), out_dtype=torch.float32)
        except (TypeError, RuntimeError, NotImplementedError):
            pass
    return torch.matmul(q.float(), g.float().transpose(1, 2))


def naive_peer(shape, inputs: dict, arg: str | None = None) -> Prepared:
    """:func:`naive` on the inputs as they are (a two-pool shape's on the concatenated pool)."""
    inputs, _ = _one_pool(inputs)

    def fn():
        return naive(inputs["q"], inputs["kv"], inputs["indices"], inputs["softmax_scale"], inputs.get("attn_sink"),
                     inputs.get("topk_length"))

    return Prepared(fn, fn, "PyTorch gather + matmul, 128 query tokens per step (bf16 operands, fp32 scores and "
                            "softmax)")


def mlagen_peer(shape, inputs: dict, arg=None) -> Prepared:
    """Our kernel through the public API, called exactly as a user writes it (every argument
    the inputs do not set at its default); ``arg`` forces a spec (``mlagen:<spec>``), one variant
    (``mlagen:<kernel symbol>``) or, from Python, a Variant. The checked call poisons all three
    outputs with NaN so an element the kernel never writes shows up."""
    from ... import dispatch
    from . import FAMILY
    from .call import prepare
    from .entry import select
    from .op import mla_sparse_prefill

    if isinstance(arg, str):
        arg = dispatch.kernel_choice("mla_sparse_prefill", arg)

    q, kv, indices = inputs["q"], inputs["kv"], inputs["indices"]
    kwargs = {"softmax_scale": inputs["softmax_scale"], "attn_sink": inputs.get("attn_sink")}
    for name in ("topk_length", "extra_kv", "extra_indices", "extra_topk_length"):   # the second pool's, as given
        if inputs.get(name) is not None:
            kwargs[name] = inputs[name]
    # A quantized cache's format, as a user passes it.
    if inputs.get("kv_format", "bf16") != "bf16":
        kwargs["kv_format"] = inputs["kv_format"]
    extra = {} if arg is None else {"kernel": arg}

    def fn():
        return mla_sparse_prefill(q, kv, indices, **kwargs, **extra)

    def checked_call():
        out, max_logits, lse = FAMILY.make_outputs(shape, q.device)
        got = mla_sparse_prefill(q, kv, indices, out=out, max_logits=max_logits, lse=lse, **kwargs, **extra)
        if any(a.data_ptr() != b.data_ptr() for a, b in zip(got, (out, max_logits, lse))):
            raise BenchError("mla_sparse_prefill returned new tensors instead of the out= / max_logits= / lse= "
                             "given to it")
        return got

    _, sel = select(prepare(q, kv, indices, **kwargs), arg)
    how = "public call, default arguments" if arg is None else f"kernel={getattr(arg, 'symbol', arg)!r}"
    if "extra_kv" in kwargs:
        form = "two pools: the paged raw pool with the window's lists, the compressed pool with the chosen entries"
    else:
        form = f"kv [s_kv, 1, {q.shape[-1]}], indices [Sq, 1, topk] (FlashMLA's forms)"
    return Prepared(fn, checked_call, f"{how}; {form}; {sel.variant.symbol} ({sel.origin})")


def mlagen_one_pool_peer(shape, inputs: dict, arg=None) -> Prepared:
    """Our public call on the concatenated pool (built once, before timing) of a two-pool shape:
    the one-pool call beside the two-pool one."""
    if "extra_kv" not in inputs:
        raise BenchError("mlagen-onepool is for two-pool (DeepSeek-V4 CSA / HCA) shapes: this one has one pool")
    one, note = _one_pool(inputs)
    prepared = mlagen_peer(shape, one, arg)
    return Prepared(prepared.fn, prepared.checked_call, f"{note}; {prepared.note}")


#: The peers in the report's column order; all three run by default (flashmla when built).
PEERS: dict[str, Peer] = {p.name: p for p in (
    Peer("flashmla", "FlashMLA's SM90 sparse prefill (built from <peers>/flashmla; heads padded to 64 or 128)",
         flashmla_peer, default=True, lead=True, status=FLASHMLA.why_not),
    Peer("naive", "PyTorch gather + matmul", naive_peer, default=True),
    Peer("mlagen", "the public call mlagen.mla_sparse_prefill, default arguments (mlagen:<spec> forces a spec, mlagen:<kernel symbol> a variant)",
         mlagen_peer, ours=True, default=True, arg="spec|symbol"),
    Peer("flashmla-concat", "FlashMLA on a two-pool shape's pools, concatenated by every call (what a server without "
         "a two-pool kernel runs per layer and step)", flashmla_concat_peer, status=FLASHMLA.why_not),
    Peer("mlagen-onepool", "the public call on a two-pool shape's concatenated pool (one pool, built once)",
         mlagen_one_pool_peer, ours=True, arg="spec|symbol"),
)}
