"""Session 14 call o: clock64 counters in a copy of call k's kernel (ab_ot/sparse_fp8mma_ot.cuh.txt),
written to templates/include/mlagen/sm90/sparse_fp8mma_ot.cuh of the tree it runs in (the device's
copy). Per role, cycles summed over a CTA's pairs: consumer 0 into max_logits columns 0-11,
consumer 1 into 12-23, the producer into 24-26 (thread 0 of each warpgroup, after the epilogue)."""
import os
src = open("docs/data/s14-h100-2026-11-24/ab_ot/sparse_fp8mma_ot.cuh.txt").read()


def wrap(seg, rules, var="tr"):
    out = []
    for line in seg.split("\n"):
        code = line.strip().split("//")[0].strip()
        for pat, slot in rules:
            if code.startswith(pat) and code.endswith(";"):
                ind = line[:len(line) - len(line.lstrip())]
                line = f"{ind}{{ const u64 _t0 = clock64(); {code} {var}[{slot}] += clock64() - _t0; }}"
                break
        out.append(line)
    return "\n".join(out)


def region(s, start, end):
    a = s.index(start)
    b = s.index(end, a)
    return a, b


# producer
a, b = region(src, "  static __device__ void run(const Params& p, u32 smem, const Barriers& bar, int t) {", "\n};")
seg = wrap(src[a:b], [("mbar_wait(bar.vfree(", 0), ("gather(p, smem", 1)])
seg = seg.replace("    const int tid = threadIdx.x % 128;\n", "    u64 tr[3] = {0, 0, 0};\n    const u64 _start = clock64();\n    const int tid = threadIdx.x % 128;\n", 1)
seg = seg.rstrip()
assert seg.endswith("}")
seg = seg[:-1] + """  tr[2] = clock64() - _start;
    if (tid == 0)
      for (int k = 0; k < 3; ++k) p.max_logits[(i64)t * p.ml_row_stride + 24 + k] = (float)tr[k];
  }"""
src = src[:a] + seg + src[b:]
rules = {0: [("mbar_wait(bar.kready(", 0), ("scores<Cfg>(", 1), ("mbar_wait(bar.vfree(", 2), ("named_sync(kOwnP0", 3),
             ("named_sync(kP1Ready", 4), ("issue_pv<", 5), ("wgmma_wait<1>();", 6), ("exponentiate<", 8),
             ("store_p<Cfg>(", 9), ("mask(", 10), ("block_max(", 11)],
         1: [("mbar_wait(bar.kready(", 0), ("scores<Cfg>(", 1), ("named_sync(kMax0Ready", 2), ("mbar_wait(bar.vfree(", 3),
             ("named_sync(kOwnP0 + 1", 4), ("named_sync(kP0Ready", 5), ("issue_pv<", 6), ("exponentiate<", 8),
             ("store_p<Cfg>(", 9), ("mask(", 10), ("block_max(", 11)]}
for c in (0, 1):
    head = f"__device__ void consumer{c}(const Params& p, u32 smem, const Barriers& bar, int t, int head0) {{"
    a = src.index(head)
    b = src.index(f"  epilogue<Cfg>(p, r, smem, {c}, t, head0, pairs);", a)
    seg = wrap(src[a:b], rules[c])
    seg = seg.replace("  Regs r;\n", "  Regs r;\n  u64 tr[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};\n", 1)
    seg = seg.replace("  for (int pair = 0; pair < pairs; ++pair) {", "  const u64 _start = clock64();\n  for (int pair = 0; pair < pairs; ++pair) {", 1)
    tail = f"""  tr[7] = clock64() - _start;
  epilogue<Cfg>(p, r, smem, {c}, t, head0, pairs);
  if (threadIdx.x % 128 == 0)
    for (int k = 0; k < 12; ++k) p.max_logits[(i64)t * p.ml_row_stride + 12 * {c} + k] = (float)tr[k];"""
    src = src[:a] + seg + src[b:].replace(f"  epilogue<Cfg>(p, r, smem, {c}, t, head0, pairs);", tail, 1)
# The epilogue's max_logits stores (consumer 1's) would overwrite the other roles' counters.
old_store = "      p.max_logits[(i64)t * p.ml_row_stride + heads[h]] = empty"
assert src.count(old_store) == 1
src = src.replace(old_store, "      if (false) p.max_logits[(i64)t * p.ml_row_stride + heads[h]] = empty")
print("wraps:", src.count("clock64() - _t0"))
os.makedirs("templates/include/mlagen/sm90", exist_ok=True)
open("templates/include/mlagen/sm90/sparse_fp8mma_ot.cuh", "w").write(src)
