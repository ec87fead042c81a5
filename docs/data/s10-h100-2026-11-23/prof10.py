"""One call each of the sparse kernel on an FP8 cache (bf16 mode) and on its bf16 copy, inside
cudaProfilerStart/Stop (ncu --profile-from-start off). Usage: prof10.py [SHAPE]"""
import sys, dataclasses, torch
import mlagen
from mlagen import operands
from mlagen.families import mla_sparse_prefill as fam
shape = dataclasses.replace(fam.parse_shape(sys.argv[1] if len(sys.argv) > 1 else "sq=1024,h=128,topk=2048,skv=8192"),
                            kv_format="fp8_v32")
inp = fam.make_inputs(shape, "cuda", seed=0)
fmt = operands.get("fp8_v32")
cache = operands.quantize(operands.dequantize(inp["kv"], fmt), fmt, scale_fmt="ue8m0").view(inp["kv"].shape)
copy = operands.dequantize(cache, fmt, round_bf16=True)
kw = dict(softmax_scale=inp["softmax_scale"], attn_sink=inp["attn_sink"])
calls = [lambda: mlagen.mla_sparse_prefill(inp["q"], cache, inp["indices"], kv_format="fp8_v32", **kw),
         lambda: mlagen.mla_sparse_prefill(inp["q"], copy, inp["indices"], **kw)]
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for f in calls:
    f()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
