"""An FP8 cache staged into bf16 before the sparse bf16 kernel: what the default call runs by
default (dispatch's choice, no ``kernel=``) on a CUDA device.

A call on an FP8 cache is defined as the bf16 kernel's result on the dequantized rows
(``operands.dequantize(cache, fmt, round_bf16=True)``). Converting the rows inside the kernel
(``sparse_kv_fp8.cuh``, still what ``kernel="mla_sparse_prefill_sm90"`` or a pinned variant runs)
costs the producer warps more issue slots than the bf16 kernel has spare: 0.63-0.71x the bf16 kernel
on a dequantized copy on S1 / S3, where converting first costs a few percent (docs/notes-sparse.md,
"The FP8 producer"). So the default converts first, into a workspace, with kernels of this module:

- a pool no larger than a 32nd of the call's references (sq x topk; S1-S3: 8 K-131 K rows against
  8 M references) is converted whole and the indices are used as they are;
- a larger pool (a serving system's whole paged cache) is compacted: the rows the indices name are
  marked, listed (an inclusive scan of the marks), converted, and the indices remapped to workspace
  rows (invalid ones to -1). Nothing is read back to the host (no synchronisation; graph capture
  works), so the workspace is sized for the worst case, min(pool rows, sq x topk) rows.

The workspace holds ``d_qk`` bf16 values a row (1152 B; the pool's rows are 656 B for fp8_v32; 1024 B
for fp8_v4, whose tokens take 584 B and whose scales sit after each page's rows), freed
when the call returns (torch's caching allocator, stream-ordered). A call whose worst case
(``workspace_bytes``) is over MLAGEN_STAGING_MB (512 MiB unless set; S1 needs 9 MiB, S3 151 MiB, a
1 M-row pool under 8 M references 1.2 GiB) converts in the kernel instead, so a server that sized its
memory without this path is not surprised by a large transient allocation. The result is bit for bit the
in-kernel mode's, which is bit for bit the bf16 kernel's on the dequantized rows; the GPU tests hold
both paths to that.
"""

from __future__ import annotations

from ... import abi, knobs, operands, paths
from ...source import Source

PARAMS = abi.ParamStruct("StageParams", tuple(abi.Field(n, k) for n, k in (
    ("kv", "const u8*"), ("row_stride", "i64"), ("page_stride", "i64"), ("page_size", "int"), ("num_kv", "int"),
    ("indices", "const int*"), ("idx_stride", "i64"), ("sq", "int"), ("topk", "int"),
    ("mark", "int*"), ("slot", "const int*"), ("rows", "int*"), ("bound", "int"),
    ("ws", "bf16*"), ("remapped", "int*"),
)))

#: A pool of at most 1 / this of the call's references (sq x topk) is converted whole, without the
#: compaction's passes over the indices. Measured on the H200 (S1's 8 M references, staging alone):
#: converting costs about 0.7 ns a pool row (8 K rows 0.011 ms, 131 K 0.093, 1 M 0.706), compacting
#: 0.23-0.28 ms, so up to about a 32nd of the references converting the whole pool is the cheaper.
WHOLE_POOL_FRACTION = 32

_THREADS = 256
#: The conversion's grid at most (warps stride over the rows): 16 K warps, enough bytes in flight to
#: stream at HBM speed, without a warp per row of the compacted route's worst case (a 1 M-row pool
#: under 8 M references launched 1 M warps for 8 K rows: 0.085 ms for 0.005 ms of work).
_CONVERT_BLOCKS = 2048


def source(fmt: operands.KvFormat) -> Source:
    """The staging kernels of one cache format (four entry points, ``symbol`` + _mark/_rows/_remap)."""
    from ...render import environment

    symbol = f"mlagen_kv_stage_{fmt.name}"
    text = environment().get_template("kv_stage.cu.j2").render(
        fmt=fmt, symbol=symbol, params_decl=PARAMS.c_declaration())
    return Source(name=f"{symbol}.cu", text=text, symbol=symbol, include_dirs=(str(paths.include_dir()),),
                  spec_name="kv_stage", variant=fmt.name)


def _kernel(fmt_name: str, device: int):
    from ...build import helper_kernel

    return helper_kernel(source, operands.get(fmt_name), device=device)


def whole_pool(call) -> bool:
    """The route: the pool converted whole (True) or the named rows compacted."""
    return call.num_kv * WHOLE_POOL_FRACTION <= call.sq * call.topk


