"""Two KV pools in one softmax (MLA.md section 2b) without a GPU: the parameter structs, the
two-pool kernels compiled for sm_90a (the sm80 kernel reads one pool, and dispatch knows), the
window-index kernel, argument errors that name the argument, and the reference (the one-pool
reference on the concatenated pool) against a brute-force loop in float64."""

from __future__ import annotations

import math

import pytest

from mlagen import render, spec, variant

torch = pytest.importorskip("torch")

from mlagen.families.mla_sparse_prefill import call as sp_call  # noqa: E402
from mlagen.families.mla_sparse_prefill import params as sp_params  # noqa: E402
from mlagen.families.mla_sparse_prefill import problem as sp_problem  # noqa: E402
from mlagen.families.mla_sparse_prefill import reference as sp_ref  # noqa: E402
from mlagen.families.mla_sparse_prefill import window as sp_window  # noqa: E402

EXTRA = ["extra_kv", "extra_indices", "extra_topk_length", "extra_idx_row_stride", "extra_row_stride",
         "extra_page_stride", "extra_topk", "extra_num_kv", "extra_page_size"]


@pytest.mark.parametrize("fmt", ["bf16", "fp8_v32"])
def test_both_abis_carry_the_second_pool(fmt):
    for params in (sp_params.params_for(fmt), sp_params.params_tma_for(fmt)):
        names = [f.name for f in params.fields]
        assert names[names.index("scale_log2") + 1:][:len(EXTRA)] == EXTRA
        kinds = {f.name: f.kind for f in params.fields}
        assert kinds["extra_kv"] == kinds["kv"]   # the same element type (strides count its elements)


@pytest.mark.parametrize("name, values, target", [
    ("mla_sparse_prefill_sm90", {"d_qk": 512, "paged": False}, "sm_90a"),
    ("mla_sparse_prefill_sm90", {"d_qk": 576, "paged": True}, "sm_90a"),
    ("mla_sparse_prefill_sm90_h16", {"d_qk": 512, "paged": True, "qk_group": 4}, "sm_90a"),
    ("mla_sparse_prefill_sm90_h16", {"d_qk": 576, "paged": False, "gather": "bulk", "row_pad": 16}, "sm_90a"),
])
def test_two_pool_kernels_compile_without_spills(name, values, target):
    from mlagen.compiler import for_target

    v = variant.make(spec.load(name), dict(values, kv_format="bf16"))
    src = render.render(v)
    assert "int extra_num_kv;" in src.text   # the parameter struct carries the second pool
    b = for_target(target).compile(src, target)
    assert b.resources.spill_stores == 0 and b.resources.spill_loads == 0, b.log


def test_only_two_pool_specs_serve_a_two_pool_call(tmp_path):
    from mlagen.errors import SpecError
    from mlagen.families.mla_sparse_prefill import FAMILY, compile as sp_compile

    call = type("C", (), {"d_qk": 512, "page_size": 0, "kv_format": "bf16", "extra": object()})()
    one = type("C", (), {"d_qk": 512, "page_size": 0, "kv_format": "bf16", "extra": None})()
    for name, two in (("mla_sparse_prefill_sm90", True), ("mla_sparse_prefill_sm90_h16", True),
                      ("mla_sparse_prefill_sm80", False)):
        s = spec.load(name)
        assert sp_compile.accepts(s, call) == two and sp_compile.accepts(s, one)
        assert (FAMILY.refuses(s, FAMILY.shapes()["V1"]) is None) == two
        assert FAMILY.refuses(s, FAMILY.shapes()["V5"]) is None   # one pool: the window
    assert sp_compile.two_pool_targets() == ["sm_90a"]
    from pathlib import Path

    text = Path(spec.load("mla_sparse_prefill_sm90").path).read_text().replace("two_pools: true", "two_pools: 2")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    (tmp_path / "mla_sparse_prefill_sm90.cu.j2").write_text("")
    with pytest.raises(SpecError, match="problem.two_pools"):
        spec.load(bad)


def test_window_kernel_compiles():
    from mlagen.compiler import for_target

    b = for_target("sm_90a").compile(sp_window.source(), "sm_90a")
    assert b.resources.spill_stores == 0
    assert "WindowParams" in sp_window.source().text


