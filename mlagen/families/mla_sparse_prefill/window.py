"""The sliding window's index lists of DeepSeek-V4 attention (MLA.md section 2b), built on the
device: a server passes the batch's sequence layout (and the raw pool's block table), gets the
window's rows of the raw pool for every query token, and hands them to
``mla_sparse_prefill(..., indices=window, extra_kv=compressed, extra_indices=the indexer's)``.
One small NVRTC kernel (``templates/window_indices.cu.j2``, built by ``build.helper_kernel`` as
the staging kernels are); nothing is read back to the host, so the call can be graph-captured.
"""

from __future__ import annotations

from ... import abi, paths
from ...errors import ArgumentError, ArgumentTypeError
from ...source import Source

OP = "window_indices"

PARAMS = abi.ParamStruct("WindowParams", tuple(abi.Field(n, k) for n, k in (
    ("cu_seqlens_q", "const int*"), ("cu_seqlens_k", "const int*"), ("positions", "const int*"),
    ("block_table", "const int*"), ("out", "int*"), ("bt_row_stride", "i64"), ("out_row_stride", "i64"),
    ("bt_cols", "int"), ("page_size", "int"), ("batch", "int"), ("sq", "int"), ("window", "int"),
)))

_THREADS = 256
_SYMBOL = "mlagen_window_indices"


def source() -> Source:
    from ...render import environment

    text = environment().get_template("window_indices.cu.j2").render(symbol=_SYMBOL,
                                                                     params_decl=PARAMS.c_declaration())
    return Source(name=f"{_SYMBOL}.cu", text=text, symbol=_SYMBOL, include_dirs=(str(paths.include_dir()),),
                  spec_name="window_indices", variant="v1")


def _fail(arg: str, message: str, kind=ArgumentError):
    raise kind(f"{OP}: {arg}: {message}")


def _int_vector(torch, t, arg: str, device=None):
    if not isinstance(t, torch.Tensor):
        _fail(arg, f"expected a torch.Tensor, got {type(t).__name__}", ArgumentTypeError)
    if t.dtype != torch.int32:
        _fail(arg, f"dtype must be torch.int32, got {t.dtype}", ArgumentTypeError)
    if t.dim() != 1:
        _fail(arg, f"expected 1 dimension, got shape {tuple(t.shape)}")
    if t.device.type != "cuda" or (device is not None and t.device != device):
        _fail(arg, f"must be a CUDA tensor{'' if device is None else f' on {device} (like cu_seqlens_q)'}, "
                   f"got {t.device}")
    return t.contiguous()


def check(cu_seqlens_q, cu_seqlens_k=None, *, positions=None, num_tokens=None, window=128, block_table=None,
          page_size=None, out=None) -> dict:
    """Validate the arguments (one-line errors naming the argument); reads no device values.
    Returns the launch values and the output tensor."""
    import torch

    # The host-side values first (no tensor is touched until they are right).
    if isinstance(window, bool) or not isinstance(window, int):
        _fail("window", f"expected a positive integer, got {window!r}", ArgumentTypeError)
    if window < 1:
        _fail("window", f"expected a positive integer, got {window!r}")
    if (cu_seqlens_k is None) == (positions is None):
        _fail("cu_seqlens_k", "give exactly one of cu_seqlens_k (the queries are each sequence's last tokens) and "
                              "positions (each query token's position in its sequence)")
    if cu_seqlens_k is not None:
        if num_tokens is None:
            _fail("num_tokens", "the number of query tokens (cu_seqlens_q[-1]) is needed on the host with "
                                "cu_seqlens_k: reading it from the device would synchronise")
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
            _fail("num_tokens", f"expected a non-negative integer, got {num_tokens!r}", ArgumentTypeError)
        if num_tokens < 0:
            _fail("num_tokens", f"expected a non-negative integer, got {num_tokens!r}")
    elif block_table is None:
        _fail("block_table", "positions address the raw pool through a block table: pass block_table and "
                             "page_size (or cu_seqlens_k for a packed pool)")
    if block_table is None and page_size is not None:
        _fail("page_size", "given without block_table")
    if block_table is not None and (isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1):
        _fail("page_size", f"expected a positive integer with block_table, got {page_size!r}")

    cu_q = _int_vector(torch, cu_seqlens_q, "cu_seqlens_q")
    device = cu_q.device
    batch = cu_q.shape[0] - 1
    if batch < 1:
        _fail("cu_seqlens_q", f"expected [B + 1] offsets with B >= 1, got shape {tuple(cu_q.shape)}")
    cu_k = pos = None
    if cu_seqlens_k is not None:
        cu_k = _int_vector(torch, cu_seqlens_k, "cu_seqlens_k", device)
        if cu_k.shape[0] != batch + 1:
            _fail("cu_seqlens_k", f"expected shape ({batch + 1},) like cu_seqlens_q, got {tuple(cu_k.shape)}")
        sq = num_tokens
    else:
        pos = _int_vector(torch, positions, "positions", device)
        sq = pos.shape[0]
        if num_tokens is not None and num_tokens != sq:
            _fail("num_tokens", f"{num_tokens!r} differs from positions' length {sq}")
    bt_stride = bt_cols = 0
    ps = 1
    if block_table is not None:
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
            _fail("block_table", "expected an int32 torch.Tensor [B, max_pages]", ArgumentTypeError)
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            _fail("block_table", f"expected shape ({batch}, max_pages), got {tuple(block_table.shape)}")
        if block_table.device != device:
            _fail("block_table", f"must be on {device} (like cu_seqlens_q), got {block_table.device}")
        if block_table.shape[1] and block_table.stride(1) != 1:
            block_table = block_table.contiguous()
        bt_stride, bt_cols, ps = block_table.stride(0), block_table.shape[1], page_size
    if sq * window >= 2**31:
        _fail("window", f"{sq} tokens x {window} entries: at most 2**31 - 1")
    if out is None:
        out = torch.empty((sq, window), dtype=torch.int32, device=device)
    elif not isinstance(out, torch.Tensor) or out.dtype != torch.int32 or tuple(out.shape) != (sq, window) \
            or out.device != device or (out.numel() and out.stride(1) != 1):
        _fail("out", f"expected an int32 CUDA tensor of shape ({sq}, {window}) on {device}, last dimension "
                     "contiguous")
    values = dict(cu_seqlens_q=cu_q.data_ptr(), cu_seqlens_k=0 if cu_k is None else cu_k.data_ptr(),
                  positions=0 if pos is None else pos.data_ptr(),
                  block_table=0 if block_table is None else block_table.data_ptr(), out=out.data_ptr(),
                  bt_row_stride=bt_stride, out_row_stride=out.stride(0) if out.numel() else window,
                  bt_cols=bt_cols, page_size=ps, batch=batch, sq=sq, window=window)
    return {"values": values, "out": out, "keep": (cu_q, cu_k, pos, block_table)}


