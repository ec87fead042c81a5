#!/usr/bin/env bash
# A fleet tune on one GPU host against the local tune: a Dask scheduler, one GPU worker and four
# CPU-only workers on this host; `mlagen tune` of D1 (mla_prefill_sm90) and S1
# (mla_sparse_prefill_sm90) locally and through the cluster, same seed and options, each tune with a
# cold compile cache and a database of its own. ROUNDS rounds, the order of the two alternating
# (round 1 local first, round 2 the cluster first, ...), after one warm-up of the host (torch, the
# CUDA libraries and a context: the first process on a fresh machine reads them from disk, seconds
# that would fall on whichever tune came first). Then `mlagen db compare --retime` of round 1's
# local and cluster databases (and, with two rounds or more, of the two local ones: the spread of
# winners between two local tunes, against which the cluster's is judged): the two winners of each
# class checked and timed in one process, judged by the tuner's own noise allowance. Prints wall
# times per round, their means, winners and verdicts; logs and the databases go to $OUT.
#   [WHEELS=wheels-dask] [OUT=/tmp/cluster-tune] [TRIALS=24] [SEED=0] [ROUNDS=2] [SHAPES="D1 S1"] \
#   [TUNE_OPTS=--no-measure-ahead] bash tools/cluster_tune_h200.sh
# TUNE_OPTS: more `mlagen tune` options, the same for the local and the cluster tunes.
# WHEELS: a folder of the wheels of dask, distributed and the dependencies this machine lacks
# (installed with --no-index into /tmp/site; nothing is fetched). THREADS: each CPU worker's
# threads (default: the cores / 4, so the cluster's 4 CPU workers have as many compile slots as
# the local tune has compile processes, one per core; the GPU worker, with one thread, only
# measures). CONTROL=1 is ROUNDS=2 (its older name).
set -u
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-wheels-dask}
OUT=${OUT:-/tmp/cluster-tune}
TRIALS=${TRIALS:-24}
SEED=${SEED:-0}
PORT=${PORT:-8786}
CONTROL=${CONTROL:-0}
ROUNDS=${ROUNDS:-$([ "$CONTROL" = 1 ] && echo 2 || echo 1)}
mkdir -p "$OUT"
T=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$WHEELS"/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
python3 -c "import distributed, mlagen; print('distributed', distributed.__version__)" || exit 1
{ nvidia-smi -L; nproc; git log -1 --oneline 2>/dev/null; } > "$OUT/env.txt" 2>&1

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
trap 'exit 143' TERM INT   # through the EXIT trap: the cluster's processes end with the script
SCHED=tcp://127.0.0.1:$PORT
# The workers compile into the cluster's own cold cache; the local tune into another.
export MLAGEN_CACHE_DIR=$T/cache-cluster
python3 -m distributed.cli.dask_scheduler --host 127.0.0.1 --port "$PORT" --no-dashboard > "$OUT/scheduler.log" 2>&1 &
PIDS+=($!)
sleep 3
# The GPU worker: resource GPU=1 (measurements go only there); --no-nanny because it starts the
# measuring process itself (a nanny's worker is daemonic and may not have children); one thread:
# it only measures (the local tune's GPU worker compiles nothing either).
CUDA_VISIBLE_DEVICES=0 python3 -m distributed.cli.dask_worker "$SCHED" --no-nanny --nthreads 1 \
  --resources "GPU=1" --name gpu0 --no-dashboard > "$OUT/worker-gpu0.log" 2>&1 &
PIDS+=($!)
CPUS=$(nproc)
THREADS=${THREADS:-$(( CPUS / 4 > 1 ? CPUS / 4 : 1 ))}
for i in 1 2 3 4; do
  CUDA_VISIBLE_DEVICES= python3 -m distributed.cli.dask_worker "$SCHED" --nthreads "$THREADS" \
    --name "cpu$i" --no-dashboard > "$OUT/worker-cpu$i.log" 2>&1 &
  PIDS+=($!)
done
python3 - "$SCHED" <<'EOF' || exit 1
import sys
from distributed import Client
with Client(sys.argv[1], timeout="60s") as c:
    c.wait_for_workers(5, timeout=120)
    print("cluster:", {w["name"]: (w["nthreads"], w["resources"]) for w in c.scheduler_info(n_workers=-1)["workers"].values()})
EOF

