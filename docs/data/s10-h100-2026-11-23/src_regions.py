import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
def num(r, k):
    try: return float(r[ix[k]] or 0)
    except: return 0.0
lo = int(sys.argv[2], 16); hi = int(sys.argv[3], 16)
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
tot = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data)
reg = [r for r in data if lo <= int(r[ix["Address"]], 16) < hi]
s = sum(num(r, "Warp Stall Sampling (All Samples)") for r in reg)
ex = sum(num(r, "Instructions Executed") for r in reg)
print(f"region {sys.argv[2]}-{sys.argv[3]}: {100*s/tot:.1f}% of samples, {ex:.0f} warp instrs executed")
agg = collections.Counter()
for r in reg:
    for h in stalls: agg[h[6:]] += num(r, h)
for k, v in agg.most_common(10): print(f"  {k}: {100*v/s:.1f}%")
