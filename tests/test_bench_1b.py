"""GPU-free tests of the bench peers for MLA.md section 1b shapes (D8-D11: GLM-5's 256 / 256, a window):
the SDPA peers at other geometries and with a window mask, the fa3 peer's choice of build and its
arguments to tools/fa3_extra's op, and the "not supported" path for what mlagen's call cannot run yet."""

from __future__ import annotations

import json

import pytest

from mlagen import bench, families
from mlagen.errors import BenchError
from mlagen.families.base import Peer
from mlagen.families.mla_prefill.problem import SHAPES as D_SHAPES

torch = pytest.importorskip("torch")

from mlagen.families.mla_prefill import peers as dense_peers  # noqa: E402
from mlagen.families.mla_prefill.problem import Shape as DenseShape  # noqa: E402
from mlagen.families.mla_prefill.reference import compare as dense_compare  # noqa: E402
from mlagen.families.mla_prefill.reference import make_inputs as dense_inputs  # noqa: E402
from mlagen.families.mla_prefill.reference import reference_heads  # noqa: E402

DENSE = families.get("mla_prefill")
RAGGED = DenseShape("R", (5, 9, 3), (5, 9, 3), 3, True)


@pytest.fixture
def no_wrapper_env(monkeypatch, tmp_path):
    for var in ("FA3_PEER_SO", "FA3_PEER_BUILD", "FA3_EXTRA_SO"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FA3_EXTRA_BUILD", str(tmp_path / "no-fa3-extra"))   # not <repo>/out/fa3_extra, if built


def _no_gpu_timing(monkeypatch):
    monkeypatch.setattr(bench, "time_calls", lambda fn, iters, flush: [fn() and 1e-3] * iters)
    monkeypatch.setattr(bench, "host_time", lambda fn: 42e-6)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "gpu_telemetry", lambda device=None: {})



TINY_1B = {
    "glm5": DenseShape("G", (5, 9), (5, 12), 2, True, geometry="n192r64v256"),
    "window": DenseShape("W", (7, 20), (7, 26), 2, False, window=(4, 1)),
}


@pytest.mark.parametrize("name", sorted(TINY_1B))
def test_sdpa_peers_take_the_shapes_geometry_and_window(name):
    from torch.nn.attention import SDPBackend

    shape = TINY_1B[name]
    x = dense_inputs(shape, "cpu", seed=4)
    peer = dense_peers.sdpa_peer(shape, x, backend=SDPBackend.MATH, pad_v=True, lower_right="dense")
    out, _ = peer.checked_call()
    d_qk, d_v = shape.dims[0] + shape.dims[1], shape.dims[2]
    assert tuple(out.shape) == (shape.total_q, shape.heads, d_v)
    check = dense_compare(out, None, *reference_heads(shape, x))
    assert check.ok, check.problem
    assert ("V zero-padded" in peer.note) == (d_v < d_qk)
    assert ("window 4/1 as a dense additive" in peer.note) == (shape.mask == "window")


def test_flash_sdpa_refuses_a_window_as_not_supported():
    from mlagen.errors import PeerUnsupported

    x = dense_inputs(TINY_1B["window"], "cpu", seed=0)
    with pytest.raises(PeerUnsupported, match="no mask but causal"):
        dense_peers.fa2_peer(TINY_1B["window"], x)


def test_mlagen_peer_says_not_supported_for_what_the_call_refuses(monkeypatch):
    """A section 1b shape the public call refuses (a head geometry, a window keyword it lacks) is
    not supported; the same refusal on a section 1 shape stays an error."""
    from mlagen.errors import ArgumentError, PeerUnsupported
    from mlagen.families.mla_prefill import entry, op

    def refuses(q, k, v, **kw):
        raise ArgumentError(f"mla_prefill: q: last dimension must be 192, got {q.shape[-1]}")

    monkeypatch.setattr(entry, "mla_prefill_kernel", refuses)
    glm = TINY_1B["glm5"]
    with pytest.raises(PeerUnsupported, match=r"^d 192/64/256: mla_prefill: q: last dimension must be 192, got 256$"):
        dense_peers.mlagen_peer(glm, dense_inputs(glm, "cpu"))
    with pytest.raises(ArgumentError):
        dense_peers.mlagen_peer(RAGGED, dense_inputs(RAGGED, "cpu"))

    def mla_prefill(q, k, v, *, k_rope=None, cu_seqlens_q=None, cu_seqlens_k=None, causal=True):
        raise AssertionError("not called")

    monkeypatch.setattr(op, "mla_prefill", mla_prefill)   # the call without section 1b's keywords
    win = TINY_1B["window"]
    with pytest.raises(PeerUnsupported, match="window 4/1: mlagen.mla_prefill takes no window_size= yet"):
        dense_peers.mlagen_peer(win, dense_inputs(win, "cpu"))


