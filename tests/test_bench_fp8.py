"""``mlagen.families.mla_prefill.tools``'s FlashAttention-3 FP8 peer: where it looks for the library, and the line it
prints when the library is not built (no GPU needed)."""
import pytest

from mlagen.families.mla_prefill import tools as bench_fp8


def test_fa3_fp8_missing_library_names_the_path_and_the_build_command(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    monkeypatch.delenv("FA3_FP8_SO", raising=False)
    monkeypatch.setenv("FA3_FP8_BUILD", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        bench_fp8.fa3_fp8_op()
    msg = str(e.value)
    assert str(tmp_path / bench_fp8.FA3_FP8_LIBRARY) in msg and "tools/fa3_fp8/build.py" in msg
    monkeypatch.setenv("FA3_FP8_SO", str(tmp_path / "elsewhere.so"))
    with pytest.raises(SystemExit, match="elsewhere.so"):
        bench_fp8.fa3_fp8_op()



@pytest.mark.parametrize("tool, argv", [("mla_prefill.tools", []), ("mla_sparse_prefill.tools", ["verify"]), ("mla_sparse_prefill.tools", ["bench-fp8"]),
                                        ("mla_sparse_prefill.tools", ["verify-fp8"]), ("mla_sparse_prefill.tools", ["profile"])])
def test_the_gpu_tools_say_so_in_one_line_without_a_gpu(tool, argv, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    import importlib

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert importlib.import_module(f"mlagen.families.{tool}").main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"mlagen.families.{tool}: ") and "needs a CUDA GPU, and torch sees none" in err


@pytest.mark.parametrize("formats, bad", [("fp8_v32,fp8_b16", "fp8_b16"), ("bf16", "bf16"), ("fp8_v4", "fp8_v4")])
def test_bench_fp8_formats_are_checked_before_the_gpu(formats, bad, capsys):
    from mlagen.families.mla_sparse_prefill import tools as bench_sparse

    assert bench_sparse.main(["bench-fp8", "--formats", formats]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"mlagen.families.mla_sparse_prefill.tools: --formats: {bad!r} is not an FP8 cache format; one of "
                   "['fp8_v32', 'fp8_b64', 'fp8_b32', 'fp8_b0']")
