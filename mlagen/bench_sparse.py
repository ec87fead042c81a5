"""The sparse family's device tool: the correctness matrix, a sanitizer case, a profile case, and
``mlagen bench`` on the sparse shapes with forced variants beside the default.

    python -m mlagen.bench_sparse verify [--kernel SPEC]  # the correctness matrix (exit 1 on a failure)
    python -m mlagen.bench_sparse sanitize                # one small fuzzed case, for compute-sanitizer
    python -m mlagen.bench_sparse profile [--shape S1]    # one call of ours and of FlashMLA's, for ncu
    python -m mlagen.bench_sparse bench [--shapes S1,S5] [--variant l2_evict_last=false] [--json F]

The benchmark itself is ``mlagen bench`` (:mod:`mlagen.bench`, the family's peers in
:mod:`mlagen.families.mla_sparse_prefill.peers`): ``bench`` here only adds ``--variant``. This
module names the sparse family by design: it is that family's tool, above ``mlagen.bench``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from .families import mla_sparse_prefill as fam
from .errors import MlagenError
from .families.base import Peer


# --- correctness ------------------------------------------------------------------------------


def fuzzed_indices(torch, sq, topk, n, gen, device, invalid=0.2, empty_rows=(0,)):
    """Indices with duplicates (drawn with replacement), -1, other negatives and >= N mixed in,
    and the rows in ``empty_rows`` all invalid."""
    idx = torch.randint(0, max(n, 1), (sq, topk), generator=gen, device=device, dtype=torch.int32)
    r = torch.rand((sq, topk), generator=gen, device=device)
    idx = torch.where(r < invalid * 0.5, torch.full_like(idx, -1), idx)
    idx = torch.where((r >= invalid * 0.5) & (r < invalid * 0.75), -idx - 2, idx)
    idx = torch.where((r >= invalid * 0.75) & (r < invalid), idx + n, idx)
    big = torch.rand((sq, topk), generator=gen, device=device) < 0.01
    idx = torch.where(big, torch.full_like(idx, 2**31 - 1), idx)
    for row in empty_rows:
        if row < sq:
            idx[row] = torch.where(torch.arange(topk, device=device) % 2 == 0, -1, n + 7).to(torch.int32)
    return idx


def make_kv(torch, layout, n, d_qk, gen, device):
    if layout == "flat":
        return torch.randn((n, d_qk), generator=gen, device=device).to(torch.bfloat16)
    if layout == "n1d":
        return torch.randn((n, 1, d_qk), generator=gen, device=device).to(torch.bfloat16)
    if layout == "paged":  # pages of 64 rows, strided (each page sits in a slot twice its size)
        pages = -(-n // 64)
        pool = torch.randn((pages, 128, d_qk), generator=gen, device=device).to(torch.bfloat16)
        return pool[:, :64]
    raise ValueError(layout)


def sink_for(torch, mode, heads, gen, device):
    if mode == "none":
        return None
    if mode == "finite":
        return torch.randn((heads,), generator=gen, device=device)
    if mode == "+inf":
        return torch.full((heads,), math.inf, device=device)
    if mode == "-inf":
        return torch.full((heads,), -math.inf, device=device)
    if mode == "mixed":
        s = torch.randn((heads,), generator=gen, device=device)
        s[0::3] = math.inf
        s[1::3] = -math.inf
        return s
    raise ValueError(mode)


def check_case(torch, case: dict, seed: int, kernel=None) -> tuple[bool, str]:
    """Run one case through mlagen.mla_sparse_prefill and the float32 reference; (ok, summary)."""
    import mlagen

    device = torch.device("cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sq, heads, topk, n, d_qk = case["sq"], case["heads"], case["topk"], case["n"], case.get("d_qk", 576)
    # q as a strided view (heads padded in memory) to exercise in-place strided reads.
    q_big = torch.randn((sq, heads + 3, d_qk + 64), generator=gen, device=device).to(torch.bfloat16)
    q = q_big[:, 1:heads + 1, :d_qk]
    kv = make_kv(torch, case.get("kv", "flat"), n, d_qk, gen, device)
    n_rows = kv.shape[0] * (kv.shape[1] if kv.dim() == 3 else 1)
    idx = fuzzed_indices(torch, sq, topk, n_rows, gen, device, invalid=case.get("invalid", 0.2))
    if case.get("idx3"):
        idx = idx.view(sq, 1, topk)
    length = None
    if case.get("topk_length"):
        length = torch.randint(0, topk + 1, (sq,), generator=gen, device=device, dtype=torch.int32)
        length[sq // 2] = 0
        length[-1] = topk
        if case["topk_length"] == "long":
            length[1] = topk + 100  # past topk: clamped
    sink = sink_for(torch, case.get("sink", "none"), heads, gen, device)
    scale = d_qk ** -0.5
    out = torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device=device)
    o, ml, lse = mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=scale, topk_length=length, attn_sink=sink,
                                           out=out, kernel=kernel)
    ro, rml, rlse = fam.reference(q, kv, idx, softmax_scale=scale, topk_length=length, attn_sink=sink)
    torch.cuda.synchronize()
    problems = []
    if torch.isnan(o).any():
        problems.append("NaN in out (unwritten or computed)")
    of = o.float()
    err = ((of - ro).norm() / ro.norm().clamp_min(1e-30)).item() if ro.norm() > 0 else of.abs().max().item()
    if err > 1e-2:
        problems.append(f"out rel err {err:.2e}")
    zero_rows = ro.abs().amax(-1) == 0
    if (of[zero_rows] != 0).any():
        problems.append("nonzero out where the reference is exactly 0")
    for name, a, b, tol in (("lse", lse, rlse, 2e-3), ("max_logits", ml, rml, 2e-3)):
        inf_a, inf_b = torch.isinf(a), torch.isinf(b)
        if not torch.equal(inf_a, inf_b) or not torch.equal(a[inf_a], b[inf_b]):
            problems.append(f"{name}: inf pattern differs")
            continue
        fin = ~inf_b
        if fin.any():
            d = ((a[fin] - b[fin]).abs() / (1 + b[fin].abs())).max().item()
            if d > tol:
                problems.append(f"{name} err {d:.2e}")
    ok = not problems
    return ok, f"out_err={err:.2e} " + ("ok" if ok else "; ".join(problems))


def verify_cases() -> list[dict]:
    """The correctness matrix of issue 9 part 2: H x topk, every index/length/sink/layout mode."""
    cases = []
    sinks = ["none", "finite", "+inf", "-inf", "mixed"]
    layouts = ["flat", "n1d", "paged"]
    i = 0
    for heads in (1, 5, 16, 64, 128):
        for topk in (1, 33, 640, 2048):
            cases.append({
                "sq": 9 if topk >= 640 else 13, "heads": heads, "topk": topk, "n": 3000 if topk < 2048 else 5000,
                "d_qk": 576 if i % 3 else 512, "kv": layouts[i % 3], "sink": sinks[i % 5],
                "topk_length": [None, "short", "long"][i % 3 if i % 4 else 0], "idx3": i % 2 == 1,
            })
            i += 1
    # All-valid (no invalid entries), and all invalid.
    cases.append({"sq": 7, "heads": 128, "topk": 2048, "n": 8192, "invalid": 0.0, "sink": "finite"})
    cases.append({"sq": 5, "heads": 64, "topk": 128, "n": 100, "invalid": 1.0, "sink": "finite"})
    cases.append({"sq": 5, "heads": 16, "topk": 256, "n": 64, "d_qk": 512, "topk_length": "short", "sink": "mixed",
                  "kv": "paged"})
    return cases


def verify(kernel=None) -> int:
    import torch

    failures = 0
    t0 = time.time()
    for i, case in enumerate(verify_cases()):
        ok, msg = check_case(torch, case, seed=1000 + i, kernel=kernel)
        failures += not ok
        desc = " ".join(f"{k}={v}" for k, v in case.items())
        print(f"{'PASS' if ok else 'FAIL'} [{i:2d}] {desc}: {msg}", flush=True)
    extra = check_graph(torch)
    failures += not extra[0]
    print(f"{'PASS' if extra[0] else 'FAIL'} cuda graph capture + replay: {extra[1]}")
    print(f"verify ({kernel or 'dispatched kernel'}): {failures} failure(s), {time.time() - t0:.1f}s")
    return 1 if failures else 0


def check_graph(torch) -> tuple[bool, str]:
    """The call captured in a CUDA graph and replayed on new inputs matches a direct call."""
    import mlagen

    inp = fam.make_inputs({"sq": 64, "heads": 64, "topk": 256, "s_kv": 4096}, "cuda", seed=5)
    mlagen.mla_sparse_prefill(**inp)  # builds the kernel outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, ml, lse = mlagen.mla_sparse_prefill(**inp)
    new = fam.make_inputs({"sq": 64, "heads": 64, "topk": 256, "s_kv": 4096}, "cuda", seed=6)
    for k in ("q", "kv", "indices", "attn_sink"):
        inp[k].copy_(new[k])
    g.replay()
    ro, rml, rlse = mlagen.mla_sparse_prefill(**new)
    torch.cuda.synchronize()
    same = torch.equal(o, ro) and torch.equal(lse, rlse) and torch.equal(ml, rml)
    return same, "identical to a direct call" if same else "differs from a direct call"


def sanitize() -> int:
    """A small case with fuzzed indices (huge, negative, -1, past N) for compute-sanitizer."""
    import torch

    ok1, m1 = check_case(torch, {"sq": 6, "heads": 20, "topk": 200, "n": 300, "invalid": 0.5, "sink": "mixed",
                                 "topk_length": "long", "kv": "paged"}, seed=7)
    ok2, m2 = check_case(torch, {"sq": 4, "heads": 64, "topk": 130, "n": 1, "invalid": 0.5, "d_qk": 512}, seed=8)
    print("sanitize case 1:", m1)
    print("sanitize case 2:", m2)
    return 0 if ok1 and ok2 else 1


# --- benchmark and profile ---------------------------------------------------------------------


def variant_peer(text: str) -> Peer:
    """An ``mlagen`` peer that forces one variant of the sm90 spec, from ``name=value,...`` (the
    others at their defaults): for comparing tunables in the same process as the default."""
    from . import spec as spec_mod
    from . import variant as variant_mod

    spec = spec_mod.load("mla_sparse_prefill_sm90")
    values = variant_mod.parse_assignments(spec, [text])
    variant_mod.make(spec, {**values, "d_qk": 576, "paged": False})   # names and values checked now
    ours = fam.FAMILY.peers()["mlagen"]

    def prepare(shape, inputs, arg=None):
        v = variant_mod.make(spec, {**values, **fam.specialization(shape)})
        return ours.prepare(shape, inputs, v)

    return Peer(f"mlagen:{text}", f"the public call with the variant {text} forced", prepare, ours=True)


def bench(shapes: str, rounds: int, iters: int, peers: str | None, variant_texts=(), json_path=None) -> int:
    """``mlagen bench`` on sparse shapes (its timing, report and JSON), plus forced variants."""
    from . import bench as bench_mod

    names = bench_mod.parse_peers(peers, [fam.FAMILY]) if peers else bench_mod.default_peers(fam.FAMILY, print)
    results = bench_mod.run(shapes, [*names, *map(variant_peer, variant_texts)], iters=iters, rounds=rounds)
    env = bench_mod.environment()
    print(bench_mod.format_table(results, env))
    if json_path:
        from .cache import atomic_write

        atomic_write(json_path, bench_mod.results_to_json(results, env).encode())
    return 1 if any(p.ours and p.wrong for r in results for p in r.peers.values()) else 0


def profile(shape_text: str) -> int:
    """One call of ours and one of FlashMLA's (if built) on the same inputs (run under ncu)."""
    import torch

    import mlagen
    from .families.mla_sparse_prefill.peers import FLASHMLA

    shape = fam.parse_shape(shape_text)
    inp = fam.make_inputs(shape, "cuda", seed=0)
    mlagen.mla_sparse_prefill(**inp)
    path, why = FLASHMLA.status()
    if path is None:
        print(f"flashmla skipped: {why}")
    else:
        FLASHMLA.load().sparse_fwd(inp["q"], inp["kv"], inp["indices"], inp["softmax_scale"], 512, inp["attn_sink"],
                                   None)
    torch.cuda.synchronize()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mlagen.bench_sparse")
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--kernel", default=None, help="force a spec, e.g. mla_sparse_prefill_sm80")
    sub.add_parser("sanitize")
    pr = sub.add_parser("profile")
    pr.add_argument("--shape", default="sq=1024,h=128,topk=2048,skv=8192", help="an id (S1) or a description")
    b = sub.add_parser("bench", help="mlagen bench on sparse shapes (FlashMLA from MLAGEN_PEERS_DIR), and variants")
    b.add_argument("--shapes", default="mla_sparse_prefill", help="ids (S1,S5), a description, default S1-S6")
    b.add_argument("--peers", default=None, help="flashmla, naive, mlagen, mlagen:<spec> (default: all three)")
    b.add_argument("--rounds", type=int, default=3)
    b.add_argument("--iters", type=int, default=50)
    b.add_argument("--variant", action="append", default=[], help="also time this sm90 variant: name=value,...")
    b.add_argument("--json", default=None, help="also write every measurement here")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "verify":
            return verify(args.kernel)
        if args.cmd == "sanitize":
            return sanitize()
        if args.cmd == "profile":
            return profile(args.shape)
        return bench(args.shapes, args.rounds, args.iters, args.peers, args.variant, args.json)
    except (MlagenError, ValueError) as exc:   # a bad argument or no GPU: one line, no traceback
        print(f"mlagen.bench_sparse: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
