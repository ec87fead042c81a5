#!/usr/bin/env bash
# Session 22 (H200) call a: the peers built in the background (FA3 bf16, FlashMLA sparse, FA3 FP8) while the
# whole GPU suite runs on the tree as found (session 21's tuner commits were never run on a GPU after
# their last change). Run from the repository root on the device machine; logs under $OUT.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo
T0=$(date +%s); S=$OUT/summary.txt
el() { echo $(( $(date +%s)-T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"; } >> $S 2>&1
(env -u OUT nice python3 shared/peers/fa3/build_fa3.py --build-dir shared/peers/fa3/build --jobs 5 > /tmp/fa3build.log 2>&1; echo "fa3 build rc=$? $(el)s" >> $S) &
(env -u OUT nice bash shared/peers/flashmla/run_remote.sh --jobs 5 > /tmp/flashmla.log 2>&1; echo "flashmla build rc=$? $(el)s" >> $S) &
(env -u OUT nice python3 tools/fa3_fp8/build.py --no-copy-out --jobs 5 > /tmp/fa3fp8.log 2>&1; echo "fa3 fp8 build rc=$? $(el)s" >> $S) &
timeout 540 python3 -m pytest -q -p no:cacheprovider tests/gpu -rxXs > $OUT/a-gpu-tests.log 2>&1
echo "gpu tests rc=$? $(el)s" >> $S
wait
cat $S; tail -12 $OUT/a-gpu-tests.log
