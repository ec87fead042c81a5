"""The sparse family's device tool: the correctness matrix, a sanitizer case, a profile case, and
``mlagen bench`` on the sparse shapes with forced variants beside the default.

    python -m mlagen.families.mla_sparse_prefill.tools verify [--kernel SPEC]  # the correctness matrix (exit 1 on a failure)
    python -m mlagen.families.mla_sparse_prefill.tools sanitize                # one small fuzzed case, for compute-sanitizer
    python -m mlagen.families.mla_sparse_prefill.tools profile [--shape S1]    # one call of ours and of FlashMLA's, for ncu
    python -m mlagen.families.mla_sparse_prefill.tools bench [--shapes S1,S5] [--variant l2_evict_last=false] [--json F]
    python -m mlagen.families.mla_sparse_prefill.tools verify-fp8 [--kernel SPEC]  # the FP8-cache matrix (issue 10)
    python -m mlagen.families.mla_sparse_prefill.tools bench-fp8 [--shapes S1,S3]  # FP8 cache (staged, in-kernel) vs bf16 copy vs
                                                              # FlashMLA / the serving path

The benchmark itself is ``mlagen bench`` (:mod:`mlagen.bench`, the family's peers in
:mod:`mlagen.families.mla_sparse_prefill.peers`): ``bench`` here only adds ``--variant``. This
module names the sparse family by design: it is that family's tool, above ``mlagen.bench``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import sys
import time

from ... import measure
from ...errors import MlagenError
from . import FAMILY
from . import problem as sp_problem, compile as sp_compile, reference as sp_ref
from ..base import Peer
from .peers import FLASHMLA


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


def case_indices(torch, case: dict, n_rows: int, gen, device):
    """A case's indices (fuzzed; [Sq, 1, topk] with ``idx3``), topk_length (one row 0, one row
    topk, with "long" one past topk: clamped) and sink, drawn in that order from ``gen``."""
    sq, heads, topk = case["sq"], case["heads"], case["topk"]
    idx = fuzzed_indices(torch, sq, topk, n_rows, gen, device, invalid=case.get("invalid", 0.2))
    if case.get("idx3"):
        idx = idx.view(sq, 1, topk)
    length = None
    if case.get("topk_length"):
        length = torch.randint(0, topk + 1, (sq,), generator=gen, device=device, dtype=torch.int32)
        length[sq // 2] = 0
        length[-1] = topk
        if case["topk_length"] == "long":
            length[1] = topk + 100
    return idx, length, sink_for(torch, case.get("sink", "none"), heads, gen, device)


def check_case(torch, case: dict, seed: int, kernel=None) -> tuple[bool, str]:
    """Run one case through mlagen.mla_sparse_prefill and the float32 reference; (ok, summary)."""
    import mlagen

    device = torch.device("cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sq, heads, n, d_qk = case["sq"], case["heads"], case["n"], case.get("d_qk", 576)
    # q as a strided view (heads padded in memory) to exercise in-place strided reads.
    q_big = torch.randn((sq, heads + 3, d_qk + 64), generator=gen, device=device).to(torch.bfloat16)
    q = q_big[:, 1:heads + 1, :d_qk]
    kv = make_kv(torch, case.get("kv", "flat"), n, d_qk, gen, device)
    n_rows = kv.shape[0] * (kv.shape[1] if kv.dim() == 3 else 1)
    idx, length, sink = case_indices(torch, case, n_rows, gen, device)
    scale = d_qk ** -0.5
    out = torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device=device)
    o, ml, lse = mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=scale, topk_length=length, attn_sink=sink,
                                           out=out, kernel=kernel)
    ro, rml, rlse = sp_ref.reference(q, kv, idx, softmax_scale=scale, topk_length=length, attn_sink=sink)
    torch.cuda.synchronize()
    return judge(torch, (o, ml, lse), (ro, rml, rlse))


def judge(torch, got, ref, out_tol: float = 1e-2, stat_tol: float = 2e-3, bound=None) -> tuple[bool, str]:
    """A result against the float32 reference: no NaN, out within ``out_tol`` relative L2, exact
    zeros and infinities where the reference has them, lse and max_logits within ``stat_tol``
    (relative to 1 + |value|) plus ``bound`` ([Sq, H], e.g. :func:`logit_bound`) if given."""
    o, ml, lse = got
    ro, rml, rlse = ref
    problems = []
    if torch.isnan(o).any():
        problems.append("NaN in out (unwritten or computed)")
    of = o.float()
    err = ((of - ro).norm() / ro.norm().clamp_min(1e-30)).item() if ro.norm() > 0 else of.abs().max().item()
    if err > out_tol:
        problems.append(f"out rel err {err:.2e}")
    zero_rows = ro.abs().amax(-1) == 0
    if (of[zero_rows] != 0).any():
        problems.append("nonzero out where the reference is exactly 0")
    stat_err = 0.0
    for name, a, b in (("lse", lse, rlse), ("max_logits", ml, rml)):
        inf_a, inf_b = torch.isinf(a), torch.isinf(b)
        if not torch.equal(inf_a, inf_b) or not torch.equal(a[inf_a], b[inf_b]):
            problems.append(f"{name}: inf pattern differs")
            continue
        fin = ~inf_b
        if fin.any():
            diff = (a - b).abs()
            stat_err = max(stat_err, (diff[fin] / (1 + b[fin].abs())).max().item())
            allowed = stat_tol * (1 + b.abs()) + (bound if bound is not None else 0.0)
            if (diff[fin] > allowed[fin]).any():
                problems.append(f"{name} err {(diff / allowed)[fin].max().item():.2f}x the allowed")
    ok = not problems
    return ok, f"out_err={err:.2e} stat_err={stat_err:.2e} " + ("ok" if ok else "; ".join(problems))


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
                # Every other case with power-of-two scales (what V3.2's quantizer writes).
                "scales": "ue8m0" if i % 2 == 0 else "fp32",
            })
            i += 1
    # All-valid (no invalid entries), and all invalid.
    cases.append({"sq": 7, "heads": 128, "topk": 2048, "n": 8192, "invalid": 0.0, "sink": "finite"})
    cases.append({"sq": 5, "heads": 64, "topk": 128, "n": 100, "invalid": 1.0, "sink": "finite"})
    cases.append({"sq": 5, "heads": 16, "topk": 256, "n": 64, "d_qk": 512, "topk_length": "short", "sink": "mixed",
                  "kv": "paged"})
    return cases


def run_cases(name: str, cases: list, check, seed0: int, kernel=None, extra=()) -> int:
    """Each case through ``check(torch, case, seed, kernel)`` (then each ``extra(torch)``), a
    PASS / FAIL line apiece; exit code 1 if any failed."""
    import torch

    failures = 0
    t0 = time.time()
    for i, case in enumerate(cases):
        ok, msg = check(torch, case, seed=seed0 + i, kernel=kernel)
        failures += not ok
        desc = " ".join(f"{k}={v}" for k, v in case.items())
        print(f"{'PASS' if ok else 'FAIL'} [{i:2d}] {desc}: {msg}", flush=True)
    for label, fn in extra:
        ok, msg = fn(torch)
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} {label}: {msg}")
    print(f"{name} ({kernel or 'dispatched kernel'}): {failures} failure(s), {time.time() - t0:.1f}s")
    return 1 if failures else 0


def verify(kernel=None) -> int:
    return run_cases("verify", verify_cases(), check_case, 1000, kernel,
                     extra=[("cuda graph capture + replay", check_graph)])


def check_graph(torch) -> tuple[bool, str]:
    """The call captured in a CUDA graph and replayed on new inputs matches a direct call."""
    import mlagen

    inp = sp_ref.make_inputs({"sq": 64, "heads": 64, "topk": 256, "s_kv": 4096}, "cuda", seed=5)
    mlagen.mla_sparse_prefill(**inp)  # builds the kernel outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, ml, lse = mlagen.mla_sparse_prefill(**inp)
    new = sp_ref.make_inputs({"sq": 64, "heads": 64, "topk": 256, "s_kv": 4096}, "cuda", seed=6)
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
    # The FP8 cache's gather (loads to registers, L1 prefetches), paged and strided.
    ok3, m3 = check_fp8_case(torch, {"sq": 6, "heads": 20, "topk": 200, "n": 300, "invalid": 0.5, "sink": "mixed",
                                     "topk_length": "long", "kv": "p64_strided", "scales": "ue8m0"}, seed=9)
    ok4, m4 = check_fp8_case(torch, {"sq": 5, "heads": 64, "topk": 130, "n": 1, "invalid": 0.5, "kv": "p1_4d",
                                     "kv_format": "fp8_b32"}, seed=10)
    for i, m in enumerate((m1, m2, m3, m4)):
        print(f"sanitize case {i + 1}:", m)
    return 0 if ok1 and ok2 and ok3 and ok4 else 1


# --- FP8 cache (issue 10): correctness matrix and benchmark -------------------------------------
# Kept in one block so that it can move with the bench refactor.

#: Layouts of a quantized cache: (page_size, 4-D FlashMLA decode form, pages strided in memory).
FP8_LAYOUTS = {"p64": (64, False, False), "p1": (1, False, False), "p64_4d": (64, True, False),
               "p64_strided": (64, False, True), "p1_4d": (1, True, False)}


def make_fp8_kv(torch, layout: str, n: int, fmt, gen, device, spread: float = 2.0, scale_fmt: str = "fp32"):
    """A quantized cache holding >= n rows of random data whose scale blocks differ by up to
    10**±spread (so the per-block scales vary by orders of magnitude; without scales the data
    stays in e4m3's range), with scales of ``scale_fmt`` (operands.SCALE_FORMATS). Returns the cache tensor
    as a caller passes it (uint8, [blocks, page, row_bytes] or [blocks, page, 1, row_bytes];
    strided pages sit in slots twice their size)."""
    from ... import operands

    page, four_d, strided = FP8_LAYOUTS[layout]
    blocks = -(-n // page)
    rows = torch.randn((blocks * page, fmt.d_qk), generator=gen, device=device)
    groups = fmt.values // (fmt.scale_block or fmt.values)
    spread = spread if fmt.scales else 0.0
    mag = 10.0 ** ((torch.rand((rows.shape[0], groups), generator=gen, device=device) * 2 - 1) * spread)
    rows[:, :fmt.values] *= mag.repeat_interleave(fmt.values // groups, dim=1)
    cache = operands.quantize(rows, fmt, scale_fmt=scale_fmt).view(blocks, page, fmt.row_bytes)
    if strided:
        slot = torch.zeros((blocks, 2 * page, fmt.row_bytes), dtype=torch.uint8, device=device)
        slot[:, :page] = cache
        cache = slot[:, :page]
    return cache.unsqueeze(2) if four_d else cache


def fp8_cases() -> list[dict]:
    """H in {1, 16, 64, 128} x topk in {1, 33, 640, 2048} over the cache layouts, formats, sinks,
    topk_length modes and invalid-index mixes; plus all-valid, all-invalid and duplicate-heavy."""
    cases = []
    layouts = list(FP8_LAYOUTS)
    formats = ["fp8_v32", "fp8_v32", "fp8_b64", "fp8_v32", "fp8_b32", "fp8_b0"]
    sinks = ["none", "finite", "+inf", "-inf", "mixed"]
    i = 0
    for heads in (1, 16, 64, 128):
        for topk in (1, 33, 640, 2048):
            cases.append({
                "sq": 9 if topk >= 640 else 13, "heads": heads, "topk": topk, "n": 3000 if topk < 2048 else 5000,
                "kv": layouts[i % len(layouts)], "kv_format": formats[i % len(formats)], "sink": sinks[i % 5],
                "topk_length": [None, "short", "long"][i % 3 if i % 4 else 0], "idx3": i % 2 == 1,
                # Every other case with power-of-two scales (what V3.2's quantizer writes).
                "scales": "ue8m0" if i % 2 == 0 else "fp32",
            })
            i += 1
    cases.append({"sq": 7, "heads": 128, "topk": 2048, "n": 8192, "invalid": 0.0, "sink": "finite",
                  "kv": "p64", "kv_format": "fp8_v32"})
    cases.append({"sq": 5, "heads": 64, "topk": 128, "n": 100, "invalid": 1.0, "sink": "finite",
                  "kv": "p64_4d", "kv_format": "fp8_v32"})
    # Power-of-two scales from 2^-40 to 2^20: huge and tiny products, e4m3 subnormals.
    cases.append({"sq": 9, "heads": 64, "topk": 640, "n": 3000, "sink": "finite", "kv": "p64",
                  "kv_format": "fp8_v32", "scales": "ue8m0", "spread": 6.0})
    cases.append({"sq": 9, "heads": 16, "topk": 640, "n": 3000, "sink": "none",
                  "kv_format": "fp8_b32", "scales": "ue8m0", "spread": 6.0, "kv": "p1_4d"})
    # n small against topk: indices drawn with replacement repeat rows many times.
    cases.append({"sq": 6, "heads": 20, "topk": 700, "n": 37, "sink": "mixed", "topk_length": "long",
                  "kv": "p1", "kv_format": "fp8_v32"})
    return cases


#: The kernel against the reference on fp32-dequantized rows (not rounded to bf16). The kernel
#: rounds each dequantized value to bf16 (relative error <= 2**-9), so every logit moves by at
#: most softmax_scale * 2**-9 * sum_i |q_i| |k_i| (the ``logit_bound`` of its row), and lse and
#: max_logits, 1-Lipschitz in the logits, by at most the largest bound over the row's valid keys;
#: with per-block scales 10**+-2 apart the logits are large, so this bound, not a fixed tolerance,
#: is what a user should expect. out: relative L2 up to ~1.5e-2 measured on the CPU reference.
FP8_OUT_TOL = 4e-2


def logit_bound(torch, q, rows32, idx, length, scale: float):
    """[Sq, H]: the largest change bf16 rounding of the rows can make to one valid logit of each
    (token, head), softmax_scale * 2**-9 * max_j sum_i |q_i| |k_ji|; 0 for a row with no valid key."""
    sq, topk = idx.shape[0], idx.shape[-1]
    idx = idx.reshape(sq, topk).long()
    valid = (idx >= 0) & (idx < rows32.shape[0])
    if length is not None:
        valid &= torch.arange(topk, device=idx.device)[None, :] < length.long()[:, None]
    k = rows32.abs()[idx.clamp(0, rows32.shape[0] - 1)]                      # [Sq, topk, d]
    dots = torch.einsum("shd,std->sht", q.float().abs(), k)                 # [Sq, H, topk]
    dots = dots.masked_fill(~valid[:, None, :], 0.0)
    return scale * 2.0 ** -9 * dots.amax(-1)


def fp8_case_inputs(torch, case: dict, seed: int):
    """An FP8-cache case's inputs, drawn from ``seed`` on the GPU: (fmt, q (a strided view of a
    wider tensor), cache, indices, topk_length, sink, softmax_scale)."""
    from ... import operands

    device = torch.device("cuda")
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    sq, heads, n = case["sq"], case["heads"], case["n"]
    fmt = operands.get(case.get("kv_format", "fp8_v32"))
    q_big = torch.randn((sq, heads + 3, 640), generator=gen, device=device).to(torch.bfloat16)
    q = q_big[:, 1:heads + 1, :576]
    cache = make_fp8_kv(torch, case.get("kv", "p64"), n, fmt, gen, device, spread=case.get("spread", 2.0),
                        scale_fmt=case.get("scales", "fp32"))
    n_rows = cache.shape[0] * cache.shape[1]
    idx, length, sink = case_indices(torch, case, n_rows, gen, device)
    return fmt, q, cache, idx, length, sink, 576 ** -0.5


def check_fp8_case(torch, case: dict, seed: int, kernel=None) -> tuple[bool, str]:
    """One FP8-cache case, outputs poisoned with NaN first: the kernel against the float32
    reference on the values it computes with (dequantized, rounded to bf16) at the bf16
    tolerances; against the reference on fp32-dequantized rows (kv_format, no rounding) within
    the bf16 rounding bound (``logit_bound``); and bit for bit against the bf16 kernel on the bf16 copy."""
    import mlagen

    from ... import operands

    sq, heads = case["sq"], case["heads"]
    fmt, q, cache, idx, length, sink, scale = fp8_case_inputs(torch, case, seed)
    device = q.device

    def poisoned():
        return (torch.full((sq, heads, 512), math.nan, dtype=torch.bfloat16, device=device),
                torch.full((sq, heads), math.nan, device=device), torch.full((sq, heads), math.nan, device=device))

    out, ml, lse = poisoned()
    got = mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=scale, topk_length=length, attn_sink=sink, out=out,
                                    max_logits=ml, lse=lse, kernel=kernel, kv_format=fmt.name)
    copy = operands.dequantize(cache, fmt, round_bf16=True)       # [N, 576] bf16, what the kernel holds
    strict = sp_ref.reference(q, copy, idx, softmax_scale=scale, topk_length=length, attn_sink=sink)
    ok, msg = judge(torch, got, strict)
    ref32 = sp_ref.reference(q, cache, idx, softmax_scale=scale, topk_length=length, attn_sink=sink, kv_format=fmt.name)
    bound = logit_bound(torch, q, operands.dequantize(cache, fmt), idx, length, scale)
    ok32, msg32 = judge(torch, got, ref32, FP8_OUT_TOL, bound=bound)
    ok, msg = ok and ok32, f"vs bf16-rounded rows: {msg}; vs fp32-dequantized rows: {msg32}"
    out2, ml2, lse2 = poisoned()
    # The same kernel on bf16 rows: dispatch's for the call without ``kernel`` (it stages the rows
    # into bf16 and runs dispatch's bf16 kernel), else the kernel named (converting in the kernel).
    same = mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=scale, topk_length=length, attn_sink=sink, out=out2,
                                     max_logits=ml2, lse=lse2, kernel=kernel)
    torch.cuda.synchronize()
    equal = all(torch.equal(a, b) for a, b in zip(got, same))
    if not equal:
        d = (got[0].float() - same[0].float()).abs().max().item()
        ok, msg = False, msg + f"; differs from the bf16 kernel on the dequantized copy (out max diff {d:.2e})"
    return ok, msg + ("; == bf16 kernel on the dequantized copy" if equal else "")


def _spec_reading(kv_format: str, device, heads: int) -> str:
    """The spec dispatch uses for ``kv_format`` caches of ``heads`` heads on ``device``: the
    highest-priority one of the family that targets it, reads that format and is chosen unasked
    for such calls (``sp_compile.preferred``: ``problem.max_heads``, ``problem.preferred_kv_formats``)."""
    from types import SimpleNamespace

    from ...dispatch import family_specs
    from ...runtime import device_info

    target = device_info(device.index if device.index is not None else 0).target.name
    call = SimpleNamespace(heads=heads, kv_format=kv_format)
    return next(s.name for s in family_specs(FAMILY.name)
                if target in s.targets and kv_format in dict(s.specialize).get("kv_format", ())
                and sp_compile.preferred(s, call))


def verify_fp8(kernel=None) -> int:
    return run_cases("verify-fp8", fp8_cases(), check_fp8_case, 2000, kernel)


def serving_dequant(torch, cache, fmt, out):
    """The serving stacks' pass before a bf16 kernel: the cache's rows dequantized into a bf16
    buffer (torch ops; vLLM / SGLang do the same gather-and-dequantize in their own kernels)."""
    rows = cache.reshape(-1, fmt.row_bytes)
    n = rows.shape[0]
    vals = rows[:, :fmt.values].view(torch.float8_e4m3fn).float()
    if fmt.scales:
        scales = rows[:, fmt.scale_offset:fmt.rope_offset].contiguous().view(torch.float32)
        vals = (vals.view(n, fmt.scales, fmt.scale_block) * scales.unsqueeze(-1)).view(n, fmt.values)
    out[:n, :fmt.values] = vals
    out[:n, fmt.values:] = rows[:, fmt.rope_offset:].contiguous().view(torch.bfloat16)
    return out


def bench_fp8(shapes, rounds, iters, scale_fmts=("ue8m0", "fp32"), formats=("fp8_v32",)) -> None:
    """S1 / S3 from an FP8 cache (pages of 64; ``formats``, default V3.2's fp8_v32): the kernel reading it, our bf16 kernel on the dequantized bf16 copy, and the serving path (dequantize the
    request's cache into bf16, then FlashMLA if its build is found (MLAGEN_PEERS_DIR), else our bf16
    kernel). Once per scale format: "ue8m0" (powers of two, what V3.2's quantizer writes) and
    "fp32" (amax / 448).
    Interleaved rounds in one process, L2 flushed before each call; TFLOP/s by the FLOP
    convention of BENCHMARKS.md."""
    import torch

    import mlagen

    from ... import operands

    path, why = FLASHMLA.status()
    peer = FLASHMLA.load().sparse_fwd if path else None
    if peer is None:
        print(f"flashmla skipped (the serving path then runs our bf16 kernel): {why}")

    dev = torch.cuda.get_device_properties(0)
    print(f"device: {dev.name}, torch {torch.__version__}, cuda {torch.version.cuda}, {time.strftime('%Y-%m-%d %H:%M')}")
    flush = measure.L2Flush("cuda")
    rows = []
    for name, fmt_name, scale_fmt in itertools.product(shapes, formats, scale_fmts):
        fmt = operands.get(fmt_name)
        shape = dataclasses.replace(sp_problem.parse_shape(name), kv_format=fmt.name)
        inp = sp_ref.make_inputs(shape, "cuda", seed=0)
        q, cache, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
        if scale_fmt != "fp32":   # make_inputs quantizes with amax / 448
            cache = operands.quantize(operands.dequantize(cache, fmt), fmt, scale_fmt=scale_fmt).view(cache.shape)
        copy = operands.dequantize(cache, fmt, round_bf16=True)
        buf = torch.empty_like(copy)
        fl = sp_problem.flops(shape.sq, shape.heads, shape.topk)
        in_kernel = _spec_reading(fmt.name, q.device, shape.heads)
        fns = {   # "fp8": the call as users write it (staged into bf16 first); "fp8_kernel": converted in the kernel
            "fp8": lambda: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=sc, attn_sink=sink,
                                                     kv_format=fmt.name),
            "fp8_kernel": lambda: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=sc, attn_sink=sink,
                                                            kv_format=fmt.name, kernel=in_kernel),
            "bf16_copy": lambda: mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=sc, attn_sink=sink),
        }
        if shape.heads <= 16:   # the H <= 16 kernel reads FP8 caches when asked by name (not dispatch's choice)
            fns["fp8_h16"] = lambda: mlagen.mla_sparse_prefill(q, cache, idx, softmax_scale=sc, attn_sink=sink,
                                                               kv_format=fmt.name, kernel="mla_sparse_prefill_sm90_h16")
        if peer is not None:
            # FlashMLA takes 64 or 128 heads: fewer are padded with zero queries (as serving stacks do).
            qp, sp = q, sink
            if shape.heads not in (64, 128):
                qp = torch.zeros((q.shape[0], 64, q.shape[2]), dtype=q.dtype, device=q.device)
                qp[:, :shape.heads] = q
                if sink is not None:
                    sp = torch.zeros(64, dtype=sink.dtype, device=sink.device)
                    sp[:shape.heads] = sink
            fns["serving"] = lambda: peer(qp, serving_dequant(torch, cache, fmt, buf).view(-1, 1, 576), idx, sc, 512,
                                          sp, None)
        else:
            fns["serving"] = lambda: mlagen.mla_sparse_prefill(q, serving_dequant(torch, cache, fmt, buf), idx,
                                                               softmax_scale=sc, attn_sink=sink)
        results = {k: f() for k, f in fns.items()}
        # Bit for bit: the staged call against dispatch's kernel on the bf16 copy, the in-kernel
        # conversion against the same spec on the copy (dispatch may take another for bf16 rows).
        twin = mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=sc, attn_sink=sink)
        twin_k = mlagen.mla_sparse_prefill(q, copy, idx, softmax_scale=sc, attn_sink=sink, kernel=in_kernel)
        torch.cuda.synchronize()
        same = torch.equal(results["fp8"][0], twin[0]) and torch.equal(results["fp8_kernel"][0], twin_k[0])
        times = {k: [] for k in fns}
        for _ in range(rounds):
            for k, f in fns.items():
                times[k].append(measure.median(measure.time_calls(f, iters, flush)) * 1e3)   # ms
        med = {k: measure.median(v) for k, v in times.items()}
        row = {"shape": shape.id, "format": fmt.name, "scales": scale_fmt, **{f"{k}_ms": v for k, v in med.items()},
               **{f"{k}_tflops": fl / v / 1e9 for k, v in med.items()},
               "fp8_vs_bf16_copy": med["bf16_copy"] / med["fp8"], "fp8_vs_serving": med["serving"] / med["fp8"],
               "fp8_kernel_vs_bf16_copy": med["bf16_copy"] / med["fp8_kernel"],
               "fp8_kernel_vs_serving": med["serving"] / med["fp8_kernel"],
               **({"h16_vs_fp8": med["fp8"] / med["fp8_h16"]} if "fp8_h16" in med else {}),
               "serving_peer": "flashmla" if peer is not None else "ours (bf16)", "fp8_equals_bf16_copy": same,
               "rounds": times}
        rows.append(row)
        print(row, flush=True)
        fns = results = twin = twin_k = inp = cache = copy = buf = None   # free the tensors before the next shape
        torch.cuda.empty_cache()
    print()
    print('On the FP8 cache: "call" as users write it (staged: the rows dequantized into a bf16 '
          'workspace first), "in-kernel" with the kernel named (rows converted by its producer warps); '
          "both bit for bit the bf16 kernel on the dequantized copy (" + ("yes" if all(r["fp8_equals_bf16_copy"]
                                                                              for r in rows) else "NO") + ")")
    print("| shape | format | scales | call ms | call TFLOP/s | in-kernel ms | bf16 on copy ms | serving ms | "
          "call / bf16-copy | call / serving | in-kernel / bf16-copy | in-kernel / serving | "
          "H <= 16 kernel on the FP8 cache ms (x call) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        old = f"{r['fp8_h16_ms']:.3f} ({r['h16_vs_fp8']:.2f}x)" if "fp8_h16_ms" in r else "-"
        print(f"| {r['shape']} | {r['format']} | {r['scales']} | {r['fp8_ms']:.3f} | {r['fp8_tflops']:.0f} | "
              f"{r['fp8_kernel_ms']:.3f} | {r['bf16_copy_ms']:.3f} | {r['serving_ms']:.3f} | {r['fp8_vs_bf16_copy']:.3f} | "
              f"{r['fp8_vs_serving']:.3f} | {r['fp8_kernel_vs_bf16_copy']:.3f} | {r['fp8_kernel_vs_serving']:.3f} | {old} |")


# --- benchmark and profile ---------------------------------------------------------------------


def variant_peer(text: str) -> Peer:
    """An ``mlagen`` peer that forces one variant of the sm90 spec, from ``name=value,...`` (the
    others at their defaults): for comparing tunables in the same process as the default."""
    from ... import spec as spec_mod
    from ... import variant as variant_mod

    spec = spec_mod.load("mla_sparse_prefill_sm90")
    values = variant_mod.parse_assignments(spec, [text])
    variant_mod.make(spec, {**values, "d_qk": 576, "paged": False})   # names and values checked now
    ours = FAMILY.peers()["mlagen"]

    def prepare(shape, inputs, arg=None):
        v = variant_mod.make(spec, {**values, **sp_compile.specialization(shape)})
        return ours.prepare(shape, inputs, v)

    return Peer(f"mlagen:{text}", f"the public call with the variant {text} forced", prepare, ours=True)


def bench(shapes: str, rounds: int, iters: int, peers: str | None, variant_texts=(), json_path=None) -> int:
    """``mlagen bench`` on sparse shapes (its timing, report and JSON), plus forced variants."""
    from ... import bench as bench_mod

    names = bench_mod.parse_peers(peers, [FAMILY]) if peers else bench_mod.default_peers(FAMILY, print)
    results = bench_mod.run(shapes, [*names, *map(variant_peer, variant_texts)], iters=iters, rounds=rounds)
    env = bench_mod.environment()
    print(bench_mod.format_table(results, env))
    if json_path:
        from ...cache import atomic_write

        atomic_write(json_path, bench_mod.results_to_json(results, env).encode())
    return 1 if any(p.ours and p.wrong for r in results for p in r.peers.values()) else 0


def profile(shape_text: str) -> int:
    """One call of ours and one of FlashMLA's (if built) on the same inputs (run under ncu)."""
    import torch

    import mlagen
    from .peers import FLASHMLA

    shape = sp_problem.parse_shape(shape_text)
    inp = sp_ref.make_inputs(shape, "cuda", seed=0)
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
    ap = argparse.ArgumentParser(prog="mlagen.families.mla_sparse_prefill.tools")
    sub = ap.add_subparsers(dest="cmd", required=True)
    v = sub.add_parser("verify")
    v.add_argument("--kernel", default=None, help="force a spec, e.g. mla_sparse_prefill_sm80")
    sub.add_parser("sanitize")
    vf = sub.add_parser("verify-fp8", help="the FP8-cache correctness matrix (issue 10)")
    vf.add_argument("--kernel", default=None)
    bf = sub.add_parser("bench-fp8", help="S1/S3 from an FP8 cache "
                                          "vs bf16 on the copy (ours, FlashMLA) vs the serving path")
    bf.add_argument("--formats", default="fp8_v32", help="cache formats (kv_format values), e.g. fp8_v32,fp8_b64")
    bf.add_argument("--shapes", default="S1,S3")
    bf.add_argument("--rounds", type=int, default=3)
    bf.add_argument("--iters", type=int, default=30)
    bf.add_argument("--scales", default="ue8m0,fp32", help="scale formats of the cache (operands.SCALE_FORMATS)")
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
        if args.cmd == "bench-fp8":   # the arguments first, then the GPU
            from ... import operands

            args.formats = tuple(args.formats.split(","))
            fp8 = [n for n in operands.NAMES if operands.get(n).quantized and operands.get(n).d_qk == 576]
            bad = [f for f in args.formats if f not in fp8]
            if bad:   # S1-S6 are d_qk 576; fp8_v4 (d_qk 512) is timed by tools/bench_fp8_v4.py
                raise ValueError(f"--formats: {bad[0]!r} is not an FP8 cache format; one of {fp8}")
        measure.require_gpu(args.cmd)
        if args.cmd == "verify":
            return verify(args.kernel)
        if args.cmd == "sanitize":
            return sanitize()
        if args.cmd == "verify-fp8":
            return verify_fp8(args.kernel)
        if args.cmd == "bench-fp8":
            bench_fp8(args.shapes.split(","), args.rounds, args.iters, tuple(args.scales.split(",")), args.formats)
            return 0
        if args.cmd == "profile":
            return profile(args.shape)
        return bench(args.shapes, args.rounds, args.iters, args.peers, args.variant, args.json)
    except (MlagenError, ValueError) as exc:   # a bad argument or no GPU: one line, no traceback
        print(f"mlagen.families.mla_sparse_prefill.tools: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
