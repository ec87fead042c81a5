#!/usr/bin/env bash
# One GPU against two: `mlagen tune mla_prefill_sm90 --shape D1` with --devices 0 and --devices 0,1,
# each with a fresh database, output directory and (cold) compile cache, at --max-trials 80 and at
# the default trial budget. Logs, per-GPU time lines and a summary with the ratios go to $OUT.
#   OUT=/some/dir [SKIP80=1] [WARM=1] bash tools/measure_tune_gpus.sh [SEED]   (SKIP80=1: only the default budget)
# WARM=1: one compile cache for every run, filled first by an untimed tune of the same shape and seed,
# so that the timed runs compare the GPUs' work with the compile wait gone (the same state for both).
set -u
: "${OUT:?set OUT to the directory for the logs}"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
SEED=${1:-1}
T=$(mktemp -d)
{ nvidia-smi -L; nproc; git log -1 --oneline 2>/dev/null; python3 -c "import torch; print('torch', torch.__version__)"; } \
  > "$OUT/env.txt" 2>&1
run() { # name devices trials-option...
  local name=$1 devices=$2; shift 2
  local t0=$EPOCHREALTIME rc
  local cache=$T/cache-$name
  [ "${WARM:-0}" = 1 ] && cache=$T/cache-shared
  MLAGEN_OUT_DIR=$T/$name MLAGEN_CACHE_DIR=$cache timeout 400 python3 -m mlagen.cli tune mla_prefill_sm90 \
    --shape D1 --seed "$SEED" --no-progress --devices "$devices" --db "$T/$name.sqlite" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  local w; w=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME-$t0}")
  echo "$name devices=$devices rc=$rc wall_s=$w $(grep -m1 'final \*' "$OUT/$name.log" | awk '{print "final", $3, $NF}')" \
    | tee -a "$OUT/summary.txt"
  grep -E '^(  search [0-9.]+ s|  compiles: |  compile queue: |  measured ahead |  GPU worker |D1: .* ready after)' "$OUT/$name.log" | sed "s/^/  $name:/" | tee -a "$OUT/summary.txt"
}
[ "${WARM:-0}" = 1 ] && run warmup 0,1
[ "${SKIP80:-0}" = 1 ] || run t80_1gpu 0 --max-trials 80
[ "${SKIP80:-0}" = 1 ] || run t80_2gpu 0,1 --max-trials 80
run default_1gpu 0
run default_2gpu 0,1
awk '{for(i=1;i<=NF;i++)if($i~/^wall_s=/){split($i,a,"=");w[$1]=a[2]}}
     END{if (w["t80_1gpu"] > 0) printf "ratio 80 trials %.3f\n", w["t80_2gpu"]/w["t80_1gpu"];
         if (w["default_1gpu"] > 0) printf "ratio default trials %.3f\n", w["default_2gpu"]/w["default_1gpu"]}' \
  "$OUT/summary.txt" | tee -a "$OUT/summary.txt"
rm -rf "$T"
