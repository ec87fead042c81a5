"""tools/fa3_extra (FlashAttention-3 kernels for 256 / 256, local windows and softcap as bench peers):
the instances, the generated sources, the compile / link commands and the object cache, without a GPU;
and that the dense family's fa3 peer understands the kernels the tool names."""

from __future__ import annotations

import os
import shlex
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from _tool import load_tool

ROOT = Path(__file__).resolve().parent.parent

tool = load_tool("fa3_extra/build.py")

FAKE_FA3 = SimpleNamespace(  # what build.py takes from <peers>/fa3/build_fa3.py
    ROOT="/peers/fa3", CSRC="/peers/fa3/csrc",
    INCLUDE_DIRS=["/peers/fa3/csrc/hopper", "/peers/fa3/csrc/peer", "/peers/fa3/csrc/cutlass/include"],
    FA3_NVCC_FLAGS=["-O3", "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a"],
    TORCH_COMMON_NVCC_FLAGS=["--expt-relaxed-constexpr"], CXX_FLAGS=["-O3", "-std=c++17"])
TOOLS = tool.Toolchain("/cuda/bin/nvcc", "c++", ("/cuda/include",), ("/torch/include", "/cuda/include"),
                       ("-D_GLIBCXX_USE_CXX11_ABI=1",), ("-L/torch/lib", "-ltorch", "-lcudart"))


def test_instances_are_the_few_the_bench_needs():
    got = {(i.d, i.dv, i.causal, i.local, i.softcap) for i in tool.INSTANCES}
    assert got == {(256, 256, True, False, False), (256, 256, False, False, False),   # D8, D9 (and no mask)
                   (192, 128, False, True, False),                                    # D11's window
                   (192, 128, True, False, True)}                                     # softcap
    assert len({i.name for i in tool.INSTANCES}) == len(tool.INSTANCES)
    with pytest.raises(ValueError, match="both causal and local"):
        tool.Instance("x", 256, 256, causal=True, local=True)


@pytest.mark.parametrize("inst", tool.INSTANCES, ids=lambda i: i.name)
def test_kernel_source_is_one_leaf_of_fa3s_dispatch(inst):
    src = tool.kernel_source(inst)
    args = src[src.index("run_flash_fwd<") + len("run_flash_fwd<"):src.index(">(params, stream)")]
    values = [a.split("*/")[-1].strip() for a in args.replace("\n", " ").split(",")]
    assert values == ["90", str(inst.d), str(inst.dv), "1", "cutlass::bfloat16_t", "cutlass::bfloat16_t",
                      str(inst.causal).lower(), str(inst.local).lower(), str(inst.softcap).lower(), "true",
                      "false", "false", "false", "false", "false", "false"]
    assert f"void {inst.symbol}(Flash_fwd_params &params, cudaStream_t stream) {{" in src
    assert '#include "flash_fwd_launch_template.h"' in src


def test_kernels_header_lists_every_instance_for_the_op():
    header = tool.kernels_header(tool.INSTANCES[1:3])
    rows = [line.strip() for line in header.splitlines() if line.strip().startswith("{") and '"' in line]
    assert rows == ['{256, 256, false, false, false, &fa3_extra_fwd_hdim256_noncausal, "hdim256_noncausal"},',
                    '{192, 128, false, true, false, &fa3_extra_fwd_hdim192_128_local, "hdim192_128_local"},']
    api = (ROOT / "tools" / "fa3_extra" / "fa3_extra_api.cpp").read_text()
    assert '#include "fa3_extra_kernels.h"' in api and "kFa3ExtraKernels" in api


def test_select_names_unknown_instances():
    assert tool.select(None) == tool.INSTANCES
    assert [i.name for i in tool.select("hdim192_128_local, hdim256_causal")] == ["hdim256_causal",
                                                                                 "hdim192_128_local"]
    with pytest.raises(ValueError, match="unknown 'hdim64'; choose from hdim256_causal, hdim256_noncausal"):
        tool.select("hdim64,hdim256_causal")


