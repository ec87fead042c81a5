"""Session 20: abvar.py (session 19) plus, for every candidate, the FP8 accumulator's bias: the same
shape with V = 1 + 0.1 N(0, 1) per channel (quantized per head like the test data), out against the
float32 reference on heads 0-1 as relative L2 and least-squares ratio (1.0 = unbiased).
usage: abvar2.py SPEC D1,D3 ROUNDS key=v[,key=v] ...   (--compile: only build every candidate, no GPU)"""
import json
import sys
from pathlib import Path

from mlagen import spec, variant
from mlagen.families import get

fam = get("mla_prefill")
ROOT = Path(__file__).resolve().parents[3]
RECORDS = json.loads((ROOT / "mlagen/tuned/h100.json").read_text())["best"]
args = [a for a in sys.argv[1:] if not a.startswith("--")]
MEAN = float(next((a.split("=")[1] for a in sys.argv if a.startswith("--mean=")), 1.0))  # V = MEAN + 0.1 N(0, 1)
compile_only = "--compile" in sys.argv
sp_name, shapes, rounds = args[0], args[1], int(args[2])
overrides = [{}] + [dict(kv.split("=", 1) for kv in a.split(",")) for a in args[3:]]
dtype = "fp8_e4m3" if sp_name.endswith("fp8") else "bf16"
conv = lambda v: int(v) if v.lstrip("-").isdigit() else {"True": True, "False": False}.get(v, v)


def candidates(sid):
    shape = fam.shapes()[sid]
    mask = "causal" if shape.causal else "none"
    key = f"{mask}/h{shape.heads}/q{shape.q_lens[0]}/k{shape.k_lens[0]}"
    rec = next(r for r in RECORDS if r["spec"] == sp_name and r["problem"] == key)
    bf = next(r for r in RECORDS if r["spec"] == "mla_prefill_sm90" and r["problem"] == key)
    out = []
    for o in overrides:
        vals = {**rec["variant"], **{k: conv(v) for k, v in o.items()}}
        name = "record" + ("".join(f" {k}={x_}" for k, x_ in o.items()) if o else "")
        out.append((name, variant.make(spec.load(sp_name), {**vals, "mask": mask})))
    return shape, out, variant.make(spec.load("mla_prefill_sm90"), {**bf["variant"], "mask": mask})


if compile_only and __name__ == "__main__":
    from mlagen.build import build_many
    vs = []
    for sid in shapes.split(","):
        _, cands, bfv = candidates(sid)
        vs += [v for _, v in cands] + [bfv]
    for r in build_many(vs, ["sm_90a"]):
        print(r.variant.symbol, r.status, r.binary.resources if r.binary else "", *r.reasons, flush=True)
    sys.exit(0)


def run():
    if "--allow-spills" in sys.argv:  # measure variants that spill a few bytes (never shipped)
        from mlagen import dispatch
        build = dispatch.build
        dispatch.build = lambda v, t, allow_spills=False: build(v, t, True)

    import torch
    from mlagen import measure
    from mlagen.families.mla_prefill.reference import quantize

    flush = measure.L2Flush(torch.device("cuda", 0))
    for sid in shapes.split(","):
        shape, cands_v, bfv = candidates(sid)
        x = fam.make_inputs(shape, "cuda", 0, dtype=dtype) if dtype != "bf16" else fam.make_inputs(shape, "cuda", 0)
        xb = dict(x)
        g = torch.Generator(device="cuda").manual_seed(1)
        vb = MEAN + 0.1 * torch.randn(x["v"].shape, generator=g, device="cuda")
        if dtype != "bf16":
            xb["v"], xb["v_descale"] = quantize(vb, dtype, per_head=True)
        else:
            xb["v"] = vb.to(torch.bfloat16)
        bf = fam.make_inputs(shape, "cuda", 0)
        ref = fam.reference(shape, x, heads=2)
        refb = fam.reference(shape, xb, heads=2)[0].double()
        cands = {"bf16 (dispatched)": lambda: fam.call(bf)}
        for name, v in cands_v:
            fn = (lambda v=v: fam.call(x, variant=v))
            got = fn()
            torch.cuda.synchronize()
            chk = fam.compare(got, ref, dtype=dtype)
            rel = float((got[0][:, :2].float() - ref[0]).double().norm() / ref[0].double().norm())
            lse = float((got[1][:, :2] - ref[1]).abs().max())
            ob = fam.call(xb, variant=v)[0][:, :2].double()
            brel = float((ob - refb).norm() / refb.norm())
            bias = float((ob * refb).sum() / (refb * refb).sum())
            print(f"{sid} {name}: {'ok' if chk.ok else 'WRONG: ' + str(chk.problem)}; out rel L2 {rel:.4f}, lse max abs "
                  f"{lse:.2e}; V={MEAN:g}+0.1N: rel L2 {brel:.4f}, out/ref {bias:.4f}", flush=True)
            if chk.ok:
                cands[name] = fn
        order = list(cands.items())
        times = {k: [] for k in cands}
        for r in range(rounds):
            for k, fn in (order if r % 2 == 0 else order[::-1]):
                times[k].append(measure.median(measure.time_calls(fn, 10, flush)) * 1e3)
        flops = fam.flops(shape)
        base = measure.median(times["record"])
        bfm = measure.median(times["bf16 (dispatched)"])
        for k, ts in times.items():
            t = measure.median(ts)
            print(f"{sid} {k}: {t:.3f} ms ({flops / t / 1e9:.0f} TFLOP/s) rounds {min(ts):.3f}-{max(ts):.3f}; "
                  f"x record {base / t:.3f}; x bf16 {bfm / t:.3f}", flush=True)


if __name__ == "__main__":
    run()
