"""Dense MLA prefill on the GPU against a float32 reference written from MLA.md section 1.

Every case draws fresh random inputs, poisons ``out`` and ``lse`` with NaN, and checks that
every element was written. Each case runs on every kernel spec that targets the device.
"""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

from mlagen import api  # noqa: E402
from mlagen.dispatch import dispatcher, family_specs  # noqa: E402
from mlagen.families.mla_prefill.reference import reference  # noqa: E402
from mlagen.runtime import device_info  # noqa: E402

OUT_REL_TOL = 1e-2   # bf16 P and output rounding; fp32 accumulation
OUT_ABS_TOL = 2e-2
LSE_ABS_TOL = 2e-3


def _specs():
    if not torch.cuda.is_available():
        return ["mla_prefill_sm80"]
    target = device_info(torch.cuda.current_device()).target.name
    # bf16-input specs; the FP8-input ones (problem.dtype fp8_*) run in test_fp8_gpu.py.
    return [s.name for s in family_specs("mla_prefill") if target in s.targets and dict(s.problem)["dtype"] == "bf16"]


SPECS = _specs()


def make(lq, lk, heads, rope="shared", seed=0, cu=None, strided=False):
    """Random inputs; ``lq``/``lk`` are lists of per-sequence lengths (packed) or ints."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    tq = sum(lq) if isinstance(lq, list) else lq
    tk = sum(lk) if isinstance(lk, list) else lk

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)

    if strided:
        # Views with padded rows and heads: only the last dimension is contiguous.
        q = rnd(tq, heads + 1, 256)[:, 1:, :192]
        kv = rnd(tk, heads, 384)
        k, v = kv[:, :, :128], kv[:, :, 256:384]
    else:
        q, k, v = rnd(tq, heads, 192), rnd(tk, heads, 128), rnd(tk, heads, 128)
    if rope == "shared":
        k_rope = rnd(tk, 1, 64)
    elif rope == "per_head":
        k_rope = rnd(tk, heads, 64)
    else:
        k = torch.cat([k, rnd(tk, heads, 64)], dim=-1)
        k_rope = None
    cu_q = cu_k = None
    if isinstance(lq, list):
        cu_q = torch.tensor([0] + list(_cumsum(lq)), dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0] + list(_cumsum(lk)), dtype=torch.int32, device="cuda")
    return q, k, v, k_rope, cu_q, cu_k


def _cumsum(xs):
    total = 0
    for x in xs:
        total += x
        yield total


def run_and_check(spec, q, k, v, k_rope, cu_q, cu_k, causal, scale=None, out_strided=False):
    tq, heads = q.shape[0], q.shape[1]
    if out_strided:
        out = torch.full((tq, heads, 256), float("nan"), dtype=torch.bfloat16, device="cuda")[:, :, 64:192]
    else:
        out = torch.full((tq, heads, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((tq, heads), float("nan"), dtype=torch.float32, device="cuda")
    got, got_lse = api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal,
                                   softmax_scale=scale, out=out, lse=lse, kernel=spec)
    torch.cuda.synchronize()
    assert got.data_ptr() == out.data_ptr() and got_lse.data_ptr() == lse.data_ptr()
    ref, ref_lse = reference(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal,
                             softmax_scale=scale)
    got32 = got.float()
    assert not torch.isnan(got32).any(), f"{torch.isnan(got32).sum().item()} output elements unwritten or NaN"
    assert not torch.isnan(got_lse).any(), f"{torch.isnan(got_lse).sum().item()} lse elements unwritten or NaN"
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(got_lse), empty), "rows that see no key must have lse = +inf, and only those"
    assert (got_lse[empty] > 0).all()
    assert (got32[empty.unsqueeze(-1).expand_as(got32)] == 0).all(), "rows that see no key must output 0"
    if (~empty).any():
        diff = (got32 - ref)[~empty]
        rel = diff.norm() / ref[~empty].norm().clamp_min(1e-6)
        assert rel < OUT_REL_TOL, f"relative L2 error {rel:.2e}"
        assert diff.abs().max() < OUT_ABS_TOL, f"max abs error {diff.abs().max():.2e}"
        lse_err = (got_lse - ref_lse)[~empty].abs().max()
        assert lse_err < LSE_ABS_TOL, f"lse max abs error {lse_err:.2e}"
    return got, got_lse


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("heads", [1, 16, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("length", [1, 17, 130, 385])
def test_single_sequence(spec, heads, causal, length):
    q, k, v, k_rope, _, _ = make(length, length, heads, seed=length * 7 + heads)
    run_and_check(spec, q, k, v, k_rope, None, None, causal)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("heads", [1, 16, 128])
@pytest.mark.parametrize("causal", [True, False])
def test_ragged_batch(spec, heads, causal):
    # Length-1 sequences, an empty sequence, lengths off every tile size, a cached prefix.
    lq = [5, 1, 0, 129, 77, 1, 300]
    lk = [5, 1, 0, 200, 77, 64, 301]
    q, k, v, k_rope, cu_q, cu_k = make(lq, lk, heads, seed=heads)
    run_and_check(spec, q, k, v, k_rope, cu_q, cu_k, causal)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("causal", [True, False])
def test_sequences_without_keys(spec, causal):
    # Queries whose sequence has no keys see nothing: out = 0, lse = +inf, never NaN.
    lq = [3, 40, 0, 2]
    lk = [0, 50, 7, 0]
    q, k, v, k_rope, cu_q, cu_k = make(lq, lk, 16, seed=3)
    run_and_check(spec, q, k, v, k_rope, cu_q, cu_k, causal)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("heads", [16, 128])
def test_prefix_chunk(spec, heads):
    # Chunked prefill: 100 new queries after a 900-token cached prefix (Lk > Lq, bottom-right causal).
    q, k, v, k_rope, _, _ = make(100, 1000, heads, seed=11)
    run_and_check(spec, q, k, v, k_rope, None, None, True)


@pytest.mark.parametrize("spec", SPECS)
def test_more_queries_than_keys(spec):
    # Causal with Lk < Lq: the first Lq - Lk rows see no key. Non-causal Lq != Lk is legal too.
    q, k, v, k_rope, _, _ = make(300, 50, 16, seed=5)
    run_and_check(spec, q, k, v, k_rope, None, None, True)
    run_and_check(spec, q, k, v, k_rope, None, None, False)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("rope", ["shared", "per_head", "folded"])
@pytest.mark.parametrize("causal", [True, False])
def test_rope_layouts(spec, rope, causal):
    q, k, v, k_rope, cu_q, cu_k = make([100, 33], [150, 33], 16, rope=rope, seed=2)
    run_and_check(spec, q, k, v, k_rope, cu_q, cu_k, causal)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("causal", [True, False])
def test_strided_inputs_and_output(spec, causal):
    q, k, v, k_rope, cu_q, cu_k = make([70, 190], [70, 250], 16, strided=True, seed=4)
    assert not q.is_contiguous() and not k.is_contiguous() and not v.is_contiguous()
    run_and_check(spec, q, k, v, k_rope, cu_q, cu_k, causal, out_strided=True)


@pytest.mark.parametrize("spec", SPECS)
def test_softmax_scale(spec):
    q, k, v, k_rope, _, _ = make(200, 200, 16, seed=9)
    run_and_check(spec, q, k, v, k_rope, None, None, True, scale=0.3)


@pytest.mark.parametrize("spec", SPECS)
def test_deterministic(spec):
    q, k, v, k_rope, cu_q, cu_k = make([300, 257], [300, 400], 16, seed=6)
    a, la = run_and_check(spec, q, k, v, k_rope, cu_q, cu_k, True)
    a, la = a.clone(), la.clone()
    b, lb = run_and_check(spec, q, k, v, k_rope, cu_q, cu_k, True)
    assert torch.equal(a, b) and torch.equal(la, lb), "two runs on the same input differ: a race"


@pytest.mark.parametrize("spec", SPECS)
def test_cuda_graph_capture(spec):
    q, k, v, k_rope, cu_q, cu_k = make([128, 64], [128, 96], 16, seed=8)
    out = torch.empty(q.shape[0], 16, 128, dtype=torch.bfloat16, device="cuda")
    api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, kernel=spec)  # warm up
    graph = torch.cuda.CUDAGraph()
    out.fill_(float("nan"))
    with torch.cuda.graph(graph):
        api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, kernel=spec)
    for _ in range(2):  # twice, with an eager call between: the dynamic scheduler's counter is re-zeroed
        q.copy_(torch.randn_like(q, dtype=torch.float32).to(torch.bfloat16))
        graph.replay()
        api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, kernel=spec)
        torch.cuda.synchronize()
        ref, _ = reference(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
        rel = (out.float() - ref).norm() / ref.norm()
        assert rel < OUT_REL_TOL


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the sm90 kernel needs a Hopper GPU")
def test_sm90_dynamic_scheduler_on_two_streams():
    """The dynamic scheduler's tile counter is kept per stream (mla_prefill/tma.py: tile_counter):
    launches on two streams at once, several in a row on each, all match the reference."""
    from mlagen import spec, variant

    kernel = variant.make(spec.load("mla_prefill_sm90"), {"scheduler": "dynamic", "mask": "causal"})
    problems = [make([900, 1, 640], [900, 1, 700], 16, seed=30 + i) for i in range(2)]
    outs = [[None] * 3 for _ in problems]
    streams = [torch.cuda.Stream() for _ in problems]
    torch.cuda.synchronize()
    for rep in range(3):
        for i, ((q, k, v, k_rope, cu_q, cu_k), stream) in enumerate(zip(problems, streams)):
            with torch.cuda.stream(stream):
                outs[i][rep] = api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                               kernel=kernel)[0]
    torch.cuda.synchronize()
    for (q, k, v, k_rope, cu_q, cu_k), got in zip(problems, outs):
        ref, _ = reference(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
        for out in got:
            assert ((out.float() - ref).norm() / ref.norm()).item() < OUT_REL_TOL


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the sm90 kernel needs a Hopper GPU")
def test_sm90_tile_counter_ring_wraps(monkeypatch):
    """Each dynamic-scheduler launch takes the next zeroed counter of its stream's ring; a wrap
    zeroes the ring behind the launches of the last lap (a ring of 3 here: eight launches wrap it
    twice), and every output matches the reference. Launch plans take counters the same way."""
    from mlagen import spec, variant
    from mlagen.families.mla_prefill import tma

    monkeypatch.setattr(tma, "RING", 3)
    monkeypatch.setattr(tma, "_counters", {})
    kernel = variant.make(spec.load("mla_prefill_sm90"), {"scheduler": "dynamic", "mask": "causal"})
    q, k, v, k_rope, cu_q, cu_k = make([900, 1, 640], [900, 1, 700], 16, seed=40)
    ref, _ = reference(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True)
    outs = [api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, kernel=kernel)[0]
            for _ in range(8)]
    torch.cuda.synchronize()
    for out in outs:
        assert ((out.float() - ref).norm() / ref.norm()).item() < OUT_REL_TOL
    ring, = tma._counters.values()
    assert ring.next == 2   # slots 0 1 2 | wrap 0 1 2 | wrap 0 1
    # Two threads on one stream: a ring each (one ring shared by both could hand out a slot before
    # a wrap and launch it after the wrap's memset).
    import threading

    got = [[], []]

    def launches(i):
        for _ in range(7):
            got[i].append(api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                          kernel=kernel)[0])

    threads = [threading.Thread(target=launches, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert len(tma._counters) == 3
    for out in got[0] + got[1]:
        assert ((out.float() - ref).norm() / ref.norm()).item() < OUT_REL_TOL


def test_dispatch_is_memoised_and_compiles_once():
    q, k, v, k_rope, _, _ = make(64, 64, 16, seed=1)
    d = dispatcher()
    d.clear()
    api.mla_prefill(q, k, v, k_rope=k_rope)
    first = dict(d._memo)
    api.mla_prefill(q, k, v, k_rope=k_rope)
    assert d._memo == first and len(first) == 1
    selection = next(iter(first.values()))
    d.clear()
    api.mla_prefill(q, k, v, k_rope=k_rope)
    again = next(iter(d._memo.values()))
    assert again.binary.key == selection.binary.key and again.binary.from_cache, "second build must hit the cache"


def test_rejects_bad_arguments(monkeypatch):
    from mlagen.errors import LaunchError

    q, k, v, k_rope, _, _ = make(16, 16, 4, seed=0)
    with pytest.raises(TypeError, match="q: dtype") as info:
        api.mla_prefill(q.float(), k, v, k_rope=k_rope)
    assert isinstance(info.value, LaunchError)  # still catchable the old way
    with pytest.raises(ValueError, match="k_rope"):
        api.mla_prefill(q, k, v, k_rope=k_rope[:, :, :32])
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=torch.tensor([0, 16], dtype=torch.int32, device="cuda"))
    bad = torch.tensor([0, 10, 8, 16], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="non-decreasing"):
        api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=bad, cu_seqlens_k=bad, check_seqlens=True)
    monkeypatch.setenv("MLAGEN_CHECK_SEQLENS", "1")
    with pytest.raises(ValueError, match="non-decreasing"):
        api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=bad, cu_seqlens_k=bad)
    monkeypatch.delenv("MLAGEN_CHECK_SEQLENS")
    good = torch.tensor([0, 6, 16], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="max_seqlen_q: 8 is shorter than the longest sequence"):
        api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=good, cu_seqlens_k=good, max_seqlen_q=8,
                        check_seqlens=True)
    with pytest.raises(ValueError, match="softmax_scale"):
        api.mla_prefill(q, k, v, k_rope=k_rope, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        api.mla_prefill(q, k, v.transpose(0, 2).contiguous().transpose(0, 2), k_rope=k_rope)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("garbage", [[0, 1000, -5, 64], [1000, -5, 3, 64], [-7, 64, 0, 2**31 - 1],
                                     [64, 0, 64, 0]])
def test_unchecked_garbage_seqlens_stay_in_bounds(spec, garbage):
    # With checking off (the default), nonsense offsets must not fault: the kernel clamps them.
    q, k, v, k_rope, _, _ = make(64, 64, 4, seed=0)
    cu = torch.tensor(garbage, dtype=torch.int32, device="cuda")
    for causal in (True, False):
        api.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=causal, kernel=spec)
    torch.cuda.synchronize()


def test_empty_inputs():
    q, k, v, k_rope, _, _ = make(0, 10, 4, seed=0)
    out, lse = api.mla_prefill(q, k, v, k_rope=k_rope)
    assert out.shape == (0, 4, 128) and lse.shape == (0, 4)
    q, k, v, k_rope, _, _ = make(5, 0, 4, seed=0)
    out, lse = api.mla_prefill(q, k, v, k_rope=k_rope, causal=False)
    assert (out == 0).all() and torch.isinf(lse).all() and (lse > 0).all()
    assert math.isinf(lse[0, 0].item())


SCHEDULES = [
    {"scheduler": "dynamic", "epilogue": "tma", "order": "pingpong", "overlap": True},
    {"scheduler": "dynamic", "epilogue": "direct", "order": "pingpong", "overlap": True},
    {"scheduler": "persistent", "epilogue": "direct", "order": "none", "overlap": True},
    {"scheduler": "static", "epilogue": "tma", "order": "none", "overlap": False},
    {"scheduler": "dynamic", "epilogue": "direct", "order": "pingpong", "overlap": False},
    {"consumers": 1, "order": "none", "block_n": 160, "stages": 2},
    {"block_n": 64, "stages": 4, "swizzle_q": 64, "swizzle_k": 32, "swizzle_v": 64},
    {"block_n": 112, "producer_regs": 40, "consumer_regs": 232},
    {"load_warps": 1, "scheduler": "dynamic", "epilogue": "direct"},
    {"load_warps": 1, "scheduler": "persistent", "order": "none", "block_n": 80, "stages": 3},
    # Q in registers, also on schedulers that give a CTA several tiles (the next tile's Q is loaded
    # over the fragments' source after a proxy fence; without it, wrong lse: docs/notes.md).
    {"q_operand": "regs", "epilogue": "direct", "block_n": 112, "scheduler": "static"},
    {"q_operand": "regs", "epilogue": "direct", "scheduler": "dynamic", "order": "none", "load_warps": 2,
     "consumer_regs": 240},
    {"q_operand": "regs", "epilogue": "direct", "scheduler": "persistent", "load_warps": 2, "consumer_regs": 240},
    {"block_n": 80, "swizzle_q": 32, "swizzle_k": 64, "swizzle_v": 32, "order": "none"},
    {"q_operand": "regs", "epilogue": "direct", "block_n": 96, "order": "none", "scheduler": "static"},
    # Where the P V in flight is waited for and O rescaled (schedule_boundary keeps the late wait
    # after the softmax; the rescale runs under Q K^T or right after the softmax).
    {"pv_wait": "late", "rescale": "overlapped"},
    {"pv_wait": "late", "rescale": "first", "order": "none", "scheduler": "persistent", "epilogue": "direct"},
    {"pv_wait": "late", "rescale": "overlapped", "q_operand": "regs", "scheduler": "static", "epilogue": "direct",
     "block_n": 112},
    {"pv_wait": "early", "rescale": "first", "block_n": 96, "load_warps": 1},
    # The lazy maximum: O rescaled only when some row of the warp moved its maximum by > 2^8.
    {"rescale": "lazy"},
    {"rescale": "lazy", "overlap": False, "order": "none", "scheduler": "static", "epilogue": "direct"},
    {"rescale": "lazy", "pv_wait": "late", "epilogue": "vtma", "scheduler": "persistent", "cluster": 2},
    {"rescale": "lazy", "epilogue": "vtma", "load_warps": 1, "consumer_regs": 208},   # D6's record
    {"rescale": "lazy", "consumers": 3, "order": "none", "block_n": 80, "stages": 3, "load_warps": 1,
     "producer_regs": 24, "consumer_regs": 160},
    # The output staged in the last V stage (released after the TMA store has read it): the ragged
    # case also takes the predicated-store path, which must release the stage too.
    {"epilogue": "vtma"},
    {"epilogue": "vtma", "scheduler": "persistent", "cluster": 2},
    {"epilogue": "vtma", "q_operand": "regs", "scheduler": "static", "block_n": 128, "pv_wait": "late"},
    {"epilogue": "vtma", "consumers": 1, "order": "none", "block_n": 64, "stages": 3, "scheduler": "persistent"},
    # 2-CTA clusters sharing K/V tiles by multicast (the ragged case leaves a CTA with no rows, and
    # causal pairs where one CTA only releases the leading key tiles).
    {"cluster": 2, "scheduler": "persistent"},
    {"cluster": 2, "scheduler": "static", "order": "none", "overlap": False, "epilogue": "direct", "block_n": 64,
     "stages": 3},
    {"cluster": 2, "scheduler": "persistent", "consumers": 1, "order": "none", "load_warps": 1, "block_n": 96,
     "swizzle_v": 64},
    {"cluster": 2, "scheduler": "static", "q_operand": "regs", "epilogue": "direct", "block_n": 112},
    # Three consumer warpgroups (192-row tiles; 160 registers each beside a 24-register producer).
    {"consumers": 3, "order": "none", "block_n": 80, "load_warps": 1, "producer_regs": 24, "consumer_regs": 160},
    {"consumers": 3, "order": "none", "block_n": 64, "stages": 3, "load_warps": 1, "producer_regs": 24,
     "consumer_regs": 160, "rescale": "first", "epilogue": "direct", "scheduler": "persistent"},
    {"consumers": 3, "order": "none", "block_n": 80, "producer_regs": 24, "consumer_regs": 160, "cluster": 2,
     "scheduler": "static", "epilogue": "direct"},
    # The first key tile on its first half only where a warpgroup's rows see no further (the
    # diagonal of 64-row slices, sequence ends): with and without overlap (the half P V in the step
    # or after the loop), Q from registers, clusters, three warpgroups, half widths 64, 48, 80.
    {"diagonal": "half"},
    {"diagonal": "half", "rescale": "lazy", "epilogue": "vtma", "load_warps": 1, "consumer_regs": 208},
    {"diagonal": "half", "overlap": False, "order": "none", "scheduler": "static", "epilogue": "direct"},
    {"diagonal": "half", "q_operand": "regs", "epilogue": "direct", "block_n": 112, "scheduler": "static"},
    {"diagonal": "half", "cluster": 2, "scheduler": "persistent", "block_n": 96},
    {"diagonal": "half", "consumers": 1, "order": "none", "block_n": 160, "stages": 2},
    {"diagonal": "half", "consumers": 3, "order": "none", "block_n": 80, "stages": 3, "load_warps": 1,
     "producer_regs": 24, "consumer_regs": 160, "rescale": "lazy"},
]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the sm90 kernel needs a Hopper GPU")
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("causal", [True, False])
def test_sm90_schedules(schedule, causal):
    """Every barrier-schedule option on odd shapes: ragged, length 1, empty, prefix, no keys."""
    from mlagen import spec, variant

    v = variant.make(spec.load("mla_prefill_sm90"), {**schedule, "mask": "causal" if causal else "none"})
    q, k, v_, k_rope, cu_q, cu_k = make([5, 1, 0, 129, 300, 2], [5, 1, 0, 200, 300, 0], 16, seed=21)
    run_and_check(v, q, k, v_, k_rope, cu_q, cu_k, causal)
    q, k, v_, k_rope, _, _ = make(385, 385, 128, seed=22)
    run_and_check(v, q, k, v_, k_rope, None, None, causal)
    q, k, v_, k_rope, _, _ = make(100, 1000, 16, seed=25)  # a prefix: 100 queries after 900 cached keys
    run_and_check(v, q, k, v_, k_rope, None, None, causal)



# The three variants the 2026-11-23 global re-tune recorded as wrong_result (Q in registers on the
# dynamic and persistent schedulers), which gave wrong lse in 40 of 40 calls on D4 and D6 before the
# proxy fence between the Q fragments' ldmatrix and the q_empty arrive (sixteenth session).
Q_REGS_MULTI_TILE = [
    {"q_operand": "regs", "order": "none", "rescale": "overlapped", "scheduler": "dynamic", "epilogue": "direct",
     "load_warps": 2, "consumer_regs": 240},
    {"q_operand": "regs", "order": "pingpong", "rescale": "overlapped", "scheduler": "persistent",
     "epilogue": "direct", "load_warps": 2, "consumer_regs": 240},
    {"q_operand": "regs", "order": "pingpong", "rescale": "first", "scheduler": "dynamic", "epilogue": "direct",
     "load_warps": 1, "consumer_regs": 240},
]


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the sm90 kernel needs a Hopper GPU")
@pytest.mark.parametrize("schedule", Q_REGS_MULTI_TILE, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_sm90_q_in_registers_on_ctas_with_many_tiles(schedule):
    """D6's shape (32 x 512, 128 heads: 16384 tiles on 132 CTAs), so every CTA loads the next tile's
    Q over the one whose fragments it just read; outputs poisoned, float32 reference, three calls."""
    from mlagen import spec, variant

    v = variant.make(spec.load("mla_prefill_sm90"), {**schedule, "mask": "causal"})
    q, k, v_, k_rope, cu_q, cu_k = make([512] * 32, [512] * 32, 128, seed=41)
    for _ in range(3):
        run_and_check(v, q, k, v_, k_rope, cu_q, cu_k, True)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the sm90 kernel needs a Hopper GPU")
@pytest.mark.parametrize("rescale", ["lazy", "overlapped"])
@pytest.mark.parametrize("consumers", [2, 3])
@pytest.mark.parametrize("causal", [True, False])
def test_sm90_lazy_maximum_with_rising_scores(rescale, consumers, causal):
    """Scores that rise by far more than the lazy margin (2^8) from one key tile to the next, in the
    order the kernel visits them (last key tile first), and scores that stay flat: the kept maximum
    must move in time (else exp2 overflows) and the skipped rescales must not change the result."""
    from mlagen import spec, variant

    extra = {"order": "none", "block_n": 80, "stages": 3, "load_warps": 1, "producer_regs": 24,
             "consumer_regs": 160} if consumers == 3 else {}
    v = variant.make(spec.load("mla_prefill_sm90"), {"rescale": rescale, "consumers": consumers, **extra,
                                                     "mask": "causal" if causal else "none"})
    q, k, v_, k_rope, cu_q, cu_k = make([700, 1, 333], [700, 1, 333], 16, seed=31)
    # Key j's logits scaled by up to 40 towards the first keys, so every key tile's maximum is
    # tens of log2 units above the one visited before it; flat rows in the middle sequence.
    ramp = torch.linspace(40.0, 0.5, k.shape[0], device="cuda").view(-1, 1, 1)
    k = (k.float() * ramp).to(torch.bfloat16)
    k_rope = (k_rope.float() * ramp).to(torch.bfloat16)
    run_and_check(v, q, k, v_, k_rope, cu_q, cu_k, causal, scale=0.05)
    # Falling scores (the first tile visited holds the maximum): the kept maximum never moves.
    k = (k.float() / ramp * ramp.flip(0)).to(torch.bfloat16)
    k_rope = (k_rope.float() / ramp * ramp.flip(0)).to(torch.bfloat16)
    run_and_check(v, q, k, v_, k_rope, cu_q, cu_k, causal, scale=0.05)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the sm90 kernel needs a Hopper GPU")
@pytest.mark.parametrize("schedule", [{"scheduler": "dynamic"}, {"scheduler": "persistent", "order": "none"},
                                      {"scheduler": "persistent", "cluster": 2}, {"scheduler": "static", "cluster": 2},
                                      {"consumers": 3, "order": "none", "block_n": 80, "load_warps": 1,
                                       "producer_regs": 24, "consumer_regs": 160}],
                         ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_sm90_head_groups(schedule, monkeypatch):
    """The tile order (heads in groups, mla_prefill.cuh: query_tile) changes which CTA computes a
    tile, never the result: groups that do not divide the head count, one group of all heads and
    the launcher's own choice give bit-identical outputs, and they match the reference. 37 heads
    of 14 to 16 tiles each: more tiles than CTAs, so a persistent CTA takes several."""
    from mlagen import spec, variant

    for causal in (True, False):
        v = variant.make(spec.load("mla_prefill_sm90"), {**schedule, "mask": "causal" if causal else "none"})
        q, k, v_, k_rope, cu_q, cu_k = make([5, 1, 0, 129, 300, 2, 700], [5, 1, 0, 200, 300, 0, 700], 37, seed=26)
        outs = []
        for group in ("1", "3", "4", "7", "64", ""):  # "": the launcher's choice
            monkeypatch.setenv("MLAGEN_HEAD_GROUP", group)
            outs.append(run_and_check(v, q, k, v_, k_rope, cu_q, cu_k, causal))
        for out, lse in outs[1:]:
            assert torch.equal(out, outs[0][0]) and torch.equal(lse, outs[0][1])

@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="the sm90 kernel needs a Hopper GPU")
@pytest.mark.parametrize("schedule", [{"scheduler": "dynamic"}, {"scheduler": "persistent", "order": "none"},
                                      {"scheduler": "static", "cluster": 2}, {"scheduler": "dynamic", "cluster": 1,
                                                                              "block_n": 80}],
                         ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_sm90_seq_order(schedule, monkeypatch):
    """Sequences taken longest-first (tile_index.cuh: find_sequence_lpt) or in batch order compute
    the same bits, and match the reference: a ragged batch whose key ranges tie, differ and are
    empty, query lengths that fill no tile, and 33 sequences (past the 32 the LPT order covers)."""
    from mlagen.families.mla_prefill.tma import LPT_MIN_KEYS

    assert sum([4105, 9001, 0, 6200, 4300, 0, 8700, 4064]) >= 8 * LPT_MIN_KEYS
    from mlagen import spec, variant

    # The first batch averages 4546 keys a sequence, past the launcher's LPT_MIN_KEYS (tma.py), so it
    # takes the longest-first order; its key ranges tie, differ and are empty.
    cases = [([5, 1, 0, 129, 300, 2, 700, 64], [4105, 9001, 0, 6200, 4300, 0, 8700, 4064]),
             ([3 + 7 * i for i in range(33)], [3 + 7 * i + (50 * i) % 333 for i in range(33)])]
    for causal in (True, False):
        v = variant.make(spec.load("mla_prefill_sm90"), {**schedule, "mask": "causal" if causal else "none"})
        for lq, lk in cases:
            q, k, v_, k_rope, cu_q, cu_k = make(lq, lk, 5, seed=27)
            outs = []
            for order in ("batch", "lpt"):
                monkeypatch.setenv("MLAGEN_SEQ_ORDER", order)
                outs.append(run_and_check(v, q, k, v_, k_rope, cu_q, cu_k, causal))
            assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def _shipped_variants():
    from mlagen import db, spec, variant

    out = []
    for best in db.shipped_records():
        s = spec.load(best.key.spec)
        if s.family != "mla_prefill":   # sparse records run in the sparse GPU tests
            continue
        mask = best.key.problem.split("/")[0].split("+")[0]
        marks = ()
        if mask not in ("causal", "none"):
            # The class key holds no window sides or chunk size; the window and chunked kernels
            # (this record's variant is the spec default's schedule) run in test_dense_traits_gpu.py.
            marks = pytest.mark.skip(reason=f"a {mask} record needs the mask's sizes, which its class key does not hold; "
                                            "test_dense_traits_gpu.py runs the window and chunked kernels")
        out.append(pytest.param(variant.make(s, {**best.variant, "mask": mask}), id=f"{best.key.spec}:{best.key.problem}",
                                marks=marks))
    return out or [pytest.param(None, marks=pytest.mark.skip(reason="no shipped tuning records"))]


@pytest.mark.parametrize("shipped", _shipped_variants())
def test_shipped_winners(shipped):
    """The variants the package ships as tuned defaults pass the odd-shape cases too."""
    target = device_info(torch.cuda.current_device()).target.name
    if target not in shipped.spec.targets:
        pytest.skip(f"{shipped.spec.name} does not target {target}")
    if dict(shipped.spec.problem)["dtype"] != "bf16":
        pytest.skip(f"{shipped.spec.name} takes fp8 inputs: its shipped schedules run in test_fp8_gpu.py")
    causal = shipped["mask"] == "causal"
    q, k, v, k_rope, cu_q, cu_k = make([5, 1, 0, 129, 300, 2], [5, 1, 0, 200, 300, 0], 16, seed=23)
    run_and_check(shipped, q, k, v, k_rope, cu_q, cu_k, causal)
    q, k, v, k_rope, _, _ = make(100, 400, 128, seed=24)
    run_and_check(shipped, q, k, v, k_rope, None, None, causal)
