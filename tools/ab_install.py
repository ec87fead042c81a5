"""Install a kernel spec as it was at a git revision beside the working tree's, for A/B timing in
one process.

Timing two builds of a kernel in separate processes or calls moves by 2-5% between calls on the
lent H100 (docs/notes.md, fourteenth session); the same comparison inside one process, calls
interleaved, decides changes of that size. This script makes the revision's kernel a second spec
of the working tree: ``<spec>_base`` (its own symbol names, priority 1 so that dispatch never picks
it on its own), with ``<template>_base`` and a ``_base`` copy of every device header that differs
at the revision, and of every header that includes one of those, so that nothing of the working
tree leaks into the base kernel. Call both by name (``kernel="<spec>"`` / ``kernel="<spec>_base"``).

    python tools/ab_install.py mla_sparse_prefill_sm90_h16 927c246     # prints what it wrote
    python tools/ab_install.py mla_sparse_prefill_sm90_h16 --remove   # deletes it again

Meant for the device machine's copy of the tree (a device script installs, times, and the copy is
thrown away); ``--remove`` cleans a checkout. Needs git and the revision in the repository it runs
in: the device machine's copy carries a ``.git`` that may predate this session's commits, so base
on a revision ``git log`` shows there (a session's starting commit is always one).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^(\s*#\s*include\s+")(mlagen/[^"]+)(")', re.M)
SUFFIX = "_base"


def git_show(root: Path, rev: str, path: str) -> str | None:
    """The file at the revision, or None if it did not exist there."""
    out = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{path}"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


JINJA = re.compile(r"^(.*?)(\{\{.*?\}\})(.*)$")


def alternatives(path: str) -> list[str]:
    """The headers an include names: itself, or for a Jinja expression between its braces
    (``mlagen/sm90/sparse_kv_{{ 'fp8' if kv.quantized else 'bf16' }}.cuh``) one per string
    literal of the expression."""
    m = JINJA.match(path)
    if not m:
        return [path]
    head, expr, tail = m.groups()
    return [head + a + b + tail for a, b in re.findall(r"'([^']*)'|\"([^\"]*)\"", expr)]


def based(name: str) -> str:
    """``a/b.cuh`` -> ``a/b_base.cuh``; ``x.cu.j2`` -> ``x_base.cu.j2``; an include with a Jinja
    expression keeps it and takes the suffix after it (``a/kv_{{ e }}.cuh`` -> ``a/kv_{{ e }}_base.cuh``)."""
    m = JINJA.match(name)
    head, tail = (m.group(1) + m.group(2), m.group(3)) if m else ("", name)
    stem, dot, ext = tail.partition(".")
    return f"{head}{stem}{SUFFIX}{dot}{ext}"


def plan(spec: str, rev: str, root: Path = ROOT) -> dict[str, str]:
    """Relative path in the tree -> text, for every file the base kernel needs."""
    spec_text = git_show(root, rev, f"specs/{spec}.yaml")
    if spec_text is None:
        raise SystemExit(f"ab_install: specs/{spec}.yaml does not exist at {rev}")
    m = re.search(r"^template:\s*(\S+)\s*$", spec_text, re.M)
    if not m:
        raise SystemExit(f"ab_install: specs/{spec}.yaml at {rev} names no template")
    template = m.group(1)
    template_text = git_show(root, rev, f"templates/{template}")
    if template_text is None:
        raise SystemExit(f"ab_install: templates/{template} does not exist at {rev}")

    # Every device header the template reaches at the revision, and who includes whom.
    headers: dict[str, str] = {}
    includes: dict[str, set[str]] = {}
    todo = [a for _, h, _ in INCLUDE.findall(template_text) for a in alternatives(h)]
    while todo:
        h = todo.pop()
        if h in headers:
            continue
        text = git_show(root, rev, f"templates/include/{h}")
        if text is None:
            raise SystemExit(f"ab_install: templates/include/{h} does not exist at {rev}")
        headers[h] = text
        includes[h] = {a for _, g, _ in INCLUDE.findall(text) for a in alternatives(g)}
        todo += includes[h]
    # A header needs a base copy if it differs from the working tree's, or includes one that does.
    tree = root / "templates/include"
    copied = {h for h, text in headers.items() if not (tree / h).exists() or (tree / h).read_text() != text}
    # The alternatives of one Jinja include are copied together (the include names them as one).
    groups = [set(alternatives(g)) for text in (template_text, *headers.values())
              for _, g, _ in INCLUDE.findall(text) if JINJA.match(g)]
    changed = True
    while changed:
        changed = False
        for h, inc in includes.items():
            if h not in copied and inc & copied:
                copied.add(h)
                changed = True
        for g in groups:
            if g & copied and not g <= copied:
                copied |= g
                changed = True

    def rewrite(text: str) -> str:
        return INCLUDE.sub(lambda m: m.group(1) + (based(m.group(2)) if set(alternatives(m.group(2))) & copied
                                                   else m.group(2)) + m.group(3), text)

    files = {f"templates/include/{based(h)}": rewrite(headers[h]) for h in sorted(copied)}
    files[f"templates/{based(template)}"] = rewrite(template_text)
    spec_text = re.sub(r"^name:\s*\S+\s*$", f"name: {spec}{SUFFIX}", spec_text, count=1, flags=re.M)
    spec_text = re.sub(r"^template:\s*\S+\s*$", f"template: {based(template)}", spec_text, count=1, flags=re.M)
    spec_text = re.sub(r"^priority:\s*\S+\s*$", "priority: 1", spec_text, count=1, flags=re.M)
    files[f"specs/{spec}{SUFFIX}.yaml"] = (f"# {spec} as of {rev}, installed by tools/ab_install.py for A/B timing; "
                                           f"not part of mlagen.\n" + spec_text)
    return files


def installed(spec: str, root: Path = ROOT) -> list[Path]:
    """The files an earlier install of ``spec`` left (the base spec, its template, the ``_base``
    headers that template reaches)."""
    out = []
    spec_file = root / "specs" / f"{spec}{SUFFIX}.yaml"
    if spec_file.exists():
        out.append(spec_file)
        m = re.search(r"^template:\s*(\S+)\s*$", spec_file.read_text(), re.M)
        if m and (root / "templates" / m.group(1)).exists():
            template = root / "templates" / m.group(1)
            out.append(template)
            todo = [a for _, h, _ in INCLUDE.findall(template.read_text()) if SUFFIX + "." in h for a in alternatives(h)]
            while todo:
                h = todo.pop()
                p = root / "templates/include" / h
                if p.exists() and p not in out:
                    out.append(p)
                    todo += [a for _, g, _ in INCLUDE.findall(p.read_text()) if SUFFIX + "." in g for a in alternatives(g)]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("spec", help="spec name, e.g. mla_sparse_prefill_sm90_h16")
    ap.add_argument("rev", nargs="?", help="git revision of the base kernel (e.g. a commit or HEAD~1)")
    ap.add_argument("--remove", action="store_true", help="delete a previous install of the spec")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to install into (default: this one)")
    args = ap.parse_args(argv)
    root = args.root.resolve()
    if args.remove:
        for p in installed(args.spec, root):
            p.unlink()
            print(f"removed {p.relative_to(root)}")
        return 0
    if not args.rev:
        ap.error("a revision is needed (or --remove)")
    files = plan(args.spec, args.rev, root)
    taken = [rel for rel in files if (root / rel).exists()]
    if taken:  # checked before writing anything: no half install
        raise SystemExit(f"ab_install: {', '.join(taken)} exist(s); run with --remove first")
    for rel, text in files.items():
        (root / rel).write_text(text)
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
