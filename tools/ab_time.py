"""Time a kernel spec against its base revision in one process: the A/B that decides whether a
kernel change slowed anything down.

``tools/ab_install.py SPEC REV`` first installs the revision's kernel beside the working tree's as
``<SPEC>_base``. This script then builds, for each case, the variant the public call would run
(the nearest shipped record of SPEC for the case's shape class, else the spec's default, plus the
shape's specialization) from both specs with the same tunables, checks both against the
reference once, and times them interleaved: ``--rounds`` rounds of ``--iters`` calls each, the
order reversed every other round, the L2 cache flushed before every call (CUDA events,
``mlagen.measure``). It prints one JSON line per case and the table; new / base above 1 means the
working tree's kernel is faster.

    python3 tools/ab_install.py mla_prefill_sm90 b865296
    python3 tools/ab_time.py mla_prefill_sm90 --cases D1,D2,D3,D4,D5,D6,D7 --json ab.json
    python3 tools/ab_time.py mla_prefill_sm90_fp8 --cases D1,D3 --dtype fp8_e4m3
    python3 tools/ab_time.py mla_sparse_prefill_sm90 --cases S1,S2,S4,S6,sq=4096,h=128,topk=2048,skv=8192,kv=fp8_v32
    python3 tools/ab_install.py mla_prefill_sm90 --remove

A case is a shape id or description of the spec's family; ``--default`` also times each case at
the spec's default variant (no record). Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys

#: Shape ids (D1, S10, M3, V1) or descriptions, split at commas that start a new shape.
_CASE_START = re.compile(r",(?=(?:[A-Za-z]+\d+)(?:,|$)|(?:b|sq)=)")


def split_cases(text: str) -> list[str]:
    """``D1,D2,b=2,q=[1,5],h=8`` -> ``["D1", "D2", "b=2,q=[1,5],h=8"]``: a comma starts a new case
    only before a shape id or a description's first key (``b=`` dense, ``sq=`` sparse)."""
    return [c for c in _CASE_START.split(text.strip()) if c]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", help="the working tree's spec; <spec>_base must be installed (tools/ab_install.py)")
    ap.add_argument("--cases", required=True, help="comma-separated shape ids or descriptions of the spec's family")
    ap.add_argument("--dtype", default=None, help="dense input dtype (bf16, fp8_e4m3); default: the family's")
    ap.add_argument("--default", action="store_true", help="also time each case at the spec's default variant")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=16, help="parallel compiles")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import torch

    from mlagen import db, families, shapes, spec as spec_mod, variant as variant_mod
    from mlagen.build import build_many
    from mlagen.errors import MlagenError
    from mlagen.measure import L2Flush, time_calls

    if not torch.cuda.is_available():
        raise SystemExit("ab_time: needs a CUDA GPU")
    spec = spec_mod.load(args.spec)
    try:
        spec_b = spec_mod.load(args.spec + "_base")
    except Exception as e:  # noqa: BLE001 - the loader's own message says what is wrong
        raise SystemExit(f"ab_time: {args.spec}_base is not installed (run tools/ab_install.py {args.spec} REV): {e}")
    fam = families.get(spec.family)
    records = [r for r in db.shipped_records() if r.key.spec == args.spec]
    base_axes = dict(spec_b.specialize)

    jobs = []
    for text in split_cases(args.cases):
        shape = shapes.parse_shape(text, spec.family)
        key = str(fam.problem_key(shape))
        extra = fam.specialization(shape)
        tunables, why = {}, "spec default"
        ranked = sorted(((fam.problem_distance(key, r.key.problem), r.key.problem, r) for r in records),
                        key=lambda c: (c[0], c[1]))
        if ranked and ranked[0][0] != float("inf"):
            tunables, why = dict(ranked[0][2].variant), f"record {ranked[0][1]} (d={ranked[0][0]})"
        choices = [(text, tunables, why)] + ([(f"{text} (default)", {}, "spec default")] if args.default and tunables else [])
        for name, tun, reason in choices:
            new = variant_mod.make(spec, {**tun, **extra})
            base = variant_mod.make(spec_b, {**new.tunables, **{k: v for k, v in extra.items() if k in base_axes}})
            jobs.append((name, shape, new, base, reason))
    build_many([v for j in jobs for v in j[2:4]], ["sm_90a"], jobs=args.jobs)

    dev = torch.device("cuda")
    flush = L2Flush(dev)
    results = {}
    for name, shape, new, base, why in jobs:
        inputs = fam.make_inputs(shape, dev, dtype=args.dtype) if args.dtype else fam.make_inputs(shape, dev)
        outs = fam.make_outputs(shape, dev)
        calls = {"new": lambda: fam.call(inputs, variant=new, outputs=outs),
                 "base": lambda: fam.call(inputs, variant=base, outputs=outs)}
        # The two kernels' outputs on the same inputs (the working tree's tests check each against
        # the reference): bit-identical when the change left the arithmetic alone.
        try:
            got = {side: fam.call(inputs, variant=v, outputs=fam.make_outputs(shape, dev))[0]
                   for side, v in (("new", new), ("base", base))}
        except MlagenError as e:   # e.g. a spec default its rules refuse for this specialization
            results[name] = dict(refused=str(e).splitlines()[0], variant=new.symbol, why=why)
            print(json.dumps({"case": name, **results[name]}), flush=True)
            continue
        same = bool(torch.equal(got["new"], got["base"]))
        diff = float((got["new"].float() - got["base"].float()).abs().nan_to_num(float("inf")).max())
        del got
        times = {"new": [], "base": []}
        for r in range(args.rounds):
            for side in (("new", "base") if r % 2 == 0 else ("base", "new")):
                times[side].extend(time_calls(calls[side], args.iters, flush))
        tn, tb = statistics.median(times["new"]), statistics.median(times["base"])
        results[name] = dict(new_ms=round(tn * 1e3, 4), base_ms=round(tb * 1e3, 4), new_over_base=round(tb / tn, 4),
                             tflops_new=round(fam.flops(shape) / tn / 1e12, 1), variant=new.symbol, why=why,
                             outputs_identical=same, max_abs_difference=diff)
        print(json.dumps({"case": name, **results[name]}), flush=True)
    print("\n| case | variant's origin | new ms | base ms | new / base | TFLOP/s new | outputs |\n|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if "refused" in r:
            print(f"| {name} | {r['why']} | - | - | - | - | not run: {r['refused']} |")
            continue
        agree = "identical" if r["outputs_identical"] else f"max diff {r['max_abs_difference']:.1e}"
        print(f"| {name} | {r['why']} | {r['new_ms']:.3f} | {r['base_ms']:.3f} | {r['new_over_base']:.3f} | "
              f"{r['tflops_new']:.0f} | {agree} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
