"""Instrumented copy of sparse_fp8mma.cuh into s13trace/ (pattern-based): clock64 accumulators per wait/step."""
import re, shutil, os, sys
root = os.getcwd()
dst = f'{root}/s14trace'
shutil.rmtree(dst, ignore_errors=True)
os.makedirs(dst)
for d in ('mlagen', 'specs', 'templates'):
    shutil.copytree(f'{root}/{d}', f'{dst}/{d}')
shutil.copy(f'{root}/pyproject.toml', dst)
p = f'{dst}/templates/include/mlagen/sm90/sparse_fp8mma.cuh'
s = open(p).read()

def span(start_pat, end_pat):
    a = s.index(start_pat); b = s.index(end_pat, a)
    return a, b

def wrap_in(a, b, rules):
    global s
    seg = s[a:b]
    lines = seg.split('\n')
    for i, line in enumerate(lines):
        st = line.strip()
        code = st.split('//')[0].strip()
        for pat, slot in rules:
            if code.startswith(pat) and code.endswith(';'):
                ind = line[:len(line) - len(line.lstrip())]
                lines[i] = f"{ind}{{ const u64 _t0 = clock64(); {code} tr[{slot}] += clock64() - _t0; }}"
                break
    s = s[:a] + '\n'.join(lines) + s[b:]

# producer run
a, b = span('  static __device__ void run(const Params& p, u32 smem, const Barriers& bar, int t) {', '// Consumers.')
wrap_in(a, b, [('mbar_wait(bar.kready(', 0), ('mbar_wait(bar.vfree(', 2), ('transpose(smem', 3), ('mbar_wait(bar.kfree(', 4),
               ('gather(p, smem', 5), ('named_sync(kScalesSeen', 1), ('fence_async_shared()', 7)])
a, b = span('__device__ void consumer0(', '__device__ void consumer1(')
wrap_in(a, b, [('mbar_wait(bar.kready(', 0), ('scores<Cfg>(', 1), ('mbar_wait(bar.vready(0)', 2), ('named_sync(kMax1Ready', 3),
               ('named_sync(kP1Ready', 4), ('mbar_wait(bar.vready(1)', 5)])
a, b = span('__device__ void consumer1(', '__device__ __forceinline__ Barriers init_barriers')
wrap_in(a, b, [('mbar_wait(bar.kready(', 0), ('scores<Cfg>(', 1), ('named_sync(kMax0Ready', 2), ('mbar_wait(bar.vready(1)', 3),
               ('named_sync(kP0Ready', 4), ('mbar_wait(bar.vready(0)', 5)])
# multi-line scores( calls in consumers (lambda bodies span lines): wrap manually
s = s.replace('''      scores<Cfg>(r, smem, 0, [&] { mbar_arrive(bar.vfree(1)); });''', '''      { const u64 _t0 = clock64(); scores<Cfg>(r, smem, 0, [&] { mbar_arrive(bar.vfree(1)); }); tr[1] += clock64() - _t0; }''')
s = s.replace('''      scores<Cfg>(r, smem, 1, [&] { mbar_arrive(bar.vfree(0)); });''', '''      { const u64 _t0 = clock64(); scores<Cfg>(r, smem, 1, [&] { mbar_arrive(bar.vfree(0)); }); tr[1] += clock64() - _t0; }''')
s = s.replace('''  static __device__ void run(const Params& p, u32 smem, const Barriers& bar, int t) {
    const int tid = threadIdx.x % 128;''', '''  static __device__ void run(const Params& p, u32 smem, const Barriers& bar, int t) {
    u64 tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const u64 _start = clock64();
    const int tid = threadIdx.x % 128;''')
i = s.index('// ------------------------------------------------------------------------------------------------\n// Consumers.')
j = s.rindex('  }\n};', 0, i)
s = s[:j] + '''    tr[6] = clock64() - _start;
    if (tid == 0)
      for (int k = 0; k < 8; ++k) p.max_logits[(i64)t * p.ml_row_stride + 16 + k] = (float)tr[k];
''' + s[j:]
for c in ('0', '1'):
    a_ = f'''__device__ void consumer{c}(const Params& p, u32 smem, const Barriers& bar, int t, int head0) {{
  Regs r;'''
    s = s.replace(a_, a_ + '''
  u64 tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};''')
    s = s.replace(f'''  epilogue<Cfg>(p, r, smem, {c}, t, head0, pairs);''', f'''  tr[6] = clock64() - _start;
  epilogue<Cfg>(p, r, smem, {c}, t, head0, pairs);
  if (threadIdx.x % 128 == 0)
    for (int k = 0; k < 8; ++k) p.max_logits[(i64)t * p.ml_row_stride + 8 * {c} + k] = (float)tr[k];''')
s = s.replace('''  const int pairs = sparse::num_pairs(sparse::valid_length(p, t));
  for (int pair = 0; pair < pairs; ++pair) {''', '''  const int pairs = sparse::num_pairs(sparse::valid_length(p, t));
  const u64 _start = clock64();
  for (int pair = 0; pair < pairs; ++pair) {''')
s = s.replace('''      p.max_logits[(i64)t * p.ml_row_stride + heads[h]] = empty''', '''      if (false) p.max_logits[(i64)t * p.ml_row_stride + heads[h]] = empty''')

s = s.replace("    u64 tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};\n    const u64 _start = clock64();\n    const int tid = threadIdx.x % 128;",
              "    u64 tr[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};\n    const u64 _start = clock64();\n    const int tid = threadIdx.x % 128;")
s = s.replace("for (int k = 0; k < 8; ++k) p.max_logits[(i64)t * p.ml_row_stride + 16 + k]", "for (int k = 0; k < 12; ++k) p.max_logits[(i64)t * p.ml_row_stride + 16 + k]")
# scale stage: after the kready(1) wait up to the buffer loop
a = s.index("tr[0] += clock64() - _t0; }", s.index("static __device__ void run(const Params& p, u32 smem, const Barriers& bar, int t)"))
a = s.index("tr[0] += clock64() - _t0; }", a + 10) + len("tr[0] += clock64() - _t0; }")
s = s[:a] + "\n      const u64 _s0 = clock64();" + s[a:]
b = s.index("      for (int buf = 0; buf < 2; ++buf) {\n        { const u64 _t0 = clock64(); mbar_wait(bar.vfree(")
b = s.rindex("#pragma unroll 1", 0, b)
s = s[:b] + "      tr[8] += clock64() - _s0;\n" + s[b:]
# fv stores
s = s.replace("        if constexpr (Cfg::kScaled) {\n          if (mine == buf) {", "        const u64 _f0 = clock64();\n        if constexpr (Cfg::kScaled) {\n          if (mine == buf) {")
i = s.index("const u64 _f0 = clock64();")
j = s.index("transpose(smem", i)
j = s.rindex("\n", 0, j)
s = s[:j] + "\n        tr[9] += clock64() - _f0;" + s[j:]
# load_rows of the next pair
s = s.replace("      for (int buf = 0; buf < 2; ++buf) load_rows(p, idx_row, len, 2 * (pair + 1) + buf, g, next_rows[buf]);",
              "      for (int buf = 0; buf < 2; ++buf) { const u64 _l0 = clock64(); load_rows(p, idx_row, len, 2 * (pair + 1) + buf, g, next_rows[buf]); tr[10] += clock64() - _l0; }")

open(p, 'w').write(s)
print("wraps:", s.count('clock64() - _t0'))
