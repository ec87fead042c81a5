"""Re-stamp shipped tuning records after a source change that leaves their kernels as they were.

A shipped record (mlagen/tuned/*.json) is used only while its ``source_hash`` matches the spec,
template and included headers (``mlagen.db.source_hash``), so any edit of a shared header retires
every record that includes it, whether or not the kernel changed. This tool compiles each stale
record's winner twice, from a base revision (where the record is current) and from the working
tree, and compares the two cubins' SASS (``cuobjdump -sass``). Identical SASS: the record is
re-stamped with the current hash. Different SASS: it is listed, and re-stamped only when named with
``--accept`` (after an on-device A/B of that winner; say which in the commit message), else it stays
retired until re-tuned.

    python3 tools/restamp_records.py --base main            # report, write nothing
    python3 tools/restamp_records.py --base main --write    # re-stamp the identical ones
    python3 tools/restamp_records.py --base main --write --accept mla_prefill_sm90
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Run in a tree (PYTHONPATH) on stdin's records: prints {symbol: sass} as JSON.
_SASS_OF = r"""
import json, subprocess, sys, tempfile
from pathlib import Path
from mlagen import arch, families, spec as spec_mod, variant as variant_mod
from mlagen.build import build_many
cuobjdump = sys.argv[1]
out = {}
for r in json.load(sys.stdin):
    spec = spec_mod.load(r["spec"])
    fam = families.get(spec.family)
    # A tunable the tree's spec lacks was added since (the record names it at its default): that
    # tree builds the one kernel it has, and the SASS comparison says whether it is the same.
    values = {k: v for k, v in r["variant"].items() if k in spec.axes}
    v = variant_mod.make(spec, {**values, **fam.problem_specialization(r["problem"])})
    target = spec.targets[0]
    (built,) = build_many([v], [target], jobs=1)
    if not built.ok:
        out[r["symbol"]] = ["build failed: " + "; ".join(built.reasons), v.symbol]
        continue
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(built.binary.data)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    # SASS without the lines naming the kernel (its symbol may be renamed when a spec gains an axis)
    body = [l for l in sass.splitlines() if not l.lstrip().startswith(("Fatbin", "Function", ".section", "code for"))]
    out[r["symbol"]] = ["\n".join(body).replace(v.symbol, "<symbol>"), v.symbol]
json.dump(out, sys.stdout)
"""


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    import site

    for base in [*site.getsitepackages(), *sys.path]:
        candidate = Path(base) / "nvidia" / "cu13" / "bin" / "cuobjdump"
        if candidate.is_file():
            return str(candidate)
    raise SystemExit("restamp: cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def _sass(tree: Path, records: list[dict], cuobjdump: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _SASS_OF, cuobjdump], input=json.dumps(records), env=env,
                          capture_output=True, text=True, cwd=tree)
    if done.returncode:
        raise SystemExit(f"restamp: compiling in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="a git revision where the shipped records are current")
    ap.add_argument("--write", action="store_true", help="re-stamp (else report only)")
    ap.add_argument("--accept", action="append", default=[], metavar="SPEC[:PROBLEM]",
                    help="re-stamp these records even though their SASS changed (after an A/B on the device)")
    args = ap.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from mlagen import db
    from mlagen import spec as spec_mod
    from mlagen.fsutil import atomic_write

    cuobjdump = _cuobjdump()
    files = sorted((ROOT / "mlagen" / "tuned").glob("*.json"))
    docs = {f: json.loads(f.read_text()) for f in files}
    current = {}
    stale = []
    for f, doc in docs.items():
        for r in doc["best"]:
            if r["spec"] not in current:
                current[r["spec"]] = db.source_hash(spec_mod.load(r["spec"]))
            if r["source_hash"] != current[r["spec"]]:
                stale.append(r)
    if not stale:
        print("restamp: every shipped record is current")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base], check=True)
        try:
            before = _sass(base, stale, cuobjdump)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True)
    after = _sass(ROOT, stale, cuobjdump)
    changed = 0
    for r in stale:
        (sass_before, _), (sass_after, symbol) = before[r["symbol"]], after[r["symbol"]]
        same = sass_before == sass_after and not sass_after.startswith("build failed")
        accepted = r["spec"] in args.accept or f"{r['spec']}:{r['problem']}" in args.accept
        verdict = "identical SASS" if same else ("SASS changed, accepted" if accepted else "SASS changed: stays retired")
        print(f"{r['spec']}:{r['problem']}: {verdict}")
        if same or accepted:
            r["source_hash"] = current[r["spec"]]
            r["symbol"] = symbol   # the current name of the same variant
            changed += 1
    if args.write and changed:
        for f, doc in docs.items():
            atomic_write(f, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
        print(f"restamp: {changed} of {len(stale)} stale records re-stamped")
    elif changed:
        print(f"restamp: {changed} of {len(stale)} stale records would be re-stamped (--write)")
    return 0 if changed == len(stale) else 1


if __name__ == "__main__":
    raise SystemExit(main())
