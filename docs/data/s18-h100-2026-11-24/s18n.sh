#!/usr/bin/env bash
# Session 18 H100 call n: Nsight Compute of D3 with V^T in the kernel against the pre-pass (the same
# schedule): where the 1-4% goes (shared-memory wavefronts, tensor pipe, issue, stalls).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
NCU="/usr/local/cuda/bin/ncu --profile-from-start off --clock-control none --set full --import-source no"
timeout 400 $NCU --csv --page raw python3 docs/data/s18-h100-2026-11-24/prof18.py > $OUT/n-ncu.csv 2> $OUT/n-ncu.err; echo "ncu rc=$?"
tail -3 $OUT/n-ncu.err
python3 - <<'PY'
import csv, os
rows = list(csv.reader(open(os.environ["OUT"] + "/n-ncu.csv")))
hdr = rows[0]
want = ["Kernel Name", "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second", "sm__inst_executed.sum",
        "smsp__issue_active.avg.pct_of_peak_sustained_active",
        "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
        "smsp__average_warp_latency_issue_stalled_long_scoreboard", "l1tex__throughput.avg.pct_of_peak_sustained_active",
        "sm__memory_throughput.avg.pct_of_peak_sustained_active", "lts__t_sectors.sum", "dram__bytes_read.sum"]
for r in rows[2:]:
    d = dict(zip(hdr, r))
    print(" | ".join(f"{w.split('.')[0][-40:]}={d.get(w, '?')[:60]}" for w in want))
stall = [h for h in hdr if h.startswith("smsp__average_warp_latency_issue_stalled_") or h.startswith("smsp__pcsamp_warps_issue_stalled_")]
for r in rows[2:]:
    d = dict(zip(hdr, r))
    top = sorted(((float(d[h].replace(",", "")) if d[h].replace(",", "").replace(".", "").isdigit() else 0, h) for h in stall), reverse=True)[:8]
    print(d["Kernel Name"][-40:], [(h.replace("smsp__pcsamp_warps_issue_stalled_", "")[:30], v) for v, h in top])
PY