def workspace_bytes(call) -> int:
    """The most device memory staging takes for a call (it cannot know how many distinct rows the
    indices name without reading them back): the bf16 rows, and for the compacted route the marks,
    their scan, the row list and the remapped indices."""
    n, refs = call.num_kv, call.sq * call.topk
    row = 2 * operands.get(call.kv_format, call.d_qk).d_qk
    if whole_pool(call):
        return n * row
    bound = min(n, refs)
    return bound * row + 4 * (2 * n + bound + refs)


def applies(call, kernel) -> bool:
    """Whether a call takes the staged path: an FP8 cache, the kernel left to
    dispatch (no ``kernel=``, no MLAGEN_FAMILY), on a CUDA device (elsewhere the in-kernel path
    says what the device lacks), and a workspace within MLAGEN_STAGING_MB."""
    from ...runtime import vendor

    return (kernel is None and call.kv_format != "bf16" and knobs.FAMILY.raw() is None
            and vendor() == "cuda" and workspace_bytes(call) <= knobs.staging_bytes())


def pool_view(call, pool):
    """A call's second pool (call.Pool) as a one-pool Call, for :func:`stage`."""
    from dataclasses import replace

    return replace(call, kv=pool.kv, indices=pool.indices, topk_length=pool.topk_length, topk=pool.topk,
                   num_kv=pool.num_kv, kv_row_stride=pool.kv_row_stride, kv_page_stride=pool.kv_page_stride,
                   page_size=pool.page_size, kv_format=pool.kv_format, extra=None)


def check_workspace(call, arg: str = "kv") -> None:
    """A two-pool call stages each FP8 pool (the in-kernel FP8 operand reads one pool): one
    ValueError naming the pool when that cannot be done here."""
    from ...errors import ArgumentError
    from ...runtime import vendor

    if vendor() != "cuda":
        raise ArgumentError(f"mla_sparse_prefill: {arg}: a two-pool call reads FP8 pools staged into bf16, which "
                            "needs a CUDA device")
    need, limit = workspace_bytes(call), knobs.staging_bytes()
    if need > limit:
        raise ArgumentError(f"mla_sparse_prefill: {arg}: staging this FP8 pool for a two-pool call needs up to "
                            f"{need >> 20} MiB of workspace, over MLAGEN_STAGING_MB ({limit >> 20} MiB): raise it, "
                            "or pass fewer index rows per call")


def stage(call):
    """(bf16 workspace [rows, d_qk], indices [sq, topk] into it) for a validated call."""
    import torch

    from ...runtime import current_stream

    fmt = operands.get(call.kv_format, call.d_qk)
    device = call.q.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    n, refs = call.num_kv, call.sq * call.topk
    kernel = _kernel(fmt.name, index)
    stream = current_stream(torch, index)
    values = dict(kv=call.kv.data_ptr(), row_stride=call.kv_row_stride, page_stride=call.kv_page_stride,
                  page_size=call.page_size, num_kv=n, indices=call.indices.data_ptr(),
                  idx_stride=call.indices.stride(0), sq=call.sq, topk=call.topk, mark=0, slot=0, rows=0,
                  bound=n, ws=0, remapped=0)

    def launch(entry, count, per_item=1, most=None):
        blocks = -(-count * per_item // _THREADS)
        if most is not None:
            blocks = min(blocks, most)
        if blocks:
            k = kernel if entry is None else kernel.entry(f"{kernel.binary.symbol}_{entry}")
            k.launch((blocks, 1, 1), (_THREADS, 1, 1), 0, stream, PARAMS.pack(values))

    if whole_pool(call):
        ws = torch.empty((n, fmt.d_qk), dtype=torch.bfloat16, device=device)
        values["ws"] = ws.data_ptr()
        launch(None, n, 32, _CONVERT_BLOCKS)
        return ws, call.indices
    bound = min(n, refs)
    mark = torch.zeros(n, dtype=torch.int32, device=device)
    values["mark"] = mark.data_ptr()
    launch("mark", refs)
    slot = torch.cumsum(mark, 0, dtype=torch.int32)
    rows = torch.empty(bound, dtype=torch.int32, device=device)
    ws = torch.empty((bound, fmt.d_qk), dtype=torch.bfloat16, device=device)
    remapped = torch.empty((call.sq, call.topk), dtype=torch.int32, device=device)
    values.update(slot=slot.data_ptr(), rows=rows.data_ptr(), bound=bound, ws=ws.data_ptr(),
                  remapped=remapped.data_ptr())
    launch("rows", n)
    launch(None, bound, 32, _CONVERT_BLOCKS)
    launch("remap", refs)
    return ws, remapped
