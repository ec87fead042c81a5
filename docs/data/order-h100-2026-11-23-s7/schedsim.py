"""List-scheduling simulation of the sm90 dynamic tile queue: P CTAs take tiles in queue order;
a tile costs overhead + key steps (causal, block_m = block_n = 128). Compare head-major order
(today: heads outer, sequences, heavy-first inside a sequence) with global heavy-first orders."""
import heapq, random, sys

def tiles_for(lens, heads, bm=128, bn=128, causal=True):
    out = []  # (head, seq, m_block, steps)
    for h in range(heads):
        for b, L in enumerate(lens):
            mt = -(-L // bm)
            for local in range(mt):
                m = mt - 1 - local if causal else local
                rows_end = min((m + 1) * bm, L)
                steps = -(-rows_end // bn) if causal else -(-L // bn)
                out.append((h, b, m, steps))
    return out

def makespan(order, P, ov):
    free = [0.0] * P
    heapq.heapify(free)
    end = 0.0
    for (_, _, _, steps) in order:
        t = heapq.heappop(free)
        t += ov + steps
        end = max(end, t)
        heapq.heappush(free, t)
    return end

shapes = {
    "D1": ([8192], 128), "D2": ([4096] * 4, 16), "D6": ([512] * 32, 128), "D7": ([2048] * 8, 16),
    "D4": (None, 128), "H64": ([8192], 64),
}
rng = random.Random(0)
d4 = [rng.randint(128, 4096) for _ in range(16)]  # not BENCHMARKS' exact lengths; same distribution
P = int(sys.argv[1]) if len(sys.argv) > 1 else 132
for ov in (0.5, 1.0, 2.0):
    print(f"overhead {ov} steps per tile, {P} CTAs")
    for name, (lens, H) in shapes.items():
        lens = lens or d4
        tl = tiles_for(lens, H)
        total = sum(ov + s for *_, s in tl)
        ideal = total / P
        cur = makespan(tl, P, ov)
        lpt = makespan(sorted(tl, key=lambda x: -x[3]), P, ov)
        # heavy-first by m_block, heads inner (keeps a sequence's K/V hot across heads? no: head-inner)
        print(f"  {name}: tiles {len(tl)}, ideal {ideal:.1f}, head-major {cur:.1f} ({cur/ideal:.3f}), global LPT {lpt:.1f} ({lpt/ideal:.3f})")

def chunked(tl, G):
    """(head, seq) pairs in head-major order, G pairs per chunk; heavy-first across a chunk."""
    pairs = []
    for x in tl:
        if (x[0], x[1]) not in pairs:
            pairs.append((x[0], x[1]))
    idx = {p: i for i, p in enumerate(pairs)}
    return sorted(tl, key=lambda x: (idx[(x[0], x[1])] // G, -x[3], idx[(x[0], x[1])]))

def sim_active(order, P, ov):
    """makespan and the most distinct (head, seq) pairs running at once"""
    free = [(0.0, i) for i in range(P)]
    heapq.heapify(free)
    running = {}
    end, most = 0.0, 0
    for (h, b, m, steps) in order:
        t, i = heapq.heappop(free)
        running[i] = (h, b, t + ov + steps)
        live = {(hh, bb) for (hh, bb, e) in running.values() if e > t}
        most = max(most, len(live))
        heapq.heappush(free, (t + ov + steps, i))
        end = max(end, t + ov + steps)
    return end, most

print("chunked heavy-first (G pairs per chunk), overhead 1 step")
for name, (lens, H) in shapes.items():
    lens = lens or d4
    tl = tiles_for(lens, H)
    ideal = sum(1 + s for *_, s in tl) / P
    row = []
    for G in (1, 2, 4, 8, 16, 32):
        e, most = sim_active(chunked(tl, G), P, 1.0)
        row.append(f"G{G} {e/ideal:.3f}/{most}")
    e, most = sim_active(tl, P, 1.0)
    print(f"  {name}: today {e/ideal:.3f}/{most}  " + "  ".join(row))

def head_group_order(lens, H, G, bm=128, bn=128):
    out = []
    for g0 in range(0, H, G):
        for b, L in enumerate(lens):
            mt = -(-L // bm)
            for local in range(mt):
                m = mt - 1 - local
                steps = -(-min((m + 1) * bm, L) // bn)
                for h in range(g0, min(g0 + G, H)):
                    out.append((h, b, m, steps))
    return out

print("head groups (G heads innermost), overhead 1 step: ratio to ideal / most pairs live")
for name, (lens, H) in shapes.items():
    lens = lens or d4
    tl = tiles_for(lens, H)
    ideal = sum(1 + s for *_, s in tl) / P
    row = []
    for G in (1, 2, 4, 8, 16, 32, 64, 128):
        if G > H: break
        e, most = sim_active(head_group_order(lens, H, G), P, 1.0)
        row.append(f"G{G} {e/ideal:.3f}/{most}")
    print(f"  {name}: " + "  ".join(row))

def persistent(order, P, ov):
    load = [0.0] * P
    for i, (_, _, _, s) in enumerate(order):
        load[i % P] += ov + s
    return max(load)

def l2_group(lens, H, esize=2, budget=16 << 20):
    avg = sum(lens) / len(lens)
    per = avg * 256 * esize
    g = 1
    while g * 2 <= H and (g * 2) * per <= budget:
        g *= 2
    return g

print("rule G = pow2 with G * avg_len * 512 B <= 16 MB; dynamic and persistent (stride) schedulers")
for name, (lens, H) in shapes.items():
    lens = lens or d4
    tl = tiles_for(lens, H)
    ideal = sum(1 + s for *_, s in tl) / P
    G = l2_group(lens, H)
    new = head_group_order(lens, H, G)
    e, most = sim_active(new, P, 1.0)
    e0, most0 = sim_active(tl, P, 1.0)
    print(f"  {name}: G {G}: dynamic today {e0/ideal:.3f}/{most0} -> {e/ideal:.3f}/{most};"
          f" persistent today {persistent(tl, P, 1.0)/ideal:.3f} -> {persistent(new, P, 1.0)/ideal:.3f}")

def persistent_snake(order, P, ov):
    """persistent scheduler dealing round r left to right when r is even, right to left when odd"""
    load = [0.0] * P
    for i, (_, _, _, s) in enumerate(order):
        r, k = divmod(i, P)
        load[k if r % 2 == 0 else P - 1 - k] += ov + s
    return max(load)

print("persistent, overhead 1 step: ratio to ideal (round-robin | snake) by head group")
for name, (lens, H) in shapes.items():
    lens = lens or d4
    tl = tiles_for(lens, H)
    ideal = sum(1 + s for *_, s in tl) / P
    row = []
    for G in (1, 2, 4, 8, 16):
        if G > H:
            break
        o = head_group_order(lens, H, G)
        row.append(f"G{G} {persistent(o, P, 1.0)/ideal:.3f}|{persistent_snake(o, P, 1.0)/ideal:.3f}")
    print(f"  {name}: " + "  ".join(row))
