import csv, sys, io
def load(path):
    lines = open(path).read().splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith('"ID"'))
    rows = list(csv.reader(io.StringIO("\n".join(lines[i:]))))
    return rows[0], rows[1], rows[2:]
want = sys.argv[2].split(",")
hdr, units, data = load(sys.argv[1])
def col(name):
    for j, h in enumerate(hdr):
        if h == name or h.endswith("." + name) or h.endswith(name):
            return j
for r in data:
    name = r[4]
    short = "fa3-prep" if "prepare" in name else "fa3" if "cutlass" in name else "fill" if "Fill" in name else name.replace("mla_prefill_sm90_causal_","")[:50]
    vals = []
    for w in want:
        j = col(w)
        vals.append(f"{r[j]}{units[j]}" if j is not None else "?")
    print(f"{short:52s} " + " | ".join(vals))