def test_plan_compiles_each_kernel_with_fa3s_flags_and_links_them(tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    jobs, link = tool.plan(FAKE_FA3, TOOLS, tmp_path, tool.INSTANCES, extra_nvcc="-DX=1")
    assert [j.name for j in jobs] == [i.name for i in tool.INSTANCES] + ["prepare_scheduler", "api"]
    for job, inst in zip(jobs, tool.INSTANCES):
        cmd = list(job.cmd)
        assert cmd[0] == "/cuda/bin/nvcc" and cmd[-4:] == ["-c", str(tmp_path / inst.source_name), "-o", str(job.obj)]
        assert "arch=compute_90a,code=sm_90a" in cmd and "--expt-relaxed-constexpr" in cmd and "-DX=1" in cmd
        assert f"-I{tmp_path}" in cmd and "-I/peers/fa3/csrc/hopper" in cmd and "/torch/include" not in cmd
        assert cmd[cmd.index("--compiler-options") + 1] == "-fPIC"
    sched, api = jobs[-2], jobs[-1]
    assert sched.src == Path("/peers/fa3/csrc/hopper/flash_prepare_scheduler.cu") and sched.cmd[0] == "/cuda/bin/nvcc"
    assert api.cmd[0] == "c++" and "/torch/include" in api.cmd and str(tool.API_SRC) in api.cmd
    assert "-gencode" not in api.cmd and f"-I{tmp_path}" in api.cmd   # the generated header
    assert link[:2] == ("c++", "-shared") and link[-2:] == ("-o", str(tmp_path / "fa3_extra_C.so"))
    assert [a for a in link if a.endswith(".o")] == [str(j.obj) for j in jobs]
    assert "-ltorch" in link and "-lcudart" in link
    monkeypatch.setenv("CXX", "g++-12")
    jobs, _ = tool.plan(FAKE_FA3, TOOLS, tmp_path, tool.INSTANCES[:1])
    assert jobs[0].cmd[1:3] == ("-ccbin", "g++-12")


def test_plan_with_the_real_fa3_build_script(tmp_path):
    """The peer's build_fa3.py, where it is: its own flags end up in our commands."""
    try:
        fa3 = tool.load_fa3_build(tool.peers_dir())
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    jobs, _ = tool.plan(fa3, TOOLS, tmp_path, tool.INSTANCES)
    for flag in [*fa3.FA3_NVCC_FLAGS, *fa3.TORCH_COMMON_NVCC_FLAGS]:
        assert flag in jobs[0].cmd
    assert Path(jobs[-2].src).is_file()   # flash_prepare_scheduler.cu is in the vendored sources


def test_missing_fa3_build_script_is_one_line(tmp_path):
    with pytest.raises(FileNotFoundError, match="build_fa3.py not found .*set MLAGEN_PEERS_DIR"):
        tool.load_fa3_build(tmp_path)
    with pytest.raises(FileNotFoundError, match="peers directory: None"):
        tool.load_fa3_build(None)


def test_objects_are_cached_by_command_and_time(tmp_path):
    src, obj = tmp_path / "k.cu", tmp_path / "k.cuda.o"
    src.write_text("x")
    job = tool.Job("k", ("nvcc", "-c", str(src)), src, obj)
    assert not tool.up_to_date(job, 0.0)
    obj.write_bytes(b"o")
    Path(str(obj) + ".cmd").write_text(shlex.join(job.cmd))
    now = time.time()
    os.utime(src, (now - 10, now - 10))
    os.utime(obj, (now, now))
    assert tool.up_to_date(job, now - 5)
    assert not tool.up_to_date(job, now + 5)                                     # a header changed after it
    assert not tool.up_to_date(tool.Job("k", ("nvcc", "-O2", "-c", str(src)), src, obj), now - 5)  # another command
    os.utime(src, (now + 10, now + 10))
    assert not tool.up_to_date(job, now - 5)                                     # its own source changed
    tool.write_if_changed(src, "x")                                              # same text: time stamp kept
    assert src.stat().st_mtime == pytest.approx(now + 10)


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="no nvcc here")
def test_dry_run_prints_the_commands_and_builds_nothing(tmp_path, capsys):
    pytest.importorskip("torch")
    if tool.peers_dir() is None:
        pytest.skip("no peers directory (MLAGEN_PEERS_DIR)")
    assert tool.main(["--dry-run", "--only", "hdim256_causal", "--build-dir", str(tmp_path / "b")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip() and not line.startswith("[build]")]
    assert len(lines) == 4 and "fwd_hdim256_causal_sm90.cu" in lines[0] and lines[-1].endswith("fa3_extra_C.so")
    assert not (tmp_path / "b").exists()
    assert tool.main(["--only", "nope"]) == 2


def test_the_fa3_peer_reads_the_tools_kernel_names():
    from mlagen.families.mla_prefill.peers import _kernel_fits

    for inst in tool.INSTANCES:
        fits = [(d, dv, c, w) for d, dv in ((256, 256), (192, 128)) for c, w in ((True, False), (False, True),
                                                                                  (False, False))
                if _kernel_fits(inst.name, d, dv, c, w)]
        expect = [] if inst.softcap else [(inst.d, inst.dv, inst.causal, inst.local)]   # the bench runs no softcap
        assert fits == expect, inst.name
