"""tools/ab_install.py: a spec as of a git revision installed beside the working tree's as
``<spec>_base`` (base copies of the headers that changed and of the headers that include them),
compiled from the revision's sources, and removed again without leftovers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _tool import load_tool

ROOT = Path(__file__).resolve().parent.parent
SPEC = "mla_sparse_prefill_sm90_h16"
CHANGED = "templates/include/mlagen/sm90/sparse_gather.cuh"   # included by sparse_h16.cuh

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                reason="needs git and a git checkout of mlagen (the tool reads old revisions)")


@pytest.fixture
def clone(tmp_path):
    """A clone of this checkout's HEAD whose sparse_gather.cuh then differs from HEAD's."""
    dst = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dst)], check=True)
    with open(dst / CHANGED, "a") as f:
        f.write("// changed after HEAD: must not reach the base kernel\n")
    return dst


def status(root: Path) -> list[str]:
    return subprocess.run(["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def test_plan_copies_the_changed_header_and_its_includers_only(clone):
    tool = load_tool("ab_install.py")
    files = tool.plan(SPEC, "HEAD", clone)
    headers = {p for p in files if p.startswith("templates/include/")}
    assert headers == {"templates/include/mlagen/sm90/sparse_gather_base.cuh",
                       "templates/include/mlagen/sm90/sparse_h16_base.cuh"}
    assert '#include "mlagen/sm90/sparse_h16_base.cuh"' in files["templates/mla_sparse_prefill_sm90_h16_base.cu.j2"]
    h16 = files["templates/include/mlagen/sm90/sparse_h16_base.cuh"]
    assert '#include "mlagen/sm90/sparse_gather_base.cuh"' in h16
    assert '#include "mlagen/sm90/wgmma.cuh"' in h16              # unchanged and includes nothing changed
    assert "must not reach the base kernel" not in files["templates/include/mlagen/sm90/sparse_gather_base.cuh"]
    spec_text = files[f"specs/{SPEC}_base.yaml"]
    assert f"name: {SPEC}_base" in spec_text and "priority: 1" in spec_text
    assert "template: mla_sparse_prefill_sm90_h16_base.cu.j2" in spec_text


def test_install_compiles_both_kernels_and_remove_leaves_nothing(clone):
    tool = load_tool("ab_install.py")
    assert tool.main([SPEC, "HEAD", "--root", str(clone)]) == 0
    # A second install refuses before writing anything.
    with pytest.raises(SystemExit, match="exist"):
        tool.main([SPEC, "HEAD", "--root", str(clone)])
    # Both specs render and compile from the clone's own files.
    code = (f"from mlagen import spec, variant, render\nfrom mlagen.compiler import for_target\n"
            f"for name in ({SPEC + '_base'!r}, {SPEC!r}):\n"
            f"    v = variant.make(spec.load(name), {{'kv_format': 'fp8_b0', 'paged': False}})\n"
            f"    b = for_target('sm_90a').compile(render.render(v), 'sm_90a', use_cache=False)\n"
            f"    print(v.symbol, b.resources.registers)\n")
    env = dict(os.environ, PYTHONPATH=str(clone), MLAGEN_OUT_DIR=str(clone / "out"))
    out = subprocess.run([sys.executable, "-c", code], cwd=clone, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"{SPEC}_base_576_0_fp8_b0" in out.stdout and f"{SPEC}_576_0_fp8_b0" in out.stdout
    assert tool.main([SPEC, "--remove", "--root", str(clone)]) == 0
    assert status(clone) == [f" M {CHANGED}"]


def test_a_jinja_include_copies_every_alternative_and_keeps_its_expression(tmp_path):
    """The 64-head sparse template names its KV header by a Jinja expression
    (``sparse_kv_{{ 'fp8' if kv.quantized else 'bf16' }}.cuh``): a change to either header copies
    both, the include keeps the expression with the suffix after it, and both base kernels (bf16
    and an FP8 cache) render and compile; remove leaves nothing."""
    dst = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dst)], check=True)
    changed = "templates/include/mlagen/sm90/sparse_kv_fp8.cuh"
    with open(dst / changed, "a") as f:
        f.write('#error "changed after HEAD: must not reach the base kernel"\n')
    tool = load_tool("ab_install.py")
    spec = "mla_sparse_prefill_sm90"
    assert tool.alternatives("mlagen/sm90/sparse_kv_{{ 'fp8' if kv.quantized else 'bf16' }}.cuh") == [
        "mlagen/sm90/sparse_kv_fp8.cuh", "mlagen/sm90/sparse_kv_bf16.cuh"]
    files = tool.plan(spec, "HEAD", dst)
    headers = {p for p in files if p.startswith("templates/include/")}
    assert {"templates/include/mlagen/sm90/sparse_kv_fp8_base.cuh",
            "templates/include/mlagen/sm90/sparse_kv_bf16_base.cuh"} <= headers
    assert ("#include \"mlagen/sm90/sparse_kv_{{ 'fp8' if kv.quantized else 'bf16' }}_base.cuh\""
            in files[f"templates/{spec}_base.cu.j2"])
    assert tool.main([spec, "HEAD", "--root", str(dst)]) == 0
    code = (f"from mlagen import spec, variant, render\nfrom mlagen.compiler import for_target\n"
            f"for fmt in ('bf16', 'fp8_v32'):\n"
            f"    for name in ({spec + '_base'!r}, {spec!r}):\n"
            f"        v = variant.make(spec.load(name), {{'kv_format': fmt}})\n"
            f"        try:\n"
            f"            b = for_target('sm_90a').compile(render.render(v), 'sm_90a', use_cache=False)\n"
            f"            print('compiled', v.symbol, b.resources.registers)\n"
            f"        except Exception as e:\n"
            f"            print('failed', v.symbol, 'must not reach' in str(e))\n")
    env = dict(os.environ, PYTHONPATH=str(dst), MLAGEN_OUT_DIR=str(dst / "out"))
    out = subprocess.run([sys.executable, "-c", code], cwd=dst, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    # The tree's FP8 kernel reads the changed header (#error); both base kernels and the tree's bf16 do not.
    assert out.stdout.count("compiled ") == 3 and out.stdout.count("failed ") == 1, out.stdout
    assert f"failed {spec}_576_0_fp8_v32" in out.stdout and "True" in out.stdout, out.stdout
    assert tool.main([spec, "--remove", "--root", str(dst)]) == 0
    assert status(dst) == [f" M {changed}"]