def test_not_supported_is_reported_and_the_peers_still_timed(monkeypatch):
    from torch.nn.attention import SDPBackend

    from mlagen.errors import PeerUnsupported

    def math_prepare(shape, x, arg=None):
        return dense_peers.sdpa_peer(shape, x, backend=SDPBackend.MATH, pad_v=False, lower_right="dense")

    def unsupported(shape, x, arg=None):
        raise PeerUnsupported("d 192/64/256: no kernel for this head geometry")

    fake = {p.name: p for p in (Peer("fa3", "", math_prepare, lead=True), Peer("cudnn", "", math_prepare),
                                Peer("mlagen", "", unsupported, ours=True))}
    monkeypatch.setattr(DENSE, "peers", lambda: fake)
    _no_gpu_timing(monkeypatch)
    logs = []
    shape = TINY_1B["glm5"]
    result = bench._bench_shape(DENSE, shape, ["fa3", "cudnn", "mlagen"], iters=3, rounds=2, warmup=0, seed=0,
                                device="cpu", flush=lambda: None, log=logs.append)
    p = result.peers
    assert p["mlagen"].unsupported and p["mlagen"].timing is None and not p["mlagen"].wrong
    assert f"{shape.id} mlagen: not supported (d 192/64/256: no kernel for this head geometry)" in logs
    assert len(p["fa3"].timing.blocks) == 2 and len(p["cudnn"].timing.blocks) == 2 and p["fa3"].check.ok
    table = bench.format_table([result], {})
    assert "not supported (d 192/64/256: no kernel for this head geometry)" in table
    assert result.ratio("mlagen", "fa3") is None
    doc = json.loads(bench.results_to_json([result], {}))
    assert doc["results"][0]["peers"]["mlagen"]["unsupported"] is True
    assert doc["results"][0]["flops"] == shape.flops() == DENSE.flops(shape)


def test_fa3_runs_section_1b_shapes_from_tools_fa3_extra(tmp_path, monkeypatch, no_wrapper_env):
    from mlagen.families.mla_prefill.peers import FA3_EXTRA

    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path / "none"))
    why = DENSE.peers()["fa3"].status()
    assert "fa3_peer.py not found" in why and "tools/fa3_extra/build.py" in why   # neither build: both reasons
    with pytest.raises(BenchError, match="not built .*python tools/fa3_extra/build.py"):
        DENSE.peers()["fa3"].prepare(D_SHAPES["D8"], {}, None)
    so = tmp_path / "lib" / "fa3_extra_C.so"
    so.parent.mkdir()
    so.write_bytes(b"")
    monkeypatch.setenv("FA3_EXTRA_SO", str(so))
    assert FA3_EXTRA.library_path() == so and DENSE.peers()["fa3"].status() is None   # one build is enough
    monkeypatch.delenv("FA3_EXTRA_SO")
    monkeypatch.setenv("FA3_EXTRA_BUILD", str(so.parent))
    assert FA3_EXTRA.library_path() == so
    with pytest.raises(BenchError, match="fa3_peer.py not found"):   # a section 1 shape needs <peers>/fa3
        DENSE.peers()["fa3"].prepare(D_SHAPES["D10"], {}, None)


def test_fa3_extra_peer_passes_the_mask_and_reads_fa3s_lse_layout(monkeypatch):
    """The fa3 peer on section 1b shapes, with a CPU stand-in for torch.ops.fa3_extra computing the
    reference: the arguments FA3 gets (window, causal, cu_seqlens for a single sequence) and the
    [H, Tq] lse turned back; a geometry or mask no kernel was built for is not supported."""
    from mlagen.errors import PeerUnsupported
    from mlagen.families.mla_prefill.peers import FA3_EXTRA
    from mlagen.families.mla_prefill.reference import reference

    calls = []

    class FakeOps:
        @staticmethod
        def kernels():
            return ["hdim256_causal", "hdim192_128_local", "hdim192_128_causal_softcap"]

        @staticmethod
        def fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, left, right, softcap, scale):
            calls.append((tuple(cu_q.tolist()), max_q, max_k, causal, left, right, softcap, scale))
            window = None if (left, right) == (-1, -1) else (left, right)
            out, lse = reference(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal,
                                 window_size=window or (-1, -1), dtype=torch.float32)
            return out.to(torch.bfloat16), lse.transpose(0, 1).contiguous()

    monkeypatch.setattr(type(FA3_EXTRA), "load", lambda self: FakeOps)   # a frozen dataclass: patched on the class
    glm, win = TINY_1B["glm5"], DenseShape("W1", (40,), (40,), 2, False, window=(4, 1))
    for shape, expect in ((glm, ((0, 5, 14), 9, 12, True, -1, -1)), (win, ((0, 40), 40, 40, False, 4, 1))):
        x = dense_inputs(shape, "cpu", seed=5)
        prepared = DENSE.peers()["fa3"].prepare(shape, x, None)
        out, lse = prepared.checked_call()
        assert calls[-1] == (*expect, 0.0, None)
        check = DENSE.compare((out, lse), reference_heads(shape, x))
        assert check.ok and check.lse_max_abs is not None, check.problem
        assert "tools/fa3_extra kernel" in prepared.note
    with pytest.raises(PeerUnsupported, match="no FA3 kernel built for d 256 / 256, window; built: hdim256_causal"):
        other = DenseShape("GW", (6,), (6,), 2, False, geometry="n192r64v256", window=(2, 0))
        DENSE.peers()["fa3"].prepare(other, dense_inputs(other, "cpu"), None)