def _brute(q, rows1, idx1, len1, rows2, idx2, len2, scale, sink):
    """Token t's keys: its valid entries of pool 1 then of pool 2, one softmax (float64 loops)."""
    sq, heads, _ = q.shape
    out = torch.zeros(sq, heads, 512, dtype=torch.float64)
    ml = torch.full((sq, heads), -math.inf, dtype=torch.float64)
    lse = torch.full((sq, heads), math.inf, dtype=torch.float64)
    for t in range(sq):
        keys = [rows1[int(i)] for p, i in enumerate(idx1[t]) if 0 <= i < rows1.shape[0] and p < len1[t]]
        keys += [rows2[int(i)] for p, i in enumerate(idx2[t]) if 0 <= i < rows2.shape[0] and p < len2[t]]
        if not keys:
            continue
        g = torch.stack(keys).double()
        s = (q[t].double() @ g.T) * scale
        m = s.amax(-1)
        e = torch.exp(s - m[:, None])
        den = e.sum(-1) + (torch.exp(sink.double() - m) if sink is not None else 0)
        out[t] = (e @ g[:, :512]) / den[:, None]
        ml[t], lse[t] = m, m + torch.log(e.sum(-1))
    return out, ml, lse


@pytest.mark.parametrize("paged", [False, True])
def test_reference_is_one_softmax_over_both_pools(paged):
    g = torch.Generator().manual_seed(7)
    sq, heads, k1, k2 = 6, 3, 5, 9
    q = torch.randn(sq, heads, 512, generator=g).to(torch.bfloat16)
    kv1 = torch.randn(11, 512, generator=g).to(torch.bfloat16)
    kv2 = torch.randn(4, 8, 512, generator=g).to(torch.bfloat16)[:, :4] if paged else \
        torch.randn(16, 1, 512, generator=g).to(torch.bfloat16)
    rows2 = sp_ref.kv_rows(kv2)
    idx1 = torch.randint(-2, 14, (sq, k1), generator=g, dtype=torch.int32)
    idx2 = torch.randint(-2, 19, (sq, k2), generator=g, dtype=torch.int32)
    idx1[0], idx2[0] = -1, 99          # a row with no key
    idx2[1, :4] = 3                    # duplicates across the list
    len1 = torch.tensor([5, 5, 0, 2, 9, 1], dtype=torch.int32)
    len2 = torch.tensor([9, 3, 0, 9, 20, 0], dtype=torch.int32)   # row 2: no key in either
    sink = torch.tensor([0.2, math.inf, -1.0])
    got = sp_ref.reference(q, kv1, idx1, softmax_scale=0.05, topk_length=len1, attn_sink=sink, extra_kv=kv2,
                           extra_indices=idx2.view(sq, 1, k2), extra_topk_length=len2)
    want = _brute(q, kv1, idx1, len1.tolist(), rows2, idx2, len2.tolist(), 0.05, sink)
    for a, b in zip(got, want):
        assert torch.equal(torch.isinf(a), torch.isinf(b))
        fin = torch.isfinite(b)
        assert torch.allclose(a[fin], b[fin], atol=1e-12)
    assert (got[0][0] == 0).all() and (got[2][2] == math.inf).all() and (got[1][2] == -math.inf).all()
    # Without lengths, the concatenation is the plain one (pool 2's rows moved by N1).
    rows, ids = sp_ref.concatenated(kv1, idx1, kv2, idx2)
    assert rows.shape == (11 + rows2.shape[0], 512)
    ok2 = (idx2 >= 0) & (idx2 < rows2.shape[0])
    assert torch.equal(ids[:, k1:], torch.where(ok2, idx2 + 11, -1).to(torch.int32))


def test_problem_key_counts_both_pools():
    extra = type("P", (), {"num_kv": 32768})()
    call = type("C", (), {"d_qk": 512, "heads": 64, "topk": 128, "keys": 640, "page_size": 64, "num_kv": 131072,
                          "extra": extra})()
    assert str(sp_problem.problem_key(call)) == "d512/h64/k1024/s262144/paged"   # both pools' keys and rows


