"""mlagen.cli through click's CliRunner: the commands that need no GPU work here, and user
mistakes end in one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from mlagen import cli, db
from mlagen import spec as spec_mod
from mlagen import variant

S80 = spec_mod.load("mla_prefill_sm80")
S90 = spec_mod.load("mla_prefill_sm90")


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("MLAGEN_OUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLAGEN_COMPILE_WORKERS", "2")
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(cli.cli, list(args), catch_exceptions=True)

    return invoke


def ok(result):
    assert result.exit_code == 0, f"exit {result.exit_code}: {result.output}\n{result.exception!r}"
    return result.output


def user_error(result, *fragments):
    """One 'Error: ...' line, exit 1, a SystemExit (click's handling), no traceback."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def test_help_lists_the_commands(run):
    out = ok(run("--help"))
    for command in ("build", "bench", "db", "info", "specs", "tune", "variants"):
        assert command in out


def test_version(run):
    assert "0.1.0" in ok(run("--version"))


def test_specs(run):
    out = ok(run("specs"))
    lines = out.splitlines()
    assert lines[0].split() == ["spec", "family", "abi", "priority", "targets", "variants", "file", "executed"]
    rows = {line.split()[0]: line.split() for line in lines[2:] if line.startswith("mla_")}
    assert set(rows) == {"mla_prefill_sm80", "mla_prefill_sm90", "mla_prefill_gfx942", "mla_prefill_gfx950",
                         "mla_prefill_gfx942_fp8", "mla_prefill_gfx950_fp8", "mla_prefill_sm90_fp8", "mla_sparse_prefill_sm80",
                         "mla_sparse_prefill_sm90", "mla_sparse_prefill_sm90_h16"}
    assert rows["mla_prefill_gfx942_fp8"][7:] == ["none", "(compiled", "only)"]
    assert rows["mla_prefill_sm90"][7] == "sm_90a" and rows["mla_prefill_gfx950"][7:] == ["none", "(compiled", "only)"]
    assert rows["mla_sparse_prefill_sm90"][1:5] == ["mla_sparse_prefill", "gather", "20", "sm_90a"]
    assert rows["mla_sparse_prefill_sm90_h16"][1:5] == ["mla_sparse_prefill", "gather_tma", "30", "sm_90a"]
    assert rows["mla_prefill_sm80"][1:6] == ["mla_prefill", "simt", "10", "sm_80,sm_86,sm_89,sm_90a,sm_100a", "256"]
    sizes = math.prod(len(t.values) for t in S90.tunables) * math.prod(len(v) for _, v in S90.specialize)
    assert rows["mla_prefill_sm90"][5] == str(sizes)


def test_variants(run):
    result = run("variants", "mla_prefill_sm80", "--arch", "sm_80")
    out = ok(result)
    rows = [line for line in out.splitlines() if line.startswith("mla_prefill_sm80_")]
    assert len(rows) == 256
    pruned = [r for r in rows if " pruned " in r]
    kept = [r for r in rows if " ok " in r]
    assert len(kept) + len(pruned) == 256 and len(kept) > 20
    big = next(r for r in rows if r.startswith("mla_prefill_sm80_causal_m128_n128_w8_s3_swpad_qr1 "))
    assert "pruned" in big and "needs 302.0 KB of shared memory" in big
    assert f"{len(kept)} of 256 variants fit sm_80" in out


def test_variants_unknown_arch(run):
    result = run("variants", "mla_prefill_sm80", "--arch", "sm_99")
    assert result.exit_code != 0 and "Traceback" not in result.output


def test_build_default_spec(run, tmp_path):
    out_dir = tmp_path / "artifacts"
    out = ok(run("build", "--out", str(out_dir)))
    # The default spec is the dispatcher's first choice: the highest-priority one.
    assert "mla_prefill_sm90" in out
    for mask in ("causal", "none"):
        symbol = variant.default(S90, mask=mask).symbol
        assert (out_dir / "sm_90a" / f"{symbol}.sm_90a.cubin").read_bytes()[:4] == b"\x7fELF"
        assert json.loads((out_dir / "sm_90a" / f"{symbol}.sm_90a.json").read_text())["symbol"] == symbol
        row = next(line for line in out.splitlines() if line.startswith(symbol))
        assert row.split()[1:4] == ["sm_90a", "ok", "384"]


def test_build_sm80_for_sm80(run, tmp_path):
    out_dir = tmp_path / "artifacts"
    out = ok(run("build", "mla_prefill_sm80", "--arch", "sm_80", "--variant", "block_n=32", "--out", str(out_dir)))
    header = next(line for line in out.splitlines() if line.startswith("variant"))
    assert header.split() == ["variant", "target", "status", "threads", "smem", "KB", "regs", "est", "regs", "spill",
                              "B", "stack", "B", "note"]
    for mask in ("causal", "none"):
        symbol = variant.make(S80, {"mask": mask, "block_n": 32}).symbol
        assert (out_dir / "sm_80" / f"{symbol}.sm_80.cubin").exists()
        row = next(line for line in out.splitlines() if line.startswith(symbol)).split()
        assert row[1:4] == ["sm_80", "ok", "256"]
        assert row[4] == f"{(128 * 400 + 2 * (32 * 400 + 32 * 272)) / 1024:.1f}"  # smem KB
        assert int(row[6]) > 0 and row[7] == "0"  # ptxas registers, no spills
    assert sorted(p.suffix for p in (out_dir / "sm_80").iterdir()) == [".cubin", ".cubin", ".json", ".json"]


def test_build_default_output_dir_follows_out_dir(run, tmp_path):
    ok(run("build", "mla_prefill_sm80", "--arch", "sm_80", "--variant", "block_n=32,mask=none"))
    symbol = variant.make(S80, {"mask": "none", "block_n": 32}).symbol
    assert (tmp_path / "out" / "build" / "sm_80" / f"{symbol}.sm_80.cubin").exists()


def test_build_pruned_only_fails(run, tmp_path):
    # Tunables fixed to a variant too large for sm_86 (unfixed, build takes the nearest that fits).
    result = run("build", "mla_prefill_sm80", "--arch", "sm_86", "--variant", "block_n=128,stages=3,block_m=128",
                 "--out", str(tmp_path / "a"))
    assert result.exit_code == 1
    assert "pruned" in result.output and "sm_86 allows 99.0 KB" in result.output
    assert "Traceback" not in result.output


def test_build_progress_bar_when_asked(run, tmp_path):
    args = ("build", "mla_prefill_sm80", "--arch", "sm_86", "--all", "--variant", "block_n=128,stages=3,block_m=128",
            "--out", str(tmp_path / "a"))
    bar = run(*args, "--progress").output    # every variant pruned: quick, and the bar still counts them
    assert "build [" in bar and "ETA" not in bar.split("build [")[0] and "/" in bar
    plain = run(*args).output                # not a terminal: a line per variant
    assert "build [" not in plain and "[1/" in plain


def test_build_bad_variant_value(run):
    user_error(run("build", "--variant", "block_n=96x"), "tune.block_n: '96x' is not one of [")


def test_build_unknown_tunable(run):
    user_error(run("build", "mla_prefill_sm80", "--variant", "block_k=64"), "tune.block_k: unknown tunable")


def test_build_arch_the_spec_does_not_target(run):
    user_error(run("build", "mla_prefill_sm90", "--arch", "sm_80"), "--arch sm_80: mla_prefill_sm90 targets sm_90a")


def test_unknown_spec_name(run):
    line = user_error(run("build", "mla_prefill_sm70"), "mla_prefill_sm70", "no spec of that name",
                      "mla_prefill_sm80, mla_prefill_sm90")
    assert line.count("\n") == 0
    user_error(run("variants", "nope"), "no spec of that name")


def test_broken_spec_file_is_one_line(run, tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    user_error(run("variants", str(p)), "bad.yaml: line ", ": invalid YAML: ")


# --- db -------------------------------------------------------------------------------------


def _fill(path):
    d = db.TuningDB(path)
    key = db.RecordKey("mla_prefill", "mla_prefill_sm90", "causal/h128/q8192/k8192", "bf16", "NVIDIA H100", 132,
                       "13.0", "nvrtc 13.0", "0123456789abcdef")
    d.add_trials([db.Trial(key, {"block_n": 128}, "sym_ok", "ok", 1.25, 612.0, 1e-3, 168, 0, "", "run-a", 1.0),
                  db.Trial(key, {"block_n": 176}, "sym_bad", "compile_error", detail="ptxas error\nmore", run_id="run-a",
                           created=2.0)])
    d.set_best(db.Best(key, {"block_n": 128}, "sym_ok", 1.25, 612.0, "run-a", 3.0))
    return d


def test_db_ls_and_show(run, tmp_path):
    path = tmp_path / "t.sqlite"
    _fill(path)
    out = ok(run("db", "--db", str(path), "ls"))
    assert "user" in out and "sym_ok" in out and "1.250" in out and "612" in out and "run-a" in out
    out = ok(run("db", "--db", str(path), "show"))
    assert "sym_ok" in out and "sym_bad" in out and "compile_error" in out and "ptxas error" in out
    assert "more" not in out  # only the first line of a detail
    out = ok(run("db", "--db", str(path), "show", "--problem", "none/h1/q1/k1"))
    assert "sym_ok" not in out


def test_db_export_import(run, tmp_path):
    src = tmp_path / "src.sqlite"
    _fill(src)
    export = tmp_path / "export.json"
    out = ok(run("db", "--db", str(src), "export", str(export)))
    assert "exported 1 winner(s) and 2 trial(s)" in out
    doc = json.loads(export.read_text())
    assert doc["format"] == "mlagen-tuning"
    dst = tmp_path / "dst.sqlite"
    out = ok(run("db", "--db", str(dst), "import", str(export)))
    assert "trials: 2 added, 0 already present\nwinners: 1 added, 0 replaced, 0 kept" in out
    assert db.TuningDB(dst).export() == db.TuningDB(src).export()
    out = ok(run("db", "--db", str(dst), "import", str(export)))
    assert "trials: 0 added, 2 already present\nwinners: 0 added, 0 replaced, 1 kept" in out
    assert db.TuningDB(dst).export() == db.TuningDB(src).export()
    user_error(run("db", "--db", str(src), "export", str(export)), str(export), "already exists", "--force")
    ok(run("db", "--db", str(dst), "export", "--force", str(export)))
    out = ok(run("db", "--db", str(src), "export", "--best-only", str(tmp_path / "best.json")))
    assert "exported 1 winner(s) and 0 trial(s)" in out


@pytest.mark.parametrize("content, fragment", [
    ("{ not json", "not JSON"),
    ('{"format": "other"}', 'expected "format": "mlagen-tuning"'),
    ('{"format": "mlagen-tuning", "version": 1, "best": [{"family": "x"}]}', "best[0]: missing 'spec'"),
    ('{"format": "mlagen-tuning", "version": 1, "best": 5}', "best: expected a list"),
])
def test_db_import_of_a_bad_file(run, tmp_path, content, fragment):
    dst = tmp_path / "dst.sqlite"
    _fill(dst)
    before = db.TuningDB(dst).export()
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    user_error(run("db", "--db", str(dst), "import", str(bad)), fragment)
    assert db.TuningDB(dst).export() == before


def test_db_import_missing_file(run, tmp_path):
    user_error(run("db", "--db", str(tmp_path / "d.sqlite"), "import", str(tmp_path / "none.json")), "no such file")


def test_db_with_a_newer_schema(run, tmp_path):
    import sqlite3

    path = tmp_path / "t.sqlite"
    _fill(path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '7' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    user_error(run("db", "--db", str(path), "ls"), "schema version 7")


# --- info and bench -------------------------------------------------------------------------


def test_info_without_a_gpu(run):
    out = ok(run("info"))
    assert "nvrtc" in out and "sm_80" in out
    assert "device" in out
    for name in ("MLAGEN_OUT_DIR", "MLAGEN_CACHE_DIR", "MLAGEN_TUNING_DB", "MLAGEN_LOG"):
        assert name in out


def test_info_shows_the_resolved_paths(run, tmp_path, monkeypatch):
    monkeypatch.delenv("MLAGEN_CACHE_DIR")
    monkeypatch.delenv("MLAGEN_TUNING_DB", raising=False)
    out = ok(run("info"))
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("MLAGEN_")}
    assert rows["MLAGEN_CACHE_DIR"] == str((tmp_path / "out" / "cache").resolve())
    assert rows["MLAGEN_TUNING_DB"] == str((tmp_path / "out" / "tuning.sqlite").resolve())
    assert "None" not in out


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU error; this machine has a GPU")
def test_bench_without_a_gpu(run):
    user_error(run("bench", "--shapes", "D1", "--peers", "mlagen"), "GPU")


def test_bench_bad_shape(run):
    result = run("bench", "--shapes", "D99")
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


@pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU error; this machine has a GPU")
@pytest.mark.parametrize("args", [["--shape", "S1"], ["--shape", "D1", "--shape", "sq=64,h=16,topk=128,skv=512"],
                                  ["--shapes", "S5,S6", "--peers", "naive,mlagen"]])
def test_bench_takes_any_familys_shapes(run, args):
    """Ids and descriptions of either family get as far as the GPU check."""
    user_error(run("bench", *args), "needs a CUDA GPU")


def test_bench_peer_of_another_family(run):
    user_error(run("bench", "--shape", "S1", "--peers", "cudnn"), "unknown peer 'cudnn'; choose from flashmla")


def test_bench_lists_each_familys_peers(run, monkeypatch, tmp_path):
    monkeypatch.setenv("MLAGEN_PEERS_DIR", str(tmp_path))
    out = ok(run("bench", "--list-peers"))
    assert out.index("mla_prefill (shapes D1") < out.index("mla_sparse_prefill (shapes S1")
    for name in ("fa3", "cudnn", "fa2", "mlagen-check", "flashmla", "naive"):
        assert any(line.strip().startswith(name + " ") for line in out.splitlines()), name
    assert "flashmla/flashmla_sparse_peer.py not found" in out


def test_bad_knob_is_one_line(run, monkeypatch):
    monkeypatch.setenv("MLAGEN_COMPILE_WORKERS", "many")
    user_error(run("build", "mla_prefill_sm80", "--arch", "sm_80"), "MLAGEN_COMPILE_WORKERS='many'")


def test_bad_log_level_is_one_line(run, monkeypatch):
    monkeypatch.setenv("MLAGEN_LOG", "loud")
    user_error(run("specs"), "MLAGEN_LOG='loud'")  # info reports it instead (tests/test_knobs.py)


# --- tune: argument errors before any GPU work ----------------------------------------------------


def test_tune_needs_a_shape_or_a_workload(run):
    user_error(run("tune"), "--shape", "--workload")


@pytest.mark.parametrize("args, fragment", [
    (("--shape", "q=5"), "needs q=<length> and h=<heads>"),
    (("--shape", "D99"), "unknown shape id 'D99'"),
    (("--shape", "b=2,q=[1,2,3],h=4"), "the batch (2) and the q/k lists disagree"),
    (("--shape", "D1", "--devices", "0,x"), "'x' is not a GPU index"),
    (("--shape", "D1", "--budget", "0"), "--budget"),
    (("--shape", "D1", "--strategy", "random"), "random"),
    (("--shape", "D1", "--fixed", "cluster=3"), "cluster"),
])
def test_tune_argument_errors_are_one_line(run, args, fragment):
    result = run("tune", "mla_prefill_sm90", *args)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert fragment in result.output


def test_tune_bad_workload_is_one_line(run, tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("family: mla_prefill\nshapes:\n  - {shape: D1, weight: -1}\n")
    user_error(run("tune", "--workload", str(path)), "shapes[0].weight")
    user_error(run("tune", "--workload", str(tmp_path / "none.yaml")), "no such workload file")


@pytest.mark.skipif(_has_gpu(), reason="checks the no-GPU error; this machine has a GPU")
def test_tune_without_a_gpu_is_one_line(run):
    result = run("tune", "mla_prefill_sm90", "--shape", "b=4,q=4096,h=16")
    user_error(result)


def test_format_tune_results():
    from mlagen.tune import Final, TrialResult, TuneResult

    d = variant.make(S90, {"mask": "causal"})
    w = d.with_values(stages=3, block_n=64)
    trials = [TrialResult(d, "ok", 2.0, 300.0, 1e-3, 168, 0), TrialResult(w, "ok", 1.0, 600.0, 1e-3, 168, 0, resumed=True),
              TrialResult(d.with_values(stages=4), "pruned", detail="too big")]
    r = TuneResult("D1", "causal/h128/q8192/k8192", "run1", trials, trials[1], trials[0], 12.0, 3.0,
                   [Final(w, [1.0, 1.0, 1.1]), Final(d, [2.2, 2.2, 2.2])], "budget")
    text = cli.format_tune_results([r], top=5)
    assert "3 trials in 12 s (1 resumed) [stopped: budget spent]: ok 2, pruned 1" in text
    assert f"winner {w.symbol}: 2.20x the spec default" in text
    assert "final re-timing" in text and "weight 3" in text


@pytest.mark.parametrize("flag, expected", [([], True), (["--no-measure-ahead"], False), (["--measure-ahead"], True)])
def test_tune_passes_measure_ahead_to_the_tuner(monkeypatch, flag, expected):
    import mlagen.tune

    seen = []
    monkeypatch.setattr(mlagen.tune, "tune", lambda config, **_: seen.append(config) or [])
    result = CliRunner().invoke(cli.cli, ["tune", "mla_prefill_sm90", "--shape", "D1", *flag])
    assert result.exit_code == 0, result.output
    assert [c.measure_ahead for c in seen] == [expected]
