"""S5 (H = 16) under the bench protocol (L2 flushed before each call) against back-to-back calls, for our
H <= 16 kernel, our 64-head kernel and FlashMLA padded to 64 heads (fifteenth session, call b).
Session 11 measured our H16 kernel at 1.60-1.63 ms back to back and ~1.79 ms flushed: is that loss ours?
Modes, interleaved per round: flush (L2Flush then the call), warm (the call right after the same call),
flush+kv (flush, then the KV rows read once by a copy, then the call)."""
import sys, time, torch
import mlagen
from mlagen import measure
from mlagen.families import mla_sparse_prefill as fam
from mlagen.families.mla_sparse_prefill.peers import FLASHMLA

from mlagen import spec as spec_mod, variant
def h16(**o):
    return variant.make(spec_mod.load("mla_sparse_prefill_sm90_h16"), dict(o, d_qk=576, paged=False, kv_format="bf16"))
for text in sys.argv[1:] or ["S5"]:
  shape = fam.parse_shape(text)
  inp = fam.make_inputs(shape, "cuda", seed=0)
  q, kv, idx, sink, sc = inp["q"], inp["kv"], inp["indices"], inp["attn_sink"], inp["softmax_scale"]
  print(f"{torch.cuda.get_device_name()} torch {torch.__version__} {time.strftime('%Y-%m-%d %H:%M')} shape {shape}", flush=True)
  fns = {
      "ours": lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink),
      "ours_h64": lambda: mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc, attn_sink=sink,
                                                    kernel="mla_sparse_prefill_sm90"),
      "h16_no_evict_last": lambda v=h16(l2_evict_last=False): mlagen.mla_sparse_prefill(q, kv, idx, softmax_scale=sc,
                                                                                       attn_sink=sink, kernel=v),
  }
  path, why = FLASHMLA.status()
  if path:
      peer = FLASHMLA.load().sparse_fwd
      qp = torch.zeros((q.shape[0], 64, q.shape[2]), dtype=q.dtype, device=q.device); qp[:, :q.shape[1]] = q
      sp = torch.zeros(64, dtype=sink.dtype, device=sink.device); sp[:q.shape[1]] = sink
      fns["flashmla_pad64"] = lambda: peer(qp, kv.view(-1, 1, 576), idx, sc, 512, sp, None)
  else:
      print("flashmla:", why)
  flush = measure.L2Flush("cuda")
  kvbuf = torch.empty_like(kv)
  def kvwarm():
      flush(); kvbuf.copy_(kv)
  ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
  def one(fn, pre):
      pre()
      ev[0].record(); fn(); ev[1].record()
      torch.cuda.synchronize()
      return ev[0].elapsed_time(ev[1])
  modes = {"flush": flush, "warm": None, "flush+kv": kvwarm}
  res = {(k, m): [] for k in fns for m in modes}
  for f in fns.values():
      f(); f()
  torch.cuda.synchronize()
  for rnd in range(6):
      for k, f in fns.items():
          for m, pre in modes.items():
              for _ in range(8):
                  if pre is None:
                      f()   # the previous call leaves its operands in L2
                      res[(k, m)].append(one(f, lambda: None))
                  else:
                      res[(k, m)].append(one(f, pre))
  fl = fam.flops(shape.sq, shape.heads, shape.topk)
  print(f"{'kernel':16s} " + " ".join(f"{m:>22s}" for m in modes))
  for k in fns:
      cells = []
      for m in modes:
          v = sorted(res[(k, m)]); med = v[len(v) // 2]
          cells.append(f"{med:.3f} ms {fl / med / 1e9:5.0f} TF/s")
      print(f"{k:16s} " + " ".join(f"{c:>22s}" for c in cells), flush=True)
  if "flashmla_pad64" in fns:
      for m in modes:
          a = sorted(res[("ours", m)])[len(res[("ours", m)]) // 2]; b = sorted(res[("flashmla_pad64", m)])[len(res[("flashmla_pad64", m)]) // 2]
          print(f"ours / flashmla padded, {m}: {b / a:.3f}x")