def _pool_args(**kw):
    base = dict(extra_kv=torch.zeros(10, 512, dtype=torch.bfloat16), extra_indices=torch.zeros(4, 3, dtype=torch.int32),
                extra_topk_length=None, extra_kv_format=None)
    base.update(kw)
    return base


@pytest.mark.parametrize("change, kind, match", [
    ({"extra_kv": None}, ValueError, r"^mla_sparse_prefill: extra_kv: extra_kv and extra_indices come together"),
    ({"extra_indices": None}, ValueError, r"^mla_sparse_prefill: extra_indices: extra_kv and extra_indices"),
    ({"extra_kv": None, "extra_indices": None, "extra_topk_length": torch.zeros(4, dtype=torch.int32)}, ValueError,
     r"^mla_sparse_prefill: extra_topk_length: given without"),
    ({"extra_kv": torch.zeros(10, 576, dtype=torch.bfloat16)}, ValueError, r"^mla_sparse_prefill: extra_kv: last dim"),
    ({"extra_kv": torch.zeros(10, 512)}, TypeError, r"^mla_sparse_prefill: extra_kv: dtype must be torch.bfloat16"),
    ({"extra_indices": torch.zeros(5, 3, dtype=torch.int32)}, ValueError,
     r"^mla_sparse_prefill: extra_indices: has 5 rows, q has 4"),
    ({"extra_indices": torch.zeros(4, 2, 3, dtype=torch.int32)}, ValueError,
     r"^mla_sparse_prefill: extra_indices: expected \[Sq, topk\] or \[Sq, 1, topk\]"),
    ({"extra_indices": torch.zeros(4, 3, dtype=torch.int64)}, TypeError,
     r"^mla_sparse_prefill: extra_indices: dtype must be torch.int32"),
    ({"extra_topk_length": torch.zeros(3, dtype=torch.int32)}, ValueError,
     r"^mla_sparse_prefill: extra_topk_length: expected shape \(4,\)"),
    ({"extra_kv_format": "fp8_v32"}, ValueError, r"^mla_sparse_prefill: extra_kv_format: 'fp8_v32' rows hold d_qk 576"),
    ({"extra_kv_format": "int4"}, ValueError, r"^mla_sparse_prefill: extra_kv_format: 'int4' is not one of"),
    ({"extra_kv_format": 3}, TypeError, r"^mla_sparse_prefill: extra_kv_format: 3 is not one of"),
])
def test_extra_pool_errors_name_the_argument(change, kind, match):
    args = _pool_args(**change)
    with pytest.raises(kind, match=match):
        sp_call._extra_pool(torch, args["extra_kv"], args["extra_indices"], args["extra_topk_length"],
                            args["extra_kv_format"], "bf16", 512, 4, None, 10)


def test_extra_pool_layouts():
    pool = sp_call._extra_pool(torch, torch.zeros(6, 16, 512, dtype=torch.bfloat16)[:, :8],
                               torch.zeros(4, 1, 3, dtype=torch.int32), None, None, "bf16", 512, 4, None, 10)
    assert (pool.num_kv, pool.page_size, pool.kv_row_stride, pool.kv_page_stride, pool.topk) == (48, 8, 512, 8192, 3)
    with pytest.raises(ValueError, match=r"^mla_sparse_prefill: extra_kv: the two pools hold 2147483640 \+ 10 rows"):
        sp_call._extra_pool(torch, torch.zeros(10, 512, dtype=torch.bfloat16), torch.zeros(4, 3, dtype=torch.int32),
                            None, None, "bf16", 512, 4, None, 2**31 - 8)
    assert sp_call.as_paged(0, 512) == (1, 512) and sp_call.as_paged(100, 576) == (100, 57600)


def test_extra_pool_needs_cuda_through_the_public_call():
    import mlagen

    q = torch.zeros(4, 8, 512, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="q: must be a CUDA tensor"):
        mlagen.mla_sparse_prefill(q, torch.zeros(10, 512, dtype=torch.bfloat16), torch.zeros(4, 3, dtype=torch.int32),
                                  softmax_scale=0.1, **_pool_args())
    with pytest.raises(ValueError, match="extra_kv: a two-pool call takes q as"):
        mlagen.mla_sparse_prefill(q.view(2, 2, 8, 512), torch.zeros(10, 512, dtype=torch.bfloat16),
                                  torch.zeros(2, 2, 3, dtype=torch.int32), softmax_scale=0.1, **_pool_args())


