"""Two KV pools in one softmax (MLA.md section 2b, DeepSeek-V4) on the GPU, against the float32
reference on the concatenated pool, and against the one-pool call on the same key list.

The matrix: H in {1, 5, 8, 16, 64, 128} x keys per query (pool 1 + pool 2) in {1, 129, 640, 1152}
(and one pool empty), both pools flat / [N, 1, d] / strided pages of 64 or 16 rows in every
pairing, bf16, FP8 V3.2 and FP8 V4 pools (staged), fuzzed indices (-1, negatives, >= N, 2**31 - 1,
duplicates) in both, topk_length per pool (short, zero, past topk), rows with no key, sinks
finite / +inf / -inf / mixed, d_qk 512 (V4) and 576, on every kernel of the family the device
has (the 64-head kernel, the H <= 16 kernel) and dispatch's choice; the sm80 kernel refuses. Outputs
are poisoned with NaN first. Windows from ``mlagen.window_indices`` over a paged raw pool cross
page and sequence starts. ``-k fuzz`` is the compute-sanitizer run of the device script.
"""

from __future__ import annotations

import itertools
import math

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (__import__("torch").cuda.is_available()
                                                        and __import__("torch").cuda.get_device_capability() == (9, 0)),
                                                   reason="the two-pool kernels are sm_90a's (a Hopper GPU)"),
              pytest.mark.usefixtures("spec_defaults")]

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402
from mlagen import operands  # noqa: E402
from mlagen.families.mla_sparse_prefill import reference as sp_ref  # noqa: E402
from mlagen.families.mla_sparse_prefill import tools  # noqa: E402
from mlagen.families.mla_sparse_prefill import window as sp_window  # noqa: E402

_CUDA = torch.cuda.is_available()
_HOPPER = _CUDA and torch.cuda.get_device_capability() == (9, 0)
SM90, H16, SM80 = "mla_sparse_prefill_sm90", "mla_sparse_prefill_sm90_h16", "mla_sparse_prefill_sm80"


def _kernels(heads: int) -> list:
    """The kernels a case runs on: dispatch's choice, and each two-pool spec by name that serves
    it (the sm80 kernel reads one pool: see test_one_pool_kernels_refuse_a_second_pool)."""
    return [None, SM90] + ([H16] if heads <= 16 else [])


def _persistent(case: dict, seed: int) -> tuple[bool, str]:
    """run_case on the 64-head kernel's persistent variant (one CTA per SM takes the items in turn),
    specialised for the case's first pool (flat, or a pool of pages); against the reference only
    (the one-pool call on the concatenated rows needs the flat variant)."""
    from mlagen import spec as spec_mod
    from mlagen import variant

    spec = spec_mod.load(SM90)
    d_qk = case.get("d_qk", 512)
    fixed = {"persistent": True, "epilogue": "warp" if d_qk == 512 else "direct", "d_qk": d_qk, "kv_format": "bf16"}
    try:
        return run_case(case, seed, variant.make(spec, {**fixed, "paged": False}), check_one_pool=False)
    except ValueError as exc:
        if "is compiled for" not in str(exc):
            raise
        return run_case(case, seed, variant.make(spec, {**fixed, "paged": True}), check_one_pool=False)


