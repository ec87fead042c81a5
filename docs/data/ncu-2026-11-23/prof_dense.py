"""Run one peer's call on one dense shape inside cudaProfilerStart/Stop (for ncu --profile-from-start off)."""
import sys
import torch
from mlagen import bench
from mlagen.families.mla_prefill.problem import parse_shape
from mlagen.families.mla_prefill.reference import make_inputs

shape = parse_shape(sys.argv[1]); name = sys.argv[2]
inputs = make_inputs(shape, "cuda", seed=0)
peer = bench._peer_factory(name)(shape, inputs)
for _ in range(3):
    peer.fn()
torch.cuda.synchronize()
torch.cuda.profiler.start()
peer.fn()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print(name, peer.note)