@pytest.mark.parametrize("kw, kind, match", [
    ({"window": 0}, ValueError, r"^window_indices: window: expected a positive integer, got 0"),
    ({"window": 1.5}, TypeError, r"^window_indices: window: expected a positive integer"),
    ({"cu_seqlens_k": None}, ValueError, r"^window_indices: cu_seqlens_k: give exactly one of"),
    ({"positions": torch.zeros(3, dtype=torch.int32)}, ValueError, r"^window_indices: cu_seqlens_k: give exactly one"),
    ({"num_tokens": None}, ValueError, r"^window_indices: num_tokens: the number of query tokens"),
    ({"num_tokens": -1}, ValueError, r"^window_indices: num_tokens: expected a non-negative integer"),
    ({"num_tokens": 2.0}, TypeError, r"^window_indices: num_tokens: expected a non-negative integer"),
    ({"page_size": 64}, ValueError, r"^window_indices: page_size: given without block_table"),
    ({"block_table": torch.zeros(2, 3, dtype=torch.int32)}, ValueError,
     r"^window_indices: page_size: expected a positive integer with block_table"),
    ({}, ValueError, r"^window_indices: cu_seqlens_q: must be a CUDA tensor"),
])
def test_window_argument_errors_name_the_argument(kw, kind, match):
    args = dict(cu_seqlens_k=torch.tensor([0, 3, 5], dtype=torch.int32), num_tokens=4, window=128)
    args.update(kw)
    with pytest.raises(kind, match=match):
        sp_window.check(torch.tensor([0, 2, 4], dtype=torch.int32), **args)


def test_window_positions_need_a_block_table():
    with pytest.raises(ValueError, match=r"^window_indices: block_table: positions address the raw pool"):
        sp_window.check(torch.tensor([0, 2], dtype=torch.int32), positions=torch.zeros(2, dtype=torch.int32))


def test_window_reference_crosses_sequence_and_page_starts():
    cu_q = torch.tensor([0, 2, 3], dtype=torch.int32)          # sequence 0: 2 new tokens, sequence 1: 1
    cu_k = torch.tensor([0, 3, 8], dtype=torch.int32)          # 1 and 4 cached tokens before them
    flat = sp_window.window_reference(cu_q, cu_k, window=4)
    assert flat.tolist() == [[-1, -1, 0, 1], [-1, 0, 1, 2], [4, 5, 6, 7]]
    table = torch.tensor([[5, 2], [7, -1]], dtype=torch.int32)  # pages of 2 rows
    paged = sp_window.window_reference(cu_q, cu_k, window=4, block_table=table, page_size=2)
    assert paged.tolist() == [[-1, -1, 10, 11], [-1, 10, 11, 4], [15, -1, -1, -1]]
    positions = torch.tensor([1, 2, 4], dtype=torch.int32)
    assert sp_window.window_reference(cu_q, positions=positions, window=4, block_table=table,
                                      page_size=2).tolist() == paged.tolist()


def test_v4_shapes_parse_and_count_both_pools():
    from mlagen.families.mla_sparse_prefill import FAMILY

    shapes = FAMILY.shapes()
    v1, v3, v5 = shapes["V1"], shapes["V3"], shapes["V5"]
    assert (v1.heads, v1.topk, v1.s_kv, v1.window, v1.raw_kv, v1.d_qk) == (64, 512, 32768, 128, 131072, 512)
    assert FAMILY.flops(v1) == 2 * 4096 * 64 * 640 * 1024 and FAMILY.flops(v5) == 2 * 4096 * 64 * 128 * 1024
    assert v3.hca and v3.topk == v3.s_kv == 1024
    assert [shapes[f"M{i}"].s_kv for i in range(1, 9)] == [8192, 32768, 49152, 65536] * 2
    assert {(shapes[f"M{i}"].heads, shapes[f"M{i}"].topk) for i in range(1, 9)} == {(64, 512), (128, 1024)}
    assert str(sp_problem.problem_key(v1)) == "d512/h64/k1024/s262144/flat"   # 131072 raw + 32768 rows
    text = sp_problem.describe_shape(v3)
    assert text == "sq=4096,h=64,topk=1024,skv=1024,d=512,sink=1,window=128,raw=131072,hca=1"
    assert sp_problem.parse_shape(text, "V3") == v3
    for bad in ("sq=8,h=2,topk=4,skv=0,window=4,raw=64", "sq=8,h=2,topk=4,skv=9,raw=64",
                "sq=80,h=2,topk=4,skv=9,window=4,raw=64", "sq=8,h=2,topk=4,skv=9,window=4,raw=64,hca=1"):
        with pytest.raises(ValueError):
            sp_problem.parse_shape(bad)


