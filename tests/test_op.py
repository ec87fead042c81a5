"""mla_prefill as torch custom ops, without a GPU: the schemas, the fake (meta) implementations on
FakeTensors, argument errors (ValueError / TypeError), and torch.compile(fullgraph=True) tracing a
function that calls it (with a CPU kernel registered in a subprocess, so this session's op stays
CUDA-only). tests/gpu/test_op_gpu.py runs the real kernels under torch.compile and CUDA graphs."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

import mlagen  # noqa: E402
from mlagen.errors import ArgumentError, ArgumentTypeError, LaunchError  # noqa: E402
from mlagen.families.mla_prefill import op  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BF16 = torch.bfloat16


def test_schemas_say_what_is_optional_and_what_is_written():
    functional = str(torch.ops.mlagen.mla_prefill.default._schema)
    assert functional.startswith("mlagen::mla_prefill(Tensor q, Tensor k, Tensor v, Tensor? k_rope, "
                                 "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, bool causal, float? softmax_scale, "
                                 "bool? check_seqlens, SymInt? max_seqlen_q, SymInt? max_seqlen_k, str? kernel, "
                                 "Tensor? q_descale, Tensor? k_descale, Tensor? v_descale, SymInt window_left, "
                                 "SymInt window_right, SymInt? chunk_size, float softcap, Tensor? attn_sink)"), \
        functional
    assert functional.endswith("-> (Tensor, Tensor)")
    out = str(torch.ops.mlagen.mla_prefill_out.default._schema)
    assert re.search(r"Tensor\(a\d+!\) out, Tensor\(a\d+!\) lse\) -> \(\)$", out), out
    # Both are DenseArgs in order: the out op is the functional op's arguments, then out and lse.
    assert out == functional.split(") ->")[0].replace("mla_prefill(", "mla_prefill_out(") + \
        ", Tensor(a20!) out, Tensor(a21!) lse) -> ()", out
    assert mlagen.mla_prefill is op.mla_prefill


def test_the_public_call_hands_each_argument_to_its_field(monkeypatch):
    """mla_prefill builds its DenseArgs positionally (the hot path): each argument lands in the
    field of its name. The plan lookup sees the DenseArgs before any check, so any values do."""
    from mlagen.families.mla_prefill import entry
    from mlagen.families.mla_prefill.call import DenseArgs

    seen = []
    monkeypatch.setattr(entry, "planned", lambda args: (seen.append(args) or ("hit", None)))
    monkeypatch.setattr(entry, "plain_traits", lambda args: True)   # sentinels for the traits too
    given = {name: object() for name in DenseArgs._fields if name not in ("q", "kernel")}
    assert mlagen.mla_prefill(torch.zeros(2, 1, 192), **given) == "hit"
    assert len(seen) == 1 and seen[0].kernel is None
    assert all(getattr(seen[0], name) is value for name, value in given.items()), seen[0]


def fake_inputs(tq=10, tk=12, h=4, rope="shared", batch=None):
    q = torch.empty(tq, h, 192, dtype=BF16, device="cuda")
    k = torch.empty(tk, h, 128 if rope else 192, dtype=BF16, device="cuda")
    v = torch.empty(tk, h, 128, dtype=BF16, device="cuda")
    k_rope = None if not rope else torch.empty(tk, 1 if rope == "shared" else h, 64, dtype=BF16, device="cuda")
    cu = None if batch is None else torch.empty(batch + 1, dtype=torch.int32, device="cuda")
    return q, k, v, k_rope, cu


@pytest.mark.parametrize("rope", ["shared", "per_head", None])
@pytest.mark.parametrize("batch", [None, 3])
def test_fake_implementation_shapes(rope, batch):
    with FakeTensorMode():
        q, k, v, k_rope, cu = fake_inputs(rope=rope, batch=batch)
        out, lse = mlagen.mla_prefill(q, k, v, k_rope=k_rope, cu_seqlens_q=cu, cu_seqlens_k=cu)
        assert (tuple(out.shape), out.dtype, out.device.type) == ((10, 4, 128), BF16, "cuda")
        assert (tuple(lse.shape), lse.dtype) == ((10, 4), torch.float32)


def test_fake_out_variant_returns_the_given_tensors():
    with FakeTensorMode():
        q, k, v, k_rope, _ = fake_inputs()
        out = torch.empty(10, 4, 128, dtype=BF16, device="cuda")
        got_out, got_lse = mlagen.mla_prefill(q, k, v, k_rope=k_rope, out=out)
        assert got_out is out and tuple(got_lse.shape) == (10, 4)


@pytest.mark.parametrize("change, error, match", [
    (lambda a: {**a, "q": a["q"].float()}, TypeError, "q: dtype must be one of torch.bfloat16, torch.float8_e4m3fn"),
    (lambda a: {**a, "v": torch.empty(12, 4, 64, dtype=BF16, device="cuda")}, ValueError, "v: expected shape"),
    (lambda a: {**a, "k_rope": torch.empty(12, 1, 32, dtype=BF16, device="cuda")}, ValueError,
     "k_rope: expected shape"),
    (lambda a: {**a, "out": torch.empty(10, 4, 64, dtype=BF16, device="cuda")}, ValueError, "out: expected shape"),
    (lambda a: {**a, "lse": torch.empty(10, 4, dtype=BF16, device="cuda")}, TypeError, "lse: dtype"),
    (lambda a: {**a, "cu_seqlens_q": torch.zeros(3, dtype=torch.int32, device="cuda")}, ValueError,
     "cu_seqlens_q and cu_seqlens_k must be given together"),
    (lambda a: {**a, "cu_seqlens_q": torch.zeros(3, dtype=torch.int64, device="cuda"),
                "cu_seqlens_k": torch.zeros(3, dtype=torch.int64, device="cuda")}, TypeError, "dtype must be torch.int32"),
    (lambda a: {**a, "max_seqlen_q": 2}, ValueError, "max_seqlen_q: 2 cannot bound"),
])
def test_fake_tensors_get_the_same_argument_errors(change, error, match):
    with FakeTensorMode():
        q, k, v, k_rope, _ = fake_inputs()
        args = change({"q": q, "k": k, "v": v, "k_rope": k_rope})
        with pytest.raises(error, match=match) as info:
            mlagen.mla_prefill(**args)
        assert isinstance(info.value, LaunchError)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"causal": 1}, ArgumentTypeError, "causal: expected a bool"),
    ({"softmax_scale": "big"}, ArgumentTypeError, "softmax_scale: expected a float"),
    ({"softmax_scale": -1.0}, ArgumentError, "softmax_scale: must be a finite positive number"),
    ({"max_seqlen_q": 3.5}, ArgumentTypeError, "max_seqlen_q: expected a host int"),
    ({"max_seqlen_k": -1}, ArgumentError, "max_seqlen_k: must be >= 0"),
    ({"check_seqlens": "yes"}, ArgumentTypeError, "check_seqlens: expected a bool"),
    ({"kernel": 3}, ArgumentTypeError, "kernel: expected a spec name or a Variant"),
    ({"k_rope": [1, 2]}, ArgumentTypeError, "k_rope: expected a torch.Tensor, got list"),
])
def test_scalar_argument_errors(kwargs, error, match):
    q = torch.zeros(4, 2, 192, dtype=BF16)
    k = torch.zeros(4, 2, 128, dtype=BF16)
    kr = torch.zeros(4, 1, 64, dtype=BF16)
    v = torch.zeros(4, 2, 128, dtype=BF16)
    with pytest.raises(error, match=match) as info:
        mlagen.mla_prefill(q, k, v, **{"k_rope": kr, **kwargs})
    assert isinstance(info.value, (ValueError, TypeError)) and isinstance(info.value, LaunchError)


def test_real_cpu_tensors_are_refused_by_the_op():
    q = torch.zeros(4, 2, 192, dtype=BF16)
    with pytest.raises(ValueError, match="q: must be a CUDA tensor"):
        mlagen.mla_prefill(q, torch.zeros(4, 2, 192, dtype=BF16), torch.zeros(4, 2, 128, dtype=BF16))


def test_errors_pickle_with_their_types():
    import pickle

    for exc in (ArgumentError("mla_prefill: q: x"), ArgumentTypeError("mla_prefill: q: y")):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)


COMPILE_SCRIPT = textwrap.dedent("""
    import math, torch, mlagen
    from mlagen.families.mla_prefill import op
    from mlagen.families.mla_prefill.reference import reference

    # A CPU kernel (the float64 reference), registered in this process only, so the op runs here.
    @op._op.register_kernel("cpu")
    def _cpu(q, k, v, k_rope, cu_q, cu_k, causal, scale, check, max_q, max_k, kernel, qd, kd, vd, left, right, chunk,
             softcap, sink):
        o, l = reference(q, k, v, k_rope=k_rope, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=causal,
                         softmax_scale=scale, q_descale=qd, k_descale=kd, v_descale=vd, window_size=(left, right),
                         chunk_size=chunk, softcap=softcap, attn_sink=sink)
        return o.to(torch.bfloat16), l.float()

    @op._op_out.register_kernel("cpu")
    def _cpu_out(q, k, v, k_rope, cu_q, cu_k, causal, scale, check, max_q, max_k, kernel, qd, kd, vd, left, right,
                 chunk, softcap, sink, out, lse):
        o, l = _cpu(q, k, v, k_rope, cu_q, cu_k, causal, scale, check, max_q, max_k, kernel, qd, kd, vd, left, right,
                    chunk, softcap, sink)
        out.copy_(o)
        lse.copy_(l)

    g = torch.Generator().manual_seed(0)
    q = torch.randn(9, 2, 192, generator=g).to(torch.bfloat16)
    k = torch.randn(11, 2, 128, generator=g).to(torch.bfloat16)
    kr = torch.randn(11, 1, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(11, 2, 128, generator=g).to(torch.bfloat16)
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 5, 11], dtype=torch.int32)

    def layer(q, k, v, kr):
        out, lse = mlagen.mla_prefill(q * 2, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                      max_seqlen_q=5, max_seqlen_k=6)
        return out.float().sum(-1) + lse

    def layer_out(q, k, v, kr):
        out = torch.empty(9, 2, 128, dtype=torch.bfloat16)
        lse = torch.empty(9, 2)
        mlagen.mla_prefill(q, k, v, k_rope=kr, causal=False, softmax_scale=0.1, out=out, lse=lse)
        return out.float() * 3, lse

    sink = torch.tensor([0.5, -1.0])

    def layer_traits(q, k, v, kr):   # MLA.md section 1b's traits go through the op as well
        out, lse = mlagen.mla_prefill(q, k, v, k_rope=kr, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=False,
                                      window_size=(3, 0), softcap=5.0, attn_sink=sink)
        return out.float(), lse

    def eager(fn):
        # Eager calls skip the op (they would reach the real, CUDA-only implementation); this
        # one goes through the op too, so it reaches the CPU kernel above.
        traced = op._tracing
        op._tracing = lambda q: True
        try:
            return fn(q, k, v, kr)
        finally:
            op._tracing = traced

    for fn in (layer, layer_out, layer_traits):
        explain = torch._dynamo.explain(fn)(q, k, v, kr)
        assert explain.graph_break_count == 0 and explain.graph_count == 1, explain
        torch._dynamo.reset()
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
        for got, want in zip(compiled(q, k, v, kr), eager(fn)):
            assert torch.equal(got, want), (fn.__name__, (got - want).abs().max())
    assert not op._tracing(q)  # a plain eager call takes the direct path
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        assert op._tracing(mode.from_tensor(q))

    args = (q, k, v, kr, cu_q, cu_k, True, None, None, 5, 6, None, None, None, None, -1, -1, None, 0.0, None)
    for name, result in torch.library.opcheck(op._op, args).items():
        assert result == "SUCCESS", (name, result)
    traits = args[:15] + (4, 0, None, 3.0, sink)
    for name, result in torch.library.opcheck(op._op, traits).items():
        assert result == "SUCCESS", (name, result)
    out, lse = torch.empty(9, 2, 128, dtype=torch.bfloat16), torch.empty(9, 2)
    for name, result in torch.library.opcheck(op._op_out, args + (out, lse)).items():
        assert result == "SUCCESS", (name, result)
    print("ok")
""")


@pytest.mark.slow
def test_torch_compile_traces_it_without_a_graph_break():
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout[-3000:] + proc.stderr[-5000:]


def test_fake_call_with_only_lse_given_checks_q_first():
    with FakeTensorMode():
        q = torch.empty(10, 192, dtype=BF16, device="cuda")
        _, k, v, k_rope, _ = fake_inputs()
        lse = torch.empty(10, 4, device="cuda")
        with pytest.raises(ValueError, match="q: expected 3 dimensions"):
            mlagen.mla_prefill(q, k, v, k_rope=k_rope, lse=lse)