run() { # name database spec shape [options...]
  local name=$1 db=$2 spec=$3 shape=$4; shift 4
  local t0=$EPOCHREALTIME
  MLAGEN_OUT_DIR=$T/$name timeout 200 python3 -m mlagen.cli tune "$spec" --shape "$shape" --seed "$SEED" \
    --max-trials "$TRIALS" --iters 10 --no-progress --db "$db" ${TUNE_OPTS:-} "$@" > "$OUT/$name.out" 2> "$OUT/$name.log"
  local rc=$?
  WALL[$name]=$(awk "BEGIN{printf \"%.1f\", $EPOCHREALTIME-$t0}")
  RC[$name]=$rc
  WIN[$name]=$(grep -m1 '^winner' "$OUT/$name.out" | awk '{print $2}' | tr -d ':')
  FINAL[$name]=$(sed -n 's/.*final \* \([0-9.]*\) ms.*/\1/p' "$OUT/$name.log" | head -1)
}
declare -A WALL RC WIN FINAL
# The warm-up: nothing of it is timed.
python3 -c "import torch, mlagen.tune; torch.zeros(1, device='cuda'); torch.cuda.synchronize()" || exit 1
SHAPES=${SHAPES:-D1 S1}
declare -A SPEC=([D1]=mla_prefill_sm90 [S1]=mla_sparse_prefill_sm90)
RUNS=""
for r in $(seq 1 "$ROUNDS"); do
  RUNS+=" local$r cluster$r"
  for s in $SHAPES; do
    order="local cluster"
    [ $((r % 2)) = 0 ] && order="cluster local"
    for kind in $order; do
      rm -rf "$T/cache-$kind"   # a cold compile cache for each tune (the workers' too)
      if [ "$kind" = local ]; then
        MLAGEN_CACHE_DIR=$T/cache-local run "local$r-$s" "$T/local$r.sqlite" "${SPEC[$s]}" "$s"
      else
        run "cluster$r-$s" "$T/cluster$r.sqlite" "${SPEC[$s]}" "$s" --scheduler "$SCHED"
      fi
    done
  done
done
cleanup   # the cluster's processes end before the re-timing, so nothing else runs on the host
PIDS=()
cp "$T"/*.sqlite "$OUT"/ 2>/dev/null
# Both winners of each class checked and timed in one process on this GPU.
compare() { # name A B
  MLAGEN_CACHE_DIR=$T/cache-local timeout 200 python3 -m mlagen.cli db compare "$2" "$3" --retime \
    > "$OUT/compare-$1.txt" 2> "$OUT/compare-$1.log"
  echo "rc $?" >> "$OUT/compare-$1.txt"
}
compare local-cluster "$T/local1.sqlite" "$T/cluster1.sqlite"
[ "$ROUNDS" -ge 2 ] && compare local-local2 "$T/local1.sqlite" "$T/local2.sqlite"
mean() { # shape kind: the mean wall time of that kind's tunes of the shape
  local sum=0 n=0
  for r in $(seq 1 "$ROUNDS"); do sum=$(awk "BEGIN{print $sum+${WALL[$2$r-$1]:-0}}"); n=$((n + 1)); done
  awk "BEGIN{printf \"%.1f\", $sum/$n}"
}
{
  printf '%-4s %-8s %8s %4s  %-10s %s\n' shape run wall_s rc final_ms winner
  for s in $SHAPES; do
    for r in $RUNS; do
      n=$r-$s
      printf '%-4s %-8s %8s %4s  %-10s %s\n' "$s" "$r" "${WALL[$n]}" "${RC[$n]}" "${FINAL[$n]:--}" "${WIN[$n]:--}"
    done
    echo "$s: mean wall local $(mean "$s" local) s, cluster $(mean "$s" cluster) s over $ROUNDS round(s)"
    [ "${WIN[local1-$s]}" = "${WIN[cluster1-$s]}" ] && echo "$s: same winner (round 1)" || echo "$s: winners differ (round 1)"
  done
  echo "== where the time went (each tune's log)"
  for s in $SHAPES; do
    for r in $RUNS; do
      echo "$r-$s:"
      grep -E "ready after|connected in|  search |  compiles:|GPU worker 0:|stopped in" "$OUT/$r-$s.log" | sed 's/^\[[^]]*\] //'
    done
  done
  for f in "$OUT"/compare-*.txt; do
    echo "== $(basename "$f" .txt) (A: the first, B: the second database)"
    grep -E '^(mla|  verdict|  re-timed|rc |[0-9]+ shape)' "$f"
  done
} | tee "$OUT/summary.txt"
