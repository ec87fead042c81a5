"""mla_prefill as a PyTorch operator on the GPU: no host sync by default, torch.compile with
fullgraph=True, CUDA graph capture and replay, all equal to the eager call."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")

import mlagen  # noqa: E402


def inputs(lq=(300, 77, 512), lk=(300, 100, 1024), heads=8, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)

    tq, tk = sum(lq), sum(lk)
    cu = lambda xs: torch.tensor([0] + [sum(xs[:i + 1]) for i in range(len(xs))], dtype=torch.int32, device="cuda")
    return rnd(tq, heads, 192), rnd(tk, heads, 128), rnd(tk, 1, 64), rnd(tk, heads, 128), cu(list(lq)), cu(list(lk))


def test_the_default_call_does_not_synchronise():
    q, k, kr, v, cu_q, cu_k = inputs()
    mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)  # builds the kernel
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=512,
                           max_seqlen_k=1024)
        with pytest.raises(RuntimeError, match="synchroniz"):
            mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, check_seqlens=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("preallocated", [False, True])
def test_torch_compile_fullgraph_matches_eager(preallocated):
    q, k, kr, v, cu_q, cu_k = inputs(seed=1)

    def layer(q, k, v, kr):
        if preallocated:
            out = torch.empty(q.shape[0], q.shape[1], 128, dtype=torch.bfloat16, device=q.device)
            lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
            mlagen.mla_prefill(q * 0.5, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, lse=lse)
        else:
            out, lse = mlagen.mla_prefill(q * 0.5, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        return out.float() + 1, lse * 2

    eager = layer(q, k, v, kr)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    got = compiled(q, k, v, kr)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


def test_cuda_graph_capture_and_replay_match_eager():
    q, k, kr, v, cu_q, cu_k = inputs(seed=2)
    want_out, want_lse = mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    out = torch.empty_like(want_out)
    lse = torch.empty_like(want_lse)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, lse=lse)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out, lse=lse)
    out.zero_()
    lse.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    # New values in the captured input buffers are picked up by the replay.
    q2 = torch.randn_like(q, dtype=torch.float32).to(torch.bfloat16)
    q.copy_(q2)
    graph.replay()
    want_out2, _ = mlagen.mla_prefill(q2, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    torch.cuda.synchronize()
    assert torch.equal(out, want_out2)


def test_compiled_function_captured_in_a_cuda_graph():
    q, k, kr, v, cu_q, cu_k = inputs(seed=3)

    def layer(q):
        out, lse = mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        return out, lse

    eager = layer(q)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, mode="reduce-overhead")
    for _ in range(3):  # reduce-overhead records a CUDA graph after warm-up calls
        got = compiled(q)
    for a, b in zip(got, eager):
        assert torch.equal(a, b)


def test_check_seqlens_is_refused_while_capturing():
    q, k, kr, v, cu_q, cu_k = inputs(seed=4)
    mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="check_seqlens: reading cu_seqlens values synchronises"):
        with torch.cuda.graph(graph):
            mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, check_seqlens=True)


def test_record_shapes_counts_calls(tmp_path, monkeypatch):
    from mlagen import shapelog

    path = tmp_path / "shapes.yaml"
    monkeypatch.setenv("MLAGEN_RECORD_SHAPES", str(path))
    shapelog.reset()
    try:
        q, k, kr, v, cu_q, cu_k = inputs(seed=5)
        for _ in range(3):
            mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
        shapelog.flush()
        family, shapes = shapelog.read(path)
        assert family == "mla_prefill" and shapes == [{"shape": "b=3,q=296,k=475,h=8,causal", "weight": 3}]
    finally:
        shapelog.reset()


def test_opcheck_on_the_gpu():
    from mlagen.families.mla_prefill import op

    q, k, kr, v, cu_q, cu_k = inputs(seed=6)
    # ... kernel, descales, then the section 1b traits at their defaults (window -1 / -1, no chunk, no softcap, no sink)
    args = (q, k, v, kr, cu_q, cu_k, True, None, None, None, None, None, None, None, None, -1, -1, None, 0.0, None)
    for name, result in torch.library.opcheck(op._op, args).items():
        assert result == "SUCCESS", (name, result)
    out = torch.empty(q.shape[0], q.shape[1], 128, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device="cuda")
    for name, result in torch.library.opcheck(op._op_out, args + (out, lse)).items():
        assert result == "SUCCESS", (name, result)
