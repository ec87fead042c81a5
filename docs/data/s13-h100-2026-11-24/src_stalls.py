import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]; data = rows[2:]
ix = {h: i for i, h in enumerate(hdr)}
def num(r, k):
    try: return float(r[ix[k]] or 0)
    except: return 0.0
tot = sum(num(r, "Warp Stall Sampling (All Samples)") for r in data)
print("total samples", tot, "instructions", len(data))
# regions: split by address ranges given on argv (hex) else print top instructions
stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
top = sorted(data, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))[:int(sys.argv[2]) if len(sys.argv) > 2 else 40]
for r in top:
    s = num(r, "Warp Stall Sampling (All Samples)")
    reasons = sorted(((num(r, h), h[6:]) for h in stalls), reverse=True)[:3]
    print(f"{r[ix['Address']]:>8} {100*s/tot:5.2f}% exec={r[ix['Instructions Executed']]:>10} {r[ix['Source']][:60]:60s} " + ", ".join(f"{n}:{int(v)}" for v, n in reasons if v))
