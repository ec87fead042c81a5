"""Call m: the dense FP8 / bf16 ratio against the power state. The shipped records' tuner figures (short
trials) give FP8 / bf16 1.49x on D1 and 1.38x on D3; bench_fp8 (sustained interleaved blocks at the
700 W cap) 1.19-1.30x. Here, in one process, the public calls on D1 and D3: "sustained" = blocks of 10
calls back to back with the L2 flushed before each (bench_fp8's protocol), alternating bf16 / FP8 for
~10 s; "spaced" = one call at a time, each after 50 ms of idle and a 2 ms spin kernel (the GPU well under
its power cap, and not cold: calls b-f). nvidia-smi samples clocks and power every 20 ms (m-clocks.csv)."""
import os, subprocess, time, torch
from mlagen import measure
from mlagen.families import get as get_family

out_dir = os.environ.get("OUT", "/tmp")
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader", "-lms", "20"],
                       stdout=open(os.path.join(out_dir, "m-clocks.csv"), "w"))
family = get_family("mla_prefill")
flush = measure.L2Flush("cuda")
ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
spin = int(2e-3 * 1.98e9)
print(f"{time.strftime('%Y-%m-%d %H:%M')} {torch.cuda.get_device_name()}", flush=True)
for sid in ("D1", "D3"):
    shape = family.shapes()[sid]
    bf = family.make_inputs(shape, "cuda", 0)
    f8 = family.make_inputs(shape, "cuda", 0, dtype="fp8_e4m3")
    fns = {"bf16": lambda: family.call(bf), "fp8": lambda: family.call(f8)}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    res = {}
    t0 = time.time()
    while time.time() - t0 < 10:
        for k, f in fns.items():
            res.setdefault(("sustained", k), []).append(measure.median(measure.time_calls(f, 10, flush)))
    for _ in range(10):
        for k, f in fns.items():
            torch.cuda.synchronize(); time.sleep(0.05)
            flush(); torch.cuda._sleep(spin)
            ev[0].record(); f(); ev[1].record(); torch.cuda.synchronize()
            res.setdefault(("spaced", k), []).append(ev[0].elapsed_time(ev[1]) / 1e3)
    fl = family.flops(shape)
    for mode in ("sustained", "spaced"):
        b = measure.median(res[(mode, "bf16")]); f = measure.median(res[(mode, "fp8")])
        print(f"{sid} {mode:9s}: bf16 {b * 1e3:.3f} ms {fl / b / 1e12:6.1f} TFLOP/s, fp8 {f * 1e3:.3f} ms "
              f"{fl / f / 1e12:6.1f} TFLOP/s, fp8 / bf16 {b / f:.3f}x", flush=True)
time.sleep(0.1); smi.terminate(); smi.wait()
