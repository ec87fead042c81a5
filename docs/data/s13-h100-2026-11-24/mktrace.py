import re
p='/work/main/s13trace/templates/include/mlagen/sm90/sparse_fp8mma.cuh'
L=open(p).read().split('\n')
def wrap(lineno, slot):
    i=lineno-1
    line=L[i]
    ind=line[:len(line)-len(line.lstrip())]
    st=line.strip()
    if '//' in st: st=st[:st.index('//')].strip()
    assert st.endswith(';'), (lineno, st)
    L[i]=f"{ind}{{ const u64 _t0 = clock64(); {st} tr[{slot}] += clock64() - _t0; }}"
for ln,sl in [(713,0),(714,1),(727,2),(739,3),(768,4),(769,5),(775,0),(776,1)]: wrap(ln,sl)
for ln,sl in [(796,0),(797,1),(803,2),(815,3),(832,4),(833,5),(844,0),(845,1)]: wrap(ln,sl)
for ln,sl in [(280,5),(290,0),(291,0),(332,2),(342,3),(351,4),(352,5)]: wrap(ln,sl)
s='\n'.join(L)
s=s.replace('''  static __device__ void run(const Params& p, u32 smem, const Barriers& bar, int t) {
    const int tid = threadIdx.x % 128;''','''  static __device__ void run(const Params& p, u32 smem, const Barriers& bar, int t) {
    u64 tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const u64 _start = clock64();
    const int tid = threadIdx.x % 128;''')
i=s.index('// ------------------------------------------------------------------------------------------------\n// Consumers.')
j=s.rindex('  }\n};', 0, i)
s=s[:j]+'''    tr[6] = clock64() - _start;
    if (tid == 0)
      for (int k = 0; k < 8; ++k) p.max_logits[(i64)t * p.ml_row_stride + 16 + k] = (float)tr[k];
'''+s[j:]
for c in ('0','1'):
    a=f'''__device__ void consumer{c}(const Params& p, u32 smem, const Barriers& bar, int t, int head0) {{
  Regs r;'''
    assert a in s
    s=s.replace(a,a+'''
  u64 tr[8] = {0, 0, 0, 0, 0, 0, 0, 0};''')
    a=f'''  epilogue<Cfg>(p, r, smem, {c}, t, head0, pairs);'''
    assert a in s
    s=s.replace(a,f'''  tr[6] = clock64() - _start;
  epilogue<Cfg>(p, r, smem, {c}, t, head0, pairs);
  if (threadIdx.x % 128 == 0)
    for (int k = 0; k < 8; ++k) p.max_logits[(i64)t * p.ml_row_stride + 8 * {c} + k] = (float)tr[k];''')
a='''  const int pairs = sparse::num_pairs(sparse::valid_length(p, t));
  for (int pair = 0; pair < pairs; ++pair) {'''
assert s.count(a)==2
s=s.replace(a,'''  const int pairs = sparse::num_pairs(sparse::valid_length(p, t));
  const u64 _start = clock64();
  for (int pair = 0; pair < pairs; ++pair) {''')
a='''      p.max_logits[(i64)t * p.ml_row_stride + heads[h]] = empty'''
assert a in s
s=s.replace(a,'''      if (false) p.max_logits[(i64)t * p.ml_row_stride + heads[h]] = empty''')
open(p,'w').write(s)