@pytest.mark.parametrize("layer", ["csa", "hca", "sliding"])
def test_v4_inputs_and_the_server_concatenation(layer):
    """On the CPU: the window lists cross page and sequence starts through the shuffled block
    table, the compressed entries are visible ones, and the concatenated pool's one-pool reference
    equals the two-pool reference."""
    from mlagen.families.mla_sparse_prefill import FAMILY, v4

    extra = {"csa": ",topk=20,skv=300", "hca": ",topk=10,skv=10,hca=1", "sliding": ",topk=0,skv=0"}[layer]
    shape = sp_problem.parse_shape(f"sq=50,h=3,d=512,window=16,raw=1200{extra}", "t")
    inputs = FAMILY.make_inputs(shape, "cpu", seed=1)
    win = inputs["indices"]
    assert win.shape == (50, 16) and (win >= 0).all()           # position 1150 - 15 >= 0
    # Entry j of token t is raw position 1150 + t - 15 + j, wherever its page lies.
    pos = 1150 + torch.arange(50).unsqueeze(1) - 15 + torch.arange(16)
    local = inputs["window_local"].long()
    assert torch.equal(inputs["window_rows"][local], win.long()) and torch.equal(local, pos - 1135)
    if layer != "sliding":
        ids = inputs["extra_indices"]
        visible = (1150 + torch.arange(50) + 1) // (1200 // shape.s_kv)
        assert ((ids < visible.unsqueeze(1)) | (ids == -1)).all()
        if layer == "csa":
            assert all(len(set(r.tolist())) == 20 for r in ids)   # without repetition
    two = FAMILY.reference(shape, inputs)
    one = v4.one_pool_inputs(inputs)
    ref_one = sp_ref.reference(one["q"], one["kv"], one["indices"], softmax_scale=one["softmax_scale"],
                               attn_sink=one["attn_sink"])
    for a, b in zip(two, ref_one):
        assert torch.allclose(a, b, atol=1e-10)


def test_flashmla_peers_run_on_the_concatenated_pool():
    """The FlashMLA peers of a two-pool shape, with PyTorch standing in for the built library:
    the pool concatenated once (flashmla) or by every call (flashmla-concat) gives the two-pool
    reference; a one-pool shape has nothing to concatenate."""
    from mlagen.errors import BenchError
    from mlagen.families.mla_sparse_prefill import FAMILY, peers

    calls = []

    def fake_fwd(q, kv, indices, scale, d_v, sink, length):
        calls.append((kv.shape, indices.shape))
        return peers.naive(q, kv, indices, scale, sink, length)

    shape = sp_problem.parse_shape("sq=20,h=3,topk=100,skv=400,d=512,window=28,raw=800", "t")
    inputs = FAMILY.make_inputs(shape, "cpu", seed=2)
    ref = FAMILY.reference(shape, inputs)
    for peer in (peers.flashmla_peer, peers.flashmla_concat_peer):
        prepared = peer(shape, inputs, sparse_fwd=fake_fwd)
        got = prepared.checked_call()
        assert FAMILY.compare(got, ref).ok, peer
        assert "concatenat" in prepared.note
    assert calls[0] == ((47 + 400, 1, 512), (20, 1, 128)) == calls[-1]   # 19 + 28 window rows, then the pool
    sliding = sp_problem.parse_shape("sq=20,h=3,topk=0,skv=0,d=512,window=28,raw=800", "t")
    with pytest.raises(BenchError, match="flashmla-concat is for two-pool"):
        peers.flashmla_concat_peer(sliding, FAMILY.make_inputs(sliding, "cpu"), sparse_fwd=fake_fwd)