def make_pool(layout: str, n: int, d_qk: int, fmt: str, gen):
    """A pool of about n rows: bf16 "flat" [n, d], "n1d" [n, 1, d], "paged64" / "paged16" strided
    pages (each page in a slot twice its size); FP8 V3.2 (fp8_v32) "flat" [n, 656] or "paged64";
    FP8 V4 (fp8_v4) "v4pool64" / "v4pool32", its page pool."""
    dev = "cuda"
    f = operands.get(fmt, d_qk)
    if layout.startswith("v4pool"):   # DeepSeek-V4's FP8 cache: [blocks, page_bytes], scales after each page's rows
        return operands.quantize(torch.randn((n, d_qk), generator=gen, device=dev), f,
                                 page_size=int(layout[len("v4pool"):]))
    if layout == "flat" or layout == "n1d" or n == 0:
        rows = torch.randn((n, d_qk), generator=gen, device=dev)
        t = operands.quantize(rows, f) if f.quantized else rows.to(torch.bfloat16)
        return t.view(n, 1, -1) if layout == "n1d" else t
    page = int(layout[len("paged"):])
    pages = max(1, -(-n // page))
    rows = torch.randn((pages * 2 * page, d_qk), generator=gen, device=dev)
    t = operands.quantize(rows, f) if f.quantized else rows.to(torch.bfloat16)
    return t.view(pages, 2 * page, -1)[:, :page]


def pool_rows(kv, fmt: str, d_qk: int):
    """The pool's rows as the kernel reads them: bf16 [N, d] (FP8 dequantized, rounded to bf16)."""
    f = operands.get(fmt, d_qk)
    if f.quantized:
        return operands.dequantize(kv, f, round_bf16=True)
    return sp_ref.kv_rows(kv).contiguous()


def key_list(idx1, len1, n1, idx2, len2, n2):
    """The two-pool key list as one pool's (rows of pool 2 moved by n1): what the kernel walks.
    Returns ([Sq, topk1 + topk2] int32 with -1 for every invalid entry, [Sq] lengths)."""
    sq = idx1.shape[0]
    pad = torch.full((sq, 1), -1, dtype=torch.int32, device=idx1.device)
    a, b = torch.cat([idx1, pad], 1).long(), torch.cat([idx2, pad], 1).long()
    total = idx1.shape[1] + idx2.shape[1]
    pos = torch.arange(total, device=idx1.device).unsqueeze(0)
    l1, l2 = len1.long().unsqueeze(1), len2.long().unsqueeze(1)
    g1 = a.gather(1, pos.clamp(max=idx1.shape[1]).expand(sq, -1))
    g2 = b.gather(1, (pos - l1).clamp(0, idx2.shape[1]))
    in1, in2 = pos < l1, (pos >= l1) & (pos < l1 + l2)
    ids = torch.where(in1 & (g1 >= 0) & (g1 < n1), g1,
                      torch.where(in2 & (g2 >= 0) & (g2 < n2), g2 + n1, torch.full_like(g1, -1)))
    return ids.to(torch.int32), (len1 + len2).to(torch.int32)


def _lengths(mode, sq, topk, gen):
    if mode is None:
        return None
    length = torch.randint(0, topk + 1, (sq,), generator=gen, device="cuda", dtype=torch.int32)
    length[sq // 2] = 0
    length[-1] = topk
    if mode == "long" and sq > 1:
        length[1] = topk + 100
    return length


def _effective(length, topk, sq):
    if length is None:
        return torch.full((sq,), topk, dtype=torch.int32, device="cuda")
    return length.clamp(0, topk).to(torch.int32)


def run_case(case: dict, seed: int, kernel, *, check_one_pool: bool = True) -> tuple[bool, str]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sq, heads, d_qk = case["sq"], case["heads"], case.get("d_qk", 512)
    fmt1, fmt2 = case.get("fmt", ("bf16", "bf16"))
    lay1, lay2 = case.get("layout", ("flat", "flat"))
    k1, k2 = case["topk"]
    n1, n2 = case.get("n", (300, 700))
    q = torch.randn((sq, heads + 2, d_qk), generator=gen, device="cuda").to(torch.bfloat16)[:, 1:heads + 1]
    kv1, kv2 = make_pool(lay1, n1, d_qk, fmt1, gen), make_pool(lay2, n2, d_qk, fmt2, gen)
    r1, r2 = pool_rows(kv1, fmt1, d_qk), pool_rows(kv2, fmt2, d_qk)
    N1, N2 = r1.shape[0], r2.shape[0]
    inv = case.get("invalid", 0.2)
    idx1 = tools.fuzzed_indices(torch, sq, k1, N1, gen, "cuda", invalid=inv, empty_rows=case.get("empty1", (0,)))
    idx2 = tools.fuzzed_indices(torch, sq, k2, N2, gen, "cuda", invalid=inv, empty_rows=case.get("empty2", (0,)))
    len1, len2 = _lengths(case.get("len1"), sq, k1, gen), _lengths(case.get("len2"), sq, k2, gen)
    sink = tools.sink_for(torch, case.get("sink", "finite"), heads, gen, "cuda")
    scale = d_qk ** -0.5
    out = torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device="cuda")
    ml = torch.full((sq, heads), math.nan, dtype=torch.float32, device="cuda")
    lse = torch.full((sq, heads), math.nan, dtype=torch.float32, device="cuda")
    got = mlagen.mla_sparse_prefill(
        q, kv1, idx1.view(sq, 1, k1) if case.get("idx3") else idx1, softmax_scale=scale, topk_length=len1,
        attn_sink=sink, out=out, max_logits=ml, lse=lse, kernel=kernel, kv_format=fmt1, extra_kv=kv2,
        extra_indices=idx2, extra_topk_length=len2, extra_kv_format=fmt2)
    assert got[0] is out and got[1] is ml and got[2] is lse
    # The reference on the rows the kernel reads (FP8 dequantized and rounded to bf16).
    ref = sp_ref.reference(q, r1, idx1, softmax_scale=scale, topk_length=len1, attn_sink=sink, extra_kv=r2,
                           extra_indices=idx2, extra_topk_length=len2)
    torch.cuda.synchronize()
    ok, msg = tools.judge(torch, got, ref)
    if not ok or not check_one_pool:
        return ok, msg
    # The one-pool call on the same key list over the concatenated rows: the same result.
    ids, lens = key_list(idx1, _effective(len1, k1, sq), N1, idx2, _effective(len2, k2, sq), N2)
    one = mlagen.mla_sparse_prefill(q, torch.cat([r1, r2]), ids, softmax_scale=scale, topk_length=lens,
                                    attn_sink=sink, kernel=kernel)
    torch.cuda.synchronize()
    same = all(torch.equal(a, b) for a, b in zip(got, one))
    if not same:
        d = (got[0].float() - one[0].float()).norm() / one[0].float().norm().clamp_min(1e-30)
        dl = torch.nan_to_num((got[2] - one[2]).abs(), nan=0.0).max().item()
        if not (d <= 2e-3 and dl <= 1e-4 and torch.equal(torch.isinf(got[2]), torch.isinf(one[2]))):
            return False, f"{msg}; differs from the one-pool call on the key list (out {d:.2e}, lse {dl:.2e})"
    return True, msg + ("; = one-pool" if same else "; ~ one-pool")


def _matrix() -> list[dict]:
    layouts = [("flat", "flat"), ("paged64", "flat"), ("flat", "paged16"), ("paged64", "paged16"), ("n1d", "paged64")]
    sinks = ["finite", "none", "mixed", "+inf", "-inf"]
    lens = [(None, None), ("short", None), (None, "long"), ("short", "short")]
    cases, i = [], 0
    for heads in (1, 5, 8, 16, 64, 128):
        for topk in ((1, 0), (0, 1), (128, 1), (128, 512), (128, 1024)):
            l1, l2 = lens[i % 4]
            cases.append({"sq": 11 if sum(topk) >= 640 else 17, "heads": heads, "topk": topk,
                          "d_qk": 576 if i % 3 == 2 else 512, "layout": layouts[i % 5], "sink": sinks[i % 5],
                          "len1": l1 if topk[0] else None, "len2": l2 if topk[1] else None, "idx3": i % 2 == 1,
                          "n": (300, 1500) if topk[1] >= 512 else (300, 700)})
            i += 1
    return cases


MATRIX = _matrix()


@pytest.mark.parametrize("i", range(len(MATRIX)), ids=[f"h{c['heads']}-k{c['topk'][0]}+{c['topk'][1]}-{c['layout'][0]}-"
                                                        f"{c['layout'][1]}-d{c['d_qk']}" for c in MATRIX])
def test_two_pools_match_the_reference(i):
    case = MATRIX[i]
    for kernel in _kernels(case["heads"]):
        ok, msg = run_case(case, 100 + i, kernel)
        assert ok, f"{kernel}: {case}: {msg}"
    ok, msg = _persistent(case, 100 + i)
    assert ok, f"persistent: {case}: {msg}"


@pytest.mark.parametrize("heads", [8, 64, 128])
def test_persistent_ctas_take_many_two_pool_items(heads):
    """More items than SMs (each persistent CTA takes several), window-like and compressed pools
    with per-token lengths from 0 up, so the items' pair counts differ."""
    case = {"sq": 600, "heads": heads, "topk": (128, 512), "layout": ("paged64", "flat"), "len1": "short",
            "len2": "short", "n": (2000, 1500), "sink": "mixed"}
    ok, msg = _persistent(case, 700 + heads)
    assert ok, f"{case}: {msg}"


FP8 = [
    {"fmt": ("bf16", "fp8_v32"), "layout": ("paged64", "paged64"), "heads": 64, "topk": (128, 512)},
    {"fmt": ("fp8_v32", "bf16"), "layout": ("paged64", "flat"), "heads": 16, "topk": (128, 1024), "len1": "short"},
    {"fmt": ("fp8_v32", "fp8_v32"), "layout": ("flat", "paged64"), "heads": 128, "topk": (129, 511),
     "len2": "long"},
    {"fmt": ("fp8_v32", "fp8_v32"), "layout": ("paged64", "paged64"), "heads": 5, "topk": (1, 128),
     "sink": "mixed"},
    # DeepSeek-V4's FP8 cache (d_qk 512): the compressed pool, the window's raw pool, or both.
    {"fmt": ("bf16", "fp8_v4"), "layout": ("paged64", "v4pool64"), "heads": 64, "topk": (128, 512), "d_qk": 512},
    {"fmt": ("fp8_v4", "bf16"), "layout": ("v4pool64", "flat"), "heads": 8, "topk": (128, 640), "d_qk": 512,
     "len2": "short"},
    {"fmt": ("fp8_v4", "fp8_v4"), "layout": ("v4pool64", "v4pool32"), "heads": 128, "topk": (129, 1023), "d_qk": 512,
     "len1": "long"},
]


@pytest.mark.parametrize("i", range(len(FP8)))
def test_fp8_pools_are_staged_into_the_same_softmax(i):
    case = dict({"d_qk": 576}, **FP8[i], sq=9, n=(640, 2048))
    for kernel in (None, SM90):
        ok, msg = run_case(case, 300 + i, kernel)
        assert ok, f"{kernel}: {case}: {msg}"


EMPTY = [
    {"topk": (128, 0), "n": (300, 700)},     # extra topk 0
    {"topk": (128, 64), "n": (300, 0)},      # extra pool with no rows
    {"topk": (0, 200), "n": (300, 700)},     # first topk 0
    {"topk": (64, 200), "n": (0, 700)},      # first pool with no rows
    {"topk": (64, 64), "n": (300, 700), "invalid": 1.0},        # every entry invalid: no row has a key
    {"topk": (64, 64), "n": (300, 700), "empty1": (0, 1, 2), "empty2": (0, 1, 2, 3)},  # rows with no key
]


@pytest.mark.parametrize("heads", [8, 64])
@pytest.mark.parametrize("i", range(len(EMPTY)))
def test_empty_pools_and_rows_with_no_key(i, heads):
    case = dict(EMPTY[i], sq=7, heads=heads, layout=("paged64", "flat"))
    for kernel in _kernels(heads):
        ok, msg = run_case(case, 400 + i, kernel)
        assert ok, f"{kernel}: {case}: {msg}"
    ok, msg = _persistent(case, 400 + i)
    assert ok, f"persistent: {case}: {msg}"


@pytest.mark.parametrize("heads", [1, 16, 64, 128])
def test_window_pool_from_window_indices_crosses_page_and_sequence_starts(heads):
    """A V4 CSA layer's call: the window's rows of a paged raw pool (pages of 64 in a shuffled
    block table) from window_indices, the compressed pool's chosen rows beside them."""
    gen = torch.Generator(device="cuda").manual_seed(heads)
    lq = [5, 1, 70, 33]                  # new tokens per sequence
    prefix = [0, 200, 60, 1000]          # cached tokens before them
    lk = [a + b for a, b in zip(lq, prefix)]
    cu_q = torch.tensor([0, *itertools.accumulate(lq)], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *itertools.accumulate(lk)], dtype=torch.int32, device="cuda")
    page, cols = 64, max(-(-x // 64) for x in lk)
    blocks = len(lk) * cols + 3
    perm = torch.randperm(blocks, generator=gen, device="cuda")[:len(lk) * cols].to(torch.int32)
    table = perm.view(len(lk), cols).contiguous()
    sq = sum(lq)
    win = mlagen.window_indices(cu_q, cu_k, num_tokens=sq, window=128, block_table=table, page_size=page)
    ref_win = sp_window.window_reference(cu_q.cpu(), cu_k.cpu(), window=128, block_table=table.cpu(), page_size=page)
    assert torch.equal(win.cpu(), ref_win)
    positions = torch.cat([torch.arange(p, p + n, dtype=torch.int32) for p, n in zip(prefix, lq)]).cuda()
    win2 = mlagen.window_indices(cu_q, positions=positions, window=128, block_table=table, page_size=page)
    assert torch.equal(win2, win)
    assert (win[0, :-1] == -1).all() and win[0, -1] >= 0     # a window before its sequence's start
    assert (win[4, :-5] == -1).all() and (win[4, -5:] >= 0).all()
    raw = torch.randn((blocks, 2 * page, 512), generator=gen, device="cuda").to(torch.bfloat16)[:, :page]
    comp = torch.randn((1024, 512), generator=gen, device="cuda").to(torch.bfloat16)
    chosen = torch.randint(0, 1024, (sq, 512), generator=gen, device="cuda", dtype=torch.int32)
    sink = torch.randn((heads,), generator=gen, device="cuda")
    q = torch.randn((sq, heads, 512), generator=gen, device="cuda").to(torch.bfloat16)
    for kernel in _kernels(heads):
        out = torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device="cuda")
        got = mlagen.mla_sparse_prefill(q, raw, win, softmax_scale=512 ** -0.5, attn_sink=sink, out=out,
                                        kernel=kernel, extra_kv=comp, extra_indices=chosen)
        ref = sp_ref.reference(q, raw, win, softmax_scale=512 ** -0.5, attn_sink=sink, extra_kv=comp,
                               extra_indices=chosen)
        ok, msg = tools.judge(torch, got, ref)
        assert ok, f"{kernel}: {msg}"


def test_window_indices_match_their_reference_on_ragged_batches():
    gen = torch.Generator().manual_seed(5)
    for _ in range(4):
        b = int(torch.randint(1, 6, (1,), generator=gen))
        lq = torch.randint(0, 40, (b,), generator=gen)
        lk = lq + torch.randint(0, 300, (b,), generator=gen)
        cu_q = torch.cat([torch.zeros(1, dtype=torch.long), lq.cumsum(0)]).to(torch.int32)
        cu_k = torch.cat([torch.zeros(1, dtype=torch.long), lk.cumsum(0)]).to(torch.int32)
        for w in (1, 7, 128):
            got = mlagen.window_indices(cu_q.cuda(), cu_k.cuda(), num_tokens=int(cu_q[-1]), window=w)
            assert torch.equal(got.cpu(), sp_window.window_reference(cu_q, cu_k, window=w))
        cols = int(-(-lk.max() // 16)) if b else 1
        table = torch.randint(-1, 500, (b, max(cols - 1, 1)), generator=gen, dtype=torch.int32)  # short, with holes
        got = mlagen.window_indices(cu_q.cuda(), cu_k.cuda(), num_tokens=int(cu_q[-1]), window=128,
                                    block_table=table.cuda(), page_size=16)
        assert torch.equal(got.cpu(), sp_window.window_reference(cu_q, cu_k, window=128, block_table=table,
                                                                  page_size=16))


def test_flash_mla_names_and_graph_capture():
    gen = torch.Generator(device="cuda").manual_seed(9)
    sq, heads = 6, 64
    q = torch.randn((sq, heads, 512), generator=gen, device="cuda").to(torch.bfloat16)
    kv1 = torch.randn((200, 1, 512), generator=gen, device="cuda").to(torch.bfloat16)
    kv2 = torch.randn((300, 1, 512), generator=gen, device="cuda").to(torch.bfloat16)
    i1 = torch.randint(0, 200, (sq, 1, 128), generator=gen, device="cuda", dtype=torch.int32)
    i2 = torch.randint(0, 300, (sq, 1, 256), generator=gen, device="cuda", dtype=torch.int32)
    l2 = torch.tensor([0, 1, 100, 256, 300, 64], dtype=torch.int32, device="cuda")
    sink = torch.randn((heads,), generator=gen, device="cuda")
    o, ml, lse = mlagen.flash_mla_sparse_fwd(q, kv1, i1, 512 ** -0.5, attn_sink=sink, extra_kv=kv2, extra_indices=i2,
                                             extra_topk_length=l2)
    ref = sp_ref.reference(q, kv1, i1, softmax_scale=512 ** -0.5, attn_sink=sink, extra_kv=kv2, extra_indices=i2,
                           extra_topk_length=l2)
    ok, msg = tools.judge(torch, (o, ml, lse), ref)
    assert ok, msg
    # No host synchronisation: the call is captured and replayed.
    outs = [torch.empty_like(o), torch.empty_like(ml), torch.empty_like(lse)]
    mlagen.mla_sparse_prefill(q, kv1, i1, softmax_scale=512 ** -0.5, attn_sink=sink, out=outs[0],
                              max_logits=outs[1], lse=outs[2], extra_kv=kv2, extra_indices=i2, extra_topk_length=l2)
    graph = torch.cuda.CUDAGraph()
    for t in outs:
        t.fill_(math.nan)
    with torch.cuda.graph(graph):
        mlagen.mla_sparse_prefill(q, kv1, i1, softmax_scale=512 ** -0.5, attn_sink=sink, out=outs[0],
                                  max_logits=outs[1], lse=outs[2], extra_kv=kv2, extra_indices=i2,
                                  extra_topk_length=l2)
    for t in outs:
        t.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(outs, (o, ml, lse)))


def test_fuzzed_indices_in_both_pools():
    """Wild indices and lengths in both pools on every kernel (the compute-sanitizer run)."""
    gen = torch.Generator().manual_seed(11)
    for i in range(6):
        heads = [1, 8, 16, 64, 128, 5][i]
        k1, k2 = int(torch.randint(0, 200, (1,), generator=gen)), int(torch.randint(0, 700, (1,), generator=gen))
        case = {"sq": 5, "heads": heads, "topk": (k1, k2), "n": (int(torch.randint(0, 400, (1,), generator=gen)),
                                                                  int(torch.randint(1, 900, (1,), generator=gen))),
                "layout": [("flat", "paged16"), ("paged64", "flat"), ("paged64", "paged64")][i % 3],
                "len1": "long", "len2": "long", "invalid": 0.6, "d_qk": [512, 576][i % 2]}
        for kernel in _kernels(heads):
            ok, msg = run_case(case, 500 + i, kernel, check_one_pool=False)
            assert ok, f"{kernel}: {case}: {msg}"
        ok, msg = _persistent(dict(case, sq=300), 500 + i)  # 300 tokens: several items per CTA
        assert ok, f"persistent: {case}: {msg}"


def test_one_pool_kernels_refuse_a_second_pool():
    q = torch.zeros((3, 16, 512), dtype=torch.bfloat16, device="cuda")
    kv = torch.zeros((10, 512), dtype=torch.bfloat16, device="cuda")
    idx = torch.zeros((3, 4), dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"^mla_sparse_prefill: extra_kv: kernel 'mla_sparse_prefill_sm80' reads one "
                                         r"KV pool; the two-pool kernels are"):
        mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=0.1, kernel=SM80, extra_kv=kv, extra_indices=idx)


@pytest.mark.parametrize("heads", [8, 64])
def test_a_repeated_two_pool_call_takes_its_launch_plan(heads):
    from mlagen.families.mla_sparse_prefill import entry

    def inputs():
        """The same data in new tensors of the same layout (a paged first pool, a flat second)."""
        gen = torch.Generator(device="cuda").manual_seed(heads)
        q = torch.randn((5, heads, 512), generator=gen, device="cuda").to(torch.bfloat16)
        kv1 = torch.randn((4, 128, 512), generator=gen, device="cuda").to(torch.bfloat16)[:, :64]
        kv2 = torch.randn((300, 512), generator=gen, device="cuda").to(torch.bfloat16)
        i1 = torch.randint(-1, 256, (5, 128), generator=gen, device="cuda", dtype=torch.int32)
        i2 = torch.randint(-1, 300, (5, 200), generator=gen, device="cuda", dtype=torch.int32)
        return q, kv1, i1, dict(softmax_scale=512 ** -0.5, extra_kv=kv2, extra_indices=i2)

    q, kv1, i1, args = inputs()
    first = mlagen.mla_sparse_prefill(q, kv1, i1, **args)
    hits = entry._plans.hits
    for _ in range(2):   # the plan must take the new tensors' addresses
        q, kv1, i1, args = inputs()
        again = mlagen.mla_sparse_prefill(q, kv1, i1, **args)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert entry._plans.hits == hits + 2


def test_window_indices_and_the_two_pool_call_are_captured_in_one_graph():
    """A server's step: the window's lists built on the device, then the call, in one CUDA graph."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    cu_q = torch.tensor([0, 40, 100], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, 300, 360], dtype=torch.int32, device="cuda")
    raw = torch.randn((360, 512), generator=gen, device="cuda").to(torch.bfloat16)
    comp = torch.randn((90, 512), generator=gen, device="cuda").to(torch.bfloat16)
    chosen = torch.randint(-1, 90, (100, 64), generator=gen, device="cuda", dtype=torch.int32)
    q = torch.randn((100, 64, 512), generator=gen, device="cuda").to(torch.bfloat16)
    win = torch.empty((100, 128), dtype=torch.int32, device="cuda")
    outs = (torch.empty((100, 64, 512), dtype=torch.bfloat16, device="cuda"),
            torch.empty((100, 64), device="cuda"), torch.empty((100, 64), device="cuda"))

    def step():
        mlagen.window_indices(cu_q, cu_k, num_tokens=100, window=128, out=win)
        mlagen.mla_sparse_prefill(q, raw, win, softmax_scale=512 ** -0.5, out=outs[0], max_logits=outs[1],
                                  lse=outs[2], extra_kv=comp, extra_indices=chosen)

    step()   # compiles, and keeps the launch plan
    ref = sp_ref.reference(q, raw, win, softmax_scale=512 ** -0.5, extra_kv=comp, extra_indices=chosen)
    assert tools.judge(torch, outs, ref)[0]
    want = [t.clone() for t in outs]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    win.fill_(-7)
    for t in outs:
        t.fill_(math.nan)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(win.cpu(), sp_window.window_reference(cu_q.cpu(), cu_k.cpu(), window=128))
    assert all(torch.equal(a, b) for a, b in zip(outs, want))
