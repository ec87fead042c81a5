"""One call each of the dispatched bf16 and FP8 kernels inside cudaProfilerStart/Stop (ncu --profile-from-start off).
Usage: prof9.py SHAPE"""
import sys, torch
from mlagen.families import get as get_family
family = get_family("mla_prefill")
shape = family.shapes()[sys.argv[1]]
bf = family.make_inputs(shape, "cuda", 0)
f8 = family.make_inputs(shape, "cuda", 0, dtype="fp8_e4m3")
for inp in (bf, f8):
    family.call(inp)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for inp in (bf, f8):
    family.call(inp)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
