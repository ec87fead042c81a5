#!/usr/bin/env bash
# Session 22 (2x H200) call d: tensors on a device other than the current one. First the loader as it
# was (HEAD before the fix: runtime_before.py.txt) in a copy of the tree, expected to fail; then the
# fixed tree's multi-device test and the whole GPU suite (its two-GPU tune tests run here too).
export PYTHONUNBUFFERED=1 MLAGEN_OUT_DIR=/tmp/mlo NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); S=$OUT/summary.txt; D=docs/data/s22-h200-2026-11-28
el() { echo $(( $(date +%s)-T0 )); }
nvidia-smi -L >> $S
rm -rf /tmp/old && mkdir /tmp/old && cp -r mlagen tests pyproject.toml templates specs /tmp/old/ && cp $D/runtime_before.py.txt /tmp/old/mlagen/runtime.py
(cd /tmp/old && PYTHONPATH=/tmp/old timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_multi_device_gpu.py -x > $OUT/d-before.log 2>&1; echo "before the fix: multi-device rc=$? $(el)s" >> $S)
export PYTHONPATH=$PWD
timeout 470 python3 -m pytest -q -p no:cacheprovider tests/gpu -rxXs > $OUT/d-gpu-tests.log 2>&1
echo "after the fix: gpu suite rc=$? $(el)s" >> $S
cat $S; grep -E "Error|error|assert" $OUT/d-before.log | head -8; tail -8 $OUT/d-gpu-tests.log
