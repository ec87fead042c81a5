"""Packaging: the wheel carries templates, headers and specs, an installed mlagen renders from
its own copy (outside the source tree), and the README's commands are the ones CI runs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def source_files() -> list[str]:
    """What a fresh clone holds: tracked files plus new files git does not ignore."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("needs git to know which files a fresh clone has")
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def package_dirs() -> dict[str, str]:
    """Every package pyproject names, with the directory setuptools reads it from."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = tool.get("package-dir", {})
    return {p: mapped.get(p, p.replace(".", "/")) for p in tool["packages"]}


def test_fresh_clone_has_every_package_directory():
    have = {str(Path(f).parent) for f in source_files()}
    have |= {str(p) for d in list(have) for p in Path(d).parents}
    missing = [f"{pkg} ({d}/)" for pkg, d in package_dirs().items() if d not in have]
    assert missing == [], (
        f"pyproject.toml names packages whose directories hold no tracked file, so a fresh clone lacks them and "
        f"'pip install .' fails with \"package directory ... does not exist\": {', '.join(missing)}")


# --- the wheel ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed (needed to build the wheel without build isolation)")
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"  # a copy, so building writes nothing (build/, *.egg-info) into the repository
    for f in source_files():
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    for d in package_dirs().values():  # reported by test_fresh_clone_has_every_package_directory
        (src / d).mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(base / "dist"), str(src)], capture_output=True, text=True, cwd=base)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [whl] = (base / "dist").glob("mlagen-*.whl")
    return whl


@pytest.mark.slow
def test_wheel_contents(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for t in (ROOT / "templates").glob("*.j2"):
        assert f"mlagen/templates/{t.name}" in names
    for h in (ROOT / "templates" / "include").rglob("*.cuh"):
        assert f"mlagen/templates/include/{h.relative_to(ROOT / 'templates' / 'include')}" in names
    assert {n for n in names if n.startswith("mlagen/templates/include/mlagen/sm90/")} >= {
        "mlagen/templates/include/mlagen/sm90/wgmma_ops.cuh", "mlagen/templates/include/mlagen/sm90/tma.cuh"}
    for s in (ROOT / "specs").glob("*.yaml"):
        assert f"mlagen/specs/{s.name}" in names
    assert "mlagen/cli.py" in names and "mlagen/families/mla_prefill/__init__.py" in names
    assert "mlagen/families/mla_prefill/op.py" in names and "mlagen/families/base.py" in names
    for e in (ROOT / "mlagen" / "expectations").glob("*.json"):
        assert f"mlagen/expectations/{e.name}" in names
    assert not any(n.startswith("tests/") for n in names)
    [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert re.search(r"^\[console_scripts\]\s*\nmlagen = mlagen\.cli:main\s*$", text, re.M), text


CHECK_INSTALLED = r"""
import json, sys
import mlagen, mlagen.paths
from mlagen import render, spec, variant
s = spec.load("mla_prefill_sm90")
src = render.render(variant.default(s))
print(json.dumps({
    "module": mlagen.__file__,
    "templates": str(mlagen.paths.templates_dir()),
    "include": str(mlagen.paths.include_dir()),
    "specs": str(mlagen.paths.specs_dir()),
    "spec_path": s.path,
    "include_dirs": list(src.include_dirs),
    "text": src.text,
}))
"""


@pytest.mark.slow
def test_installed_wheel_renders_outside_the_repository(wheel, tmp_path):
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
                           str(wheel)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(target), "MLAGEN_OUT_DIR": str(tmp_path / "out")}
    work = tmp_path / "elsewhere"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-c", CHECK_INSTALLED], capture_output=True, text=True, cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    inside = str(target) + os.sep
    for key in ("module", "templates", "include", "specs", "spec_path"):
        assert got[key].startswith(inside), (key, got[key])
    assert got["include_dirs"] == [got["include"]]
    assert (Path(got["include"]) / "mlagen" / "sm90" / "mla_prefill.cuh").is_file()
    # The installed copy renders exactly what the source tree renders.
    from mlagen import render, spec, variant

    assert got["text"] == render.render(variant.default(spec.load("mla_prefill_sm90"))).text

    script = target / "bin" / "mlagen"
    if script.exists():
        proc = subprocess.run([sys.executable, str(script), "--version"], capture_output=True, text=True, cwd=work,
                              env=env)
        assert proc.returncode == 0 and "0.1.0" in proc.stdout, proc.stderr


# --- the README and CI ----------------------------------------------------------------------


def readme_blocks() -> list[str]:
    readme = ROOT / "README.md"
    if not readme.exists():
        pytest.fail("README.md is missing")
    return re.findall(r"```bash\n(.*?)```", readme.read_text(), re.S)


def test_readme_has_the_two_commands():
    blocks = [b.strip() for b in readme_blocks()]
    assert len(blocks) >= 2, blocks
    install_and_build, install_and_test = blocks[0], blocks[1]
    assert install_and_build == "python3 -m pip install . && mlagen build"
    assert "pip install" in install_and_test and "pytest" in install_and_test


def test_readme_commands_exist():
    from mlagen import cli

    text = (ROOT / "README.md").read_text()
    mentioned = set(re.findall(r"`mlagen ([a-z]+)", text))
    assert {"build", "specs", "variants", "db", "info", "bench"} <= mentioned
    assert mentioned <= set(cli.cli.commands), mentioned - set(cli.cli.commands)
    for var in re.findall(r"`(MLAGEN_[A-Z_]+)`", text):
        from mlagen import knobs

        assert var in {k.name for k in knobs.ALL}, var


def test_ci_runs_the_readme_test_command():
    run = ROOT / ".ci" / "run"
    assert run.exists(), ".ci/run is missing"
    assert run.stat().st_mode & stat.S_IXUSR, ".ci/run is not executable"
    text = run.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") or text.startswith("#!/bin/bash\n")
    assert "set -euo pipefail" in text or "set -e" in text
    test_command = readme_blocks()[1].strip()
    lines = [line.strip() for line in text.splitlines()]
    assert test_command in lines, f"{test_command!r} is not a line of .ci/run"


# --- the documents a user reads -------------------------------------------------------------


def user_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


# Inline code and link targets that name a file or folder: a relative path with a known extension, or one
# that starts at a top-level entry of the repository. Placeholders (<out>, *, {a,b}) are not paths.
PATH_TOKEN = re.compile(r"[A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]+)*/?")
PATH_EXT = (".md", ".py", ".yaml", ".yml", ".json", ".sh", ".cuh", ".cu", ".j2", ".toml", ".txt", ".log", ".patch")


def named_paths(text: str) -> set[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # commands are checked by the tests above
    spans = re.findall(r"`([^`\n]+)`", text) + re.findall(r"\]\(([^)\s#]+)", text)
    top = {p.name for p in ROOT.iterdir()} - {"out", ".git"}
    found = set()
    for span in spans:
        tokens = span.split()
        for s in tokens:
            if not PATH_TOKEN.fullmatch(s) or re.fullmatch(r"[\d.]+", s):
                continue
            rooted = "/" in s and (s.split("/")[0] in top or s.startswith("../"))
            # A lone span may be a file named by its name; inside a command only rooted paths are the
            # repository's (`--workload shapes.yaml` names the user's file).
            if rooted or (len(tokens) == 1 and s.endswith(PATH_EXT)):
                found.add(s)
    return found


def test_every_path_the_docs_name_exists():
    tracked = source_files()
    missing = []
    for doc in user_docs():
        for p in sorted(named_paths(doc.read_text())):
            rel = p.rstrip("/")
            here = [(ROOT / rel), (doc.parent / rel)]
            if any(h.resolve().is_relative_to(ROOT) and h.exists() for h in here):
                continue
            if doc.name != "README.md" and "/" not in rel and not rel.startswith(".."):
                if any(Path(f).name == rel for f in tracked):  # a module or header named by its file name
                    continue
            if doc.name != "README.md" and not rel.startswith(".."):
                if any(f.endswith("/" + rel) or f.startswith(rel + "/") for f in tracked):
                    continue  # a header named from its include directory
            missing.append(f"{doc.relative_to(ROOT)}: {p}")
    assert missing == [], "the docs name paths a clone of the repository does not have:\n" + "\n".join(missing)


# A result is dated by its date and commit, not by which working session or which device call made it.
ORDINAL = re.compile(
    r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
    r"fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|twenty-\w+)\s+sessions?\b"
    r"|\bsessions?\s+\d+"
    r"|\bcalls?\s+[a-n](?:\s*(?:[-–,]|and)\s*[a-n])*(?=[),;:.]|\s*\))"
    r"|\(calls?\s+[a-n](?:\s*[-–,]\s*[a-n])*(?=[,;:)])"
    r"|\bs\d{1,2}-h[12]00\b",
    re.I)


def test_docs_date_results_by_date_and_commit():
    hits = []
    for doc in user_docs():
        text = doc.read_text()  # whole, so an ordinal broken over two lines is found too
        hits += [f"{doc.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
                 for m in ORDINAL.finditer(text)]
    assert hits == [], (f"{len(hits)} mentions date results by a session ordinal or a call letter instead of a "
                        "date and a commit:\n" + "\n".join(hits[:40]))


def test_the_ordinal_check_catches_what_it_is_for():
    for bad in ("the twenty-third session's tables", "(call f)", "calls a-c, one machine", "session 21's tuner",
                "call e,", "data/s22-h200-2026-11-28/", "(call d, `bench_fp8`", "the ninth\nsession"):
        assert ORDINAL.search(bad), bad
    for fine in ("the call a user writes", "a call that could need more", "the default call stages the rows",
                 "(call a kernel by name)"):
        assert not ORDINAL.search(fine), fine