class _RecordingKernel:
    def __init__(self):
        self.launches = []

    def launch(self, grid, block, smem, stream, params):
        self.launches.append((grid, bytes(params.data)))


def _call_of(torch_, extra: str):
    """A validated Call on CPU tensors (what prepare returns, without its CUDA check)."""
    from mlagen.families.mla_sparse_prefill.call import Call, Pool

    q = torch_.zeros(4, 8, 512, dtype=torch_.bfloat16)
    kv = torch_.zeros(0 if extra == "first_empty" else 30, 512, dtype=torch_.bfloat16)
    idx = torch_.zeros(4, 3, dtype=torch_.int32)
    outs = (torch_.zeros(4, 8, 512, dtype=torch_.bfloat16), torch_.zeros(4, 8), torch_.zeros(4, 8))
    pool = None
    if extra != "none":
        x_kv, x_idx = torch_.zeros(5, 16, 512, dtype=torch_.bfloat16)[:, :8], torch_.zeros(4, 7, dtype=torch_.int32)
        pool = Pool(x_kv, x_idx, torch_.zeros(4, dtype=torch_.int32), 7, 40, 512, 8192, 8)
    call = Call(q, kv, idx, None, None, *outs, 4, 8, 3, 512, kv.shape[0], 512, 0, 0, 0.1, "bf16", pool)
    return call


@pytest.mark.parametrize("extra", ["none", "two", "first_empty"])
def test_a_sparse_plan_writes_what_the_full_pack_writes(extra, monkeypatch):
    """The launch plan of a call (one pool, two pools, an empty first pool) writes the bytes the
    full path's pack writes, with every pointer taken from the new call's tensors."""
    from types import SimpleNamespace

    from mlagen.families.mla_sparse_prefill import entry

    call = _call_of(torch, extra)
    kernel = _RecordingKernel()
    sel = SimpleNamespace(spec=SimpleNamespace(abi="gather", problem=()), env={"block_h": 64},
                          resources=SimpleNamespace(threads=384, smem_bytes=1000), kernel=kernel)
    monkeypatch.setattr("mlagen.runtime.current_stream", lambda torch_, device: 0)
    x = call.extra
    plan = entry._Plan.of(sel, call, call.q, call.kv, call.indices, None if x is None else x.kv,
                          None if x is None else x.indices)
    # A second call of the same signature, other tensors.
    other = _call_of(torch, extra)
    ox = other.extra
    plan.run(torch, other.q, other.kv, other.indices, None, None, other.out, other.max_logits, other.lse,
             None if ox is None else ox.kv, None if ox is None else ox.indices, None if ox is None else ox.topk_length)
    assert kernel.launches[-1][1] == bytes(entry.pack(other).data)
    values = entry._pack_values(other, "gather")
    assert values["extra_topk"] == (0 if extra == "none" else 7)
    if extra == "first_empty":
        assert values["kv"] == ox.kv.data_ptr()   # the kernel's base is the second pool's


def test_the_traced_two_pool_call_is_the_operator_with_the_extra_arguments():
    import mlagen
    from torch._subclasses.fake_tensor import FakeTensorMode

    schema = str(torch.ops.mlagen.mla_sparse_prefill.default._schema)
    assert "Tensor? extra_kv=None, Tensor? extra_indices=None, Tensor? extra_topk_length=None" in schema
    with FakeTensorMode():
        q = torch.empty(4, 8, 512, dtype=torch.bfloat16, device="cuda")
        kv = torch.empty(10, 512, dtype=torch.bfloat16, device="cuda")
        idx = torch.empty(4, 3, dtype=torch.int32, device="cuda")
        out, ml, lse = mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=0.1, extra_kv=kv, extra_indices=idx)
        assert (tuple(out.shape), tuple(ml.shape), tuple(lse.shape)) == ((4, 8, 512), (4, 8), (4, 8))
