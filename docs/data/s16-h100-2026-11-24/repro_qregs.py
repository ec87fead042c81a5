"""Call g: the open race of docs/notes.md ("Wrong results with Q in registers on multi-tile schedulers"):
the three variants the 2026-11-23 global re-tune recorded as wrong_result, each called in a loop on D4 and D6
(the shapes they failed on) and compared with the shipped (Q in shared memory) kernel's output on the same
inputs. Run on the device copy with the spec's constraint removed; argv[1] names the build ("base" or "fence").
Outputs are poisoned with NaN before each call. A call is wrong when its lse differs from the reference kernel's by more than 1e-2 anywhere or its output by
more than 1e-2 relative L2 (kernel-to-kernel differences are ~1e-3)."""
import sys, torch
import mlagen
import mlagen.api
from mlagen import dispatch
from mlagen.families import get

label = sys.argv[1]
fam = get("mla_prefill")
SYMS = [
    "mla_prefill_sm90_causal_c2_n128_s2_qregs_onone_ov1_rsoverlapped_pwearly_schdynamic_epdirect_lw2_rp24_rc240_sq128_sk128_sv128_cl1_dgfull",
    "mla_prefill_sm90_causal_c2_n128_s2_qregs_opingpong_ov1_rsoverlapped_pwearly_schpersistent_epdirect_lw2_rp24_rc240_sq128_sk128_sv128_cl1_dgfull",
    "mla_prefill_sm90_causal_c2_n128_s2_qregs_opingpong_ov1_rsfirst_pwearly_schdynamic_epdirect_lw1_rp24_rc240_sq128_sk128_sv128_cl1_dgfull",
]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 40
print(label, torch.cuda.get_device_name(), flush=True)
for sid in ("D4", "D6"):
    shape = fam.parse_shape(sid)
    inp = fam.make_inputs(shape, "cuda", seed=0)
    kw = {k: inp[k] for k in ("k_rope", "cu_seqlens_q", "cu_seqlens_k", "causal")}
    ref_out, ref_lse = mlagen.mla_prefill(inp["q"], inp["k"], inp["v"], **kw)
    ref_out, ref_lse = ref_out.float(), ref_lse.clone()
    ref_sel = mlagen.api.mla_prefill_kernel(inp["q"], inp["k"], inp["v"], **kw)
    print(f"{label} {sid} reference kernel {ref_sel.variant.symbol} ({ref_sel.origin}) binary {ref_sel.binary.key[:12]}")
    exact = None
    if sid == "D6":   # small enough for the float32 reference
        from mlagen.families.mla_prefill.reference import reference
        exact = reference(inp["q"], inp["k"], inp["v"], **kw)
        print(f"{label} {sid} reference kernel vs float32: out {((ref_out - exact[0]).norm() / exact[0].norm()).item():.2e}, "
              f"lse {(ref_lse - exact[1]).abs().max().item():.2e}")
    for sym in SYMS:
        v = dispatch.kernel_choice("mla_prefill", sym)
        sel = mlagen.api.mla_prefill_kernel(inp["q"], inp["k"], inp["v"], kernel=v, **kw)
        print(f"{label} {sid} variant runs {sel.variant.symbol} ({sel.origin}) binary {sel.binary.key[:12]}")
        wrong, worst_l, worst_o = 0, 0.0, 0.0
        for i in range(N):
            # Poisoned outputs: a kernel that writes nothing must not pass for one that writes the reference
            # (the caching allocator hands a freed block back with its old contents).
            out = torch.full(ref_out.shape, float("nan"), device="cuda").to(torch.bfloat16)
            lse = torch.full(ref_lse.shape, float("nan"), device="cuda")
            mlagen.mla_prefill(inp["q"], inp["k"], inp["v"], kernel=v, out=out, lse=lse, **kw)
            dl = (lse - ref_lse).abs().nan_to_num(1e9).max().item()
            do = ((out.float() - ref_out).norm() / ref_out.norm()).item()
            if do != do or dl != dl:   # NaN: an element never written
                do = dl = float("inf")
            worst_l, worst_o = max(worst_l, dl), max(worst_o, do)
            wrong += dl > 1e-2 or do > 1e-2
            if exact is not None and i == 0:
                print(f"{label} {sid}   first call vs float32: out {((out.float() - exact[0]).norm() / exact[0].norm()).item():.2e}, "
                      f"lse {(lse - exact[1]).abs().nan_to_num(1e9).max().item():.2e}")
        print(f"{label} {sid} {sym[17:60]}... wrong {wrong}/{N}, worst lse diff {worst_l:.2e}, out {worst_o:.2e}",
              flush=True)
