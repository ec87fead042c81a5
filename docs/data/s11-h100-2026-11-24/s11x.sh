#!/usr/bin/env bash
# Session 11 H100 call x: Nsight Compute on the final H<=16 kernel and the 64-head kernel (sq=1024, H=16): L2 and
# shared-memory throughput, to say what bounds the kernel now.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
D=docs/data/s11-h100-2026-11-24; P=docs/data/s10-h100-2026-11-23
NCU=/usr/local/cuda/bin/ncu
timeout 200 $NCU --profile-from-start off --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --metrics lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed,lts__t_requests.sum,lts__t_sector_hit_rate.pct,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,dram__bytes_read.sum -o /tmp/rep python3 $D/prof11.py > /tmp/ncu.log 2>&1
echo "ncu rc=$?"; tail -1 /tmp/ncu.log
$NCU -i /tmp/rep.ncu-rep --csv --page raw > $OUT/raw.csv
python3 - $OUT/raw.csv <<'PY'
import csv, io, sys
lines = open(sys.argv[1]).read().splitlines()
i = next(k for k, l in enumerate(lines) if l.startswith('"ID"'))
rows = list(csv.reader(io.StringIO("\n".join(lines[i:]))))
hdr, units, data = rows[0], rows[1], rows[2:]
want = ["gpu__time_duration.sum", "lts__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed",
        "lts__t_requests.sum", "lts__t_sector_hit_rate.pct", "dram__bytes_read.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed", "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
        "smsp__issue_active.avg.pct_of_peak_sustained_active"]
print(" | ".join(r[4][-50:] for r in data))
for w in want:
    if w in hdr:
        j = hdr.index(w); print(f"{w:70s} " + " | ".join(r[j] for r in data) + " " + units[j])
PY