def window_indices(cu_seqlens_q, cu_seqlens_k=None, *, positions=None, num_tokens=None, window=128,
                   block_table=None, page_size=None, out=None):
    """The sliding window's rows of the raw KV pool for every query token (DeepSeek-V4, MLA.md 2b).

    Args:
        cu_seqlens_q: [B + 1] int32 offsets of the packed query tokens (token t belongs to the
            sequence b with cu_seqlens_q[b] <= t < cu_seqlens_q[b + 1]).
        cu_seqlens_k: [B + 1] int32 offsets of each sequence's keys (cached prefix + new tokens):
            the queries are the last tokens of their sequence (bottom-right aligned, as in a causal
            prefill), and without a block table sequence b's key at position k is raw-pool row
            cu_seqlens_k[b] + k (a packed pool). Needs ``num_tokens``.
        positions: instead of cu_seqlens_k, [Sq] int32 position of each query token in its
            sequence; needs ``block_table``.
        num_tokens: host-side number of query tokens (cu_seqlens_q[-1]) with cu_seqlens_k.
        window: entries per token W (128 in DeepSeek-V4): positions pos - W + 1 ... pos.
        block_table: optional [B, max_pages] int32 map of (sequence, logical page) to a physical
            page of a paged raw pool: key position k is row block_table[b, k // page_size] *
            page_size + k % page_size (negative pages, or k past the table, give -1).
        page_size: rows per page with block_table.
        out: optional preallocated [Sq, W] int32 output.

    Returns:
        int32 [Sq, W]: entry j of token t is the row of position pos_t - W + 1 + j, oldest first
        (the token itself last), -1 where that position is before its sequence's start. Pass it as
        ``indices`` (with the raw pool as ``kv``) of :func:`mlagen.mla_sparse_prefill`.

    Launches one kernel on the current stream; no host synchronisation.
    """
    import torch

    from ...build import helper_kernel
    from ...runtime import current_stream

    checked = check(cu_seqlens_q, cu_seqlens_k, positions=positions, num_tokens=num_tokens, window=window,
                    block_table=block_table, page_size=page_size, out=out)
    v = checked["values"]
    total = v["sq"] * v["window"]
    if total:
        device = cu_seqlens_q.device.index if cu_seqlens_q.device.index is not None else torch.cuda.current_device()
        with torch.cuda.device(device):
            kernel = helper_kernel(source, device=device)
            kernel.launch((-(-total // _THREADS), 1, 1), (_THREADS, 1, 1), 0, current_stream(torch, device),
                          PARAMS.pack(v))
    return checked["out"]


def window_reference(cu_seqlens_q, cu_seqlens_k=None, *, positions=None, window=128, block_table=None,
                     page_size=None):
    """What :func:`window_indices` computes, in torch on any device (for tests)."""
    import torch

    cu_q = cu_seqlens_q.long().cpu()
    rows = []
    for b in range(cu_q.shape[0] - 1):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        for t in range(q0, q1):
            if positions is not None:
                pos = int(positions[t])
            else:
                lk = int(cu_seqlens_k[b + 1]) - int(cu_seqlens_k[b])
                pos = lk - (q1 - q0) + (t - q0)
            row = []
            for j in range(window):
                k = pos - (window - 1) + j
                r = -1
                if 0 <= k <= pos:
                    if block_table is not None:
                        page = k // page_size
                        if page < block_table.shape[1] and int(block_table[b, page]) >= 0:
                            r = int(block_table[b, page]) * page_size + k % page_size
                    else:
                        r = int(cu_seqlens_k[b]) + k
                row.append(r)
            rows.append(row)
    return torch.tensor(rows, dtype=torch.int32).view(-1, window)
