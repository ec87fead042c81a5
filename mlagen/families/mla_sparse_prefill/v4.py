"""DeepSeek-V4 benchmark inputs (V1-V5 of BENCHMARKS.md, MLA.md 2b) and the concatenation a
server without a two-pool kernel does.

The queries are the last Sq positions of one sequence of ``raw_kv`` tokens, stored in a raw pool
of 64-token pages in shuffled order (a block table, as a paged cache holds them); each query's
first pool is the window, the ``window`` raw positions up to its own; its second pool is a
compressed pool of s_kv entries (4x in a CSA layer: topk entries chosen uniformly without
repetition among those complete at its position; 128x in an HCA layer: every complete entry, the
rest -1), or none (a sliding layer).

:func:`server_concat` is what a serving stack without a two-pool kernel runs per layer and step
before a one-pool call (FlashMLA's): the raw rows the batch's windows read are gathered into one
pool with the compressed rows after them, and the index lists are rewritten into it.
"""

from __future__ import annotations

from .problem import PAGE   # the raw pool's tokens per page (the shape's key counts its rows so)


def _compression(shape) -> int:
    """Raw tokens per compressed entry: the pool covers the raw sequence."""
    return max(1, shape.raw_kv // max(shape.s_kv, 1))


def make_inputs(shape, device, seed: int = 0) -> dict:
    """Keyword arguments of a two-pool :func:`mlagen.mla_sparse_prefill` call for a V4 shape
    (``extra_*`` absent for a sliding layer), plus what :func:`server_concat` needs
    (``window_rows``: the raw rows the windows read, in position order; ``window_local``: the
    window lists as indices into them)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sq, heads, d, w = shape.sq, shape.heads, shape.d_qk, shape.window
    pages = -(-shape.raw_kv // PAGE)
    q = torch.randn((sq, heads, d), device=device, generator=gen).to(torch.bfloat16)
    raw = torch.randn((pages, PAGE, d), device=device, generator=gen).to(torch.bfloat16)
    table = torch.randperm(pages, device=device, generator=gen).to(torch.int32)
    sink = torch.randn((heads,), device=device, generator=gen) if shape.sink else None
    first = shape.raw_kv - sq                                   # the queries' first position
    pos = torch.arange(first, shape.raw_kv, device=device)     # [sq]
    key_pos = pos.unsqueeze(1) - (w - 1) + torch.arange(w, device=device)   # [sq, w], oldest first
    ok = key_pos >= 0
    kp = key_pos.clamp_min(0)
    rows = table[kp // PAGE].long() * PAGE + kp % PAGE
    window = torch.where(ok, rows, -1).to(torch.int32)
    lo = max(first - (w - 1), 0)
    span = torch.arange(lo, shape.raw_kv, device=device)
    window_rows = table[span // PAGE].long() * PAGE + span % PAGE
    window_local = torch.where(ok, key_pos - lo, -1).to(torch.int32)
    inputs = {"q": q, "kv": raw, "indices": window, "softmax_scale": d ** -0.5, "attn_sink": sink,
              "window_rows": window_rows, "window_local": window_local}
    if shape.s_kv:
        comp = torch.randn((shape.s_kv, d), device=device, generator=gen).to(torch.bfloat16)
        visible = ((pos + 1) // _compression(shape)).clamp(max=shape.s_kv)        # complete entries per query
        if shape.hca:
            e = torch.arange(shape.s_kv, device=device).unsqueeze(0)
            chosen = torch.where(e < visible.unsqueeze(1), e, -1).to(torch.int32)
        else:
            chosen = torch.empty((sq, shape.topk), dtype=torch.int32, device=device)
            e = torch.arange(shape.s_kv, device=device).unsqueeze(0)
            for t0 in range(0, sq, 256):
                t1 = min(sq, t0 + 256)
                r = torch.rand((t1 - t0, shape.s_kv), device=device, generator=gen)
                r = r.masked_fill(e >= visible[t0:t1].unsqueeze(1), -1.0)   # never chosen while others remain
                chosen[t0:t1] = r.topk(shape.topk, dim=-1).indices.to(torch.int32)
        inputs.update(extra_kv=comp, extra_indices=chosen)
    return inputs


def server_concat(inputs: dict):
    """(kv [R + N2, d], indices [Sq, window + topk]): the window's raw rows gathered into one pool
    with the compressed pool after them, and the lists rewritten into it; a one-pool call on them
    computes what the two-pool call computes. The per-step work of a server without a two-pool
    kernel (timed by the ``flashmla-concat`` peer)."""
    import torch

    raw = inputs["kv"].reshape(-1, inputs["kv"].shape[-1])
    rows = raw.index_select(0, inputs["window_rows"])
    if "extra_kv" not in inputs:
        return rows, inputs["window_local"]
    r = rows.shape[0]
    extra = inputs["extra_indices"]
    moved = torch.where(extra >= 0, extra + r, -1)
    return torch.cat([rows, inputs["extra_kv"]]), torch.cat([inputs["window_local"], moved.to(torch.int32)], 1)


def one_pool_inputs(inputs: dict) -> dict:
    """The inputs of a one-pool call on :func:`server_concat`'s pool (built once)."""
    kv, indices = server_concat(inputs)
    return {"q": inputs["q"], "kv": kv.unsqueeze(1), "indices": indices.unsqueeze(1),
            "softmax_scale": inputs["softmax_scale"], "attn_sink": inputs.get("attn_sink")}
