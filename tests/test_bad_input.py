"""The bad-input corpus: broken specs and bad command-line arguments, each through the CLI.

Every case must end in exactly one ``Error:`` line that names the file (or the argument) and the
key, exit non-zero, print no traceback and take under 5 s (a hang is an alarm, not a stuck run).
The spec cases go through both ``mlagen variants`` and ``mlagen build``.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mlagen import cli, paths

BASE = yaml.safe_load((paths.specs_dir() / "mla_prefill_sm80.yaml").read_text())
NAME = "mla_prefill_sm80"
SECONDS = 5


def _set(path, value):
    def mutate(d):
        target = d
        for p in path[:-1]:
            target = target[p]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return mutate


def _constraint(require):
    return _set(["constraints"], [{"require": require, "message": "m"}])


def _resource(key, text):
    return _set(["resources", key], text)


# (id, mutation of the sm80 spec, key the error must name, fragment of the message)
SPEC_CASES = [
    ("name-of-another-file", _set(["name"], "mla_prefill_sm90"), "name", "does not match the file name"),
    ("name-not-identifier", _set(["name"], "Bad Name"), "name", "lowercase identifier"),
    ("unknown-family", _set(["family"], "gemm"), "family", "'gemm' is not one of"),
    ("unknown-abi", _set(["abi"], "wmma"), "abi", "'wmma' is not one of"),
    ("bool-priority", _set(["priority"], True), "priority", "expected an integer"),
    ("template-absolute", _set(["template"], "/etc/passwd"), "template", "is not a file under templates/"),
    ("template-escapes", _set(["template"], "../../../etc/passwd"), "template", "is not a file under templates/"),
    ("template-escapes-from-spec-dir", _set(["template"], "../" * 12 + "etc/hostname"), "template", "stays inside"),
    ("template-missing", _set(["template"], "nope.cu.j2"), "template", "is not a file"),
    ("no-targets", _set(["targets"], []), "targets", "must not be empty"),
    ("unknown-target", _set(["targets"], ["sm_99"]), "targets[0]", "'sm_99' is not one of"),
    ("wrong-head-dim", _set(["problem", "d_nope"], 64), "problem.d_nope", "this family implements d_nope = 128"),
    ("bool-head-dim", _set(["problem", "d_nope"], True), "problem.d_nope", "this family implements"),
    ("problem-not-scalar", _set(["problem", "extra"], [1, 2]), "problem.extra", "expected a scalar"),
    ("tune-missing", _set(["tune"], KeyError), "tune", "required key is missing"),
    ("values-empty", _set(["tune", "block_n", "values"], []), "tune.block_n.values", "must not be empty"),
    ("default-not-a-value", _set(["tune", "block_n", "default"], 48), "tune.block_n.default", "48 is not one of"),
    ("bool-among-ints", _set(["tune", "block_n", "values"], [32, True]), "tune.block_n.values[1]", "one type"),
    ("bool-default-for-int", _set(["tune", "block_m", "default"], True), "tune.block_m.default", "is not one of"),
    ("float-value", _set(["tune", "block_n", "values"], [32, 64.5]), "tune.block_n.values[1]", "expected an int"),
    ("duplicate-abbr", _set(["tune", "warps", "abbr"], "n"), "tune.warps.abbr", "already used"),
    ("unknown-tunable-key", _set(["tune", "block_n", "step"], 2), "tune.block_n.step", "unknown key"),
    ("tunable-not-identifier", _set(["tune", "Block"], {"values": [1], "default": 1}), "tune.Block", "identifier"),
    ("huge-repetition", _constraint("'a' * 10**9 == 'a'"), "constraints[0].require", "result too large"),
    ("nested-powers", _constraint("(10**64)**64 > 0"), "constraints[0].require", "result too large"),
    ("deeply-nested-powers", _constraint("(((10**64)**64)**64)**64 > 0"), "constraints[0].require", "too large"),
    ("tower-of-powers", _constraint("9**9**9**9 > 0"), "constraints[0].require", "too large"),
    ("unknown-name", _constraint("block_q > 0"), "constraints[0].require", "unknown name(s) ['block_q']"),
    ("import-call", _constraint("__import__('os').system('true')"), "constraints[0].require", "only these functions"),
    ("attribute", _constraint("block_m.real > 0"), "constraints[0].require", "Attribute is not allowed"),
    ("message-missing", _set(["constraints"], [{"require": "block_m > 0"}]), "constraints[0].message", "missing"),
    ("division-by-zero", _constraint("block_m // 0 == 1"), "constraints[0].require", "division by zero"),
    ("resource-missing", _set(["resources", "threads"], KeyError), "resources.threads", "required key is missing"),
    ("resource-syntax", _resource("smem_bytes", "block_m *"), "resources.smem_bytes", "not a valid expression"),
    ("resource-unknown-name", _resource("registers", "regs * 2"), "resources.registers", "unknown name(s)"),
    ("resource-too-long", _resource("threads", "+".join(["warps"] * 800)), "resources.threads", "at most"),
    ("resource-too-deep", _resource("threads", "(" * 300 + "1" + ")" * 300), "resources.threads", "not a valid"),
    ("derived-redefines", _set(["derived", "d_nope"], "1"), "derived.d_nope", "name already defined"),
    ("unknown-mask", _set(["specialize", "mask"], ["causal", "sliding"]), "specialize", "specialises on mask (values from"),
    ("unknown-top-key", _set(["bogus"], 1), "bogus", "unknown key"),
    ("default-breaks-constraint", _constraint("block_m == 64"), "tune", "the default variant breaks constraint 0"),
]

# (id, file content as bytes, key the error must name or "", fragment)
FILE_CASES = [
    ("not-a-mapping", b"- just\n- a list\n", "(top level)", "expected a mapping"),
    ("empty", b"", "(top level)", "expected a mapping"),
    ("invalid-yaml", b"name: [unclosed\n", "line", "invalid YAML"),
    ("duplicate-key", b"name: a\nname: b\n", "line 2", "duplicate key 'name'"),
    ("not-utf8", b"name: \xff\xfe mla\n", "", "not UTF-8 text"),
    ("yaml-aliases", b"a: &a [1]\nb: &b [*a, *a]\nc: [*b, *b]\n", "line 1", "anchors (&name) are not allowed"),
]


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("MLAGEN_OUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv("MLAGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


def _timeout(signum, frame):
    raise TimeoutError(f"took more than {SECONDS} s")


def invoke(*args) -> tuple[int, str, float]:
    """Run the CLI in-process under an alarm; returns (exit code, output, seconds)."""
    old = signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(SECONDS)
    t0 = time.perf_counter()
    try:
        result = CliRunner().invoke(cli.cli, list(args), catch_exceptions=True)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        raise AssertionError("".join(traceback.format_exception(result.exception)))
    return result.exit_code, result.output, time.perf_counter() - t0


def one_error(code: int, output: str, seconds: float, *fragments: str) -> str:
    assert code not in (0, None), output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, output
    assert len(errors[0]) < 400, errors[0]
    for fragment in fragments:
        assert fragment in errors[0], f"{fragment!r} not in {errors[0]!r}"
    assert seconds < SECONDS
    return errors[0]


def write_spec(tmp_path: Path, mutate) -> Path:
    d = copy.deepcopy(BASE)
    mutate(d)
    p = tmp_path / f"{NAME}.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    return p


@pytest.mark.parametrize("command", ["variants", "build"])
@pytest.mark.parametrize("mutate, key, fragment", [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_broken_spec(tmp_path, command, mutate, key, fragment):
    p = write_spec(tmp_path, mutate)
    one_error(*invoke(command, str(p)), f"{p}: {key}: ", fragment)


@pytest.mark.parametrize("command", ["variants", "build"])
@pytest.mark.parametrize("content, key, fragment", [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_broken_spec_file(tmp_path, command, content, key, fragment):
    p = tmp_path / f"{NAME}.yaml"
    p.write_bytes(content)
    one_error(*invoke(command, str(p)), f"{p}: {key}" if key else f"{p}: ", fragment)


def test_the_corpus_is_large_enough():
    assert len(SPEC_CASES) + len(FILE_CASES) + len(ARG_CASES) >= 40


def _spec_dir(tmp_path):
    d = tmp_path / "specs.yaml"
    d.mkdir()
    return [str(d)]


def _random_bytes(tmp_path):
    p = tmp_path / "random.json"
    p.write_bytes(bytes(range(256)) * 4)
    return ["db", "--db", str(tmp_path / "t.sqlite"), "import", str(p)]


def _existing_export(tmp_path):
    p = tmp_path / "h100.json"
    p.write_text("precious")
    return ["db", "--db", str(tmp_path / "t.sqlite"), "export", str(p)]


def _bad_record(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{"format": "mlagen-tuning", "version": 1, "best": [{"family": "mla_prefill", "spec": '
                 '"mla_prefill_sm90", "problem": "causal/h128/q8192/k8192", "dtypes": "bf16", "device": "H100", '
                 '"sm_count": -1, "driver": "13.0", "nvrtc": "13.0", "source_hash": "x", "variant": {}, '
                 '"symbol": "s", "time_ms": 99.0}]}')
    return ["db", "--db", str(tmp_path / "t.sqlite"), "import", str(p)]


# (id, function of tmp_path giving the arguments, fragments the one error line must hold)
ARG_CASES = [
    ("spec-is-a-directory", lambda t: ["variants", *_spec_dir(t)], ["specs.yaml: ", "is a directory"]),
    ("spec-is-a-directory-build", lambda t: ["build", *_spec_dir(t)], ["specs.yaml: ", "is a directory"]),
    ("spec-missing", lambda t: ["build", str(t / "none.yaml")], ["none.yaml: ", "no such spec file"]),
    ("spec-unknown-name", lambda t: ["variants", "mla_prefill_sm70"], ["mla_prefill_sm70: ", "known:"]),
    ("limit-zero", lambda t: ["variants", "--limit", "0"], ["'--limit'", "0 is not in the range"]),
    ("jobs-zero", lambda t: ["build", "-j", "0"], ["'--jobs'", "0 is not in the range"]),
    ("max-variants-zero", lambda t: ["build", "--all", "--max-variants", "0"], ["'--max-variants'"]),
    ("arch-unknown", lambda t: ["build", "--arch", "sm_99"], ["--arch sm_99", "targets"]),
    ("arch-unknown-variants", lambda t: ["variants", NAME, "--arch", "sm_99"], ["--arch sm_99", "targets"]),
    ("arch-not-targeted", lambda t: ["build", "mla_prefill_sm90", "--arch", "sm_80"], ["--arch sm_80"]),
    ("variant-unknown-tunable", lambda t: ["build", NAME, "--variant", "block_q=64"], ["tune.block_q", "unknown"]),
    ("variant-bad-value", lambda t: ["build", NAME, "--variant", "block_n=48"], ["block_n", "48"]),
    ("variant-no-equals", lambda t: ["variants", NAME, "--variant", "block_n"], ["block_n", "expected name=value"]),
    ("all-too-large", lambda t: ["build", "mla_prefill_sm90", "--all"], ["--max-variants"]),
    ("db-import-random-bytes", _random_bytes, ["random.json: ", "not JSON"]),
    ("db-import-directory", lambda t: ["db", "--db", str(t / "t.sqlite"), "import", str(t)], ["'PATH'", "directory"]),
    ("db-import-missing", lambda t: ["db", "--db", str(t / "t.sqlite"), "import", str(t / "x.json")], ["no such file"]),
    ("db-import-bad-record", _bad_record, ["bad.json: ", "best[0].sm_count: -1 must be positive"]),
    ("db-export-over-a-file", _existing_export, ["h100.json: ", "already exists", "--force"]),
    ("db-on-a-directory", lambda t: ["db", "--db", str(t), "ls"], ["'--db'", "directory"]),
    ("bench-unknown-shape", lambda t: ["bench", "--shapes", "D9"], ["'D9'", "D1"]),
]


@pytest.mark.parametrize("args, fragments", [c[1:] for c in ARG_CASES], ids=[c[0] for c in ARG_CASES])
def test_bad_argument(tmp_path, args, fragments):
    one_error(*invoke(*args(tmp_path)), *fragments)


@pytest.mark.parametrize("command", [["bench"], ["bench", "--shapes", "D1"]])
def test_commands_that_need_torch_say_so(tmp_path, command):
    # The state after the README's first command: mlagen installed, torch not.
    code = ("import sys; sys.modules['torch'] = None\n"
            "from mlagen.cli import main; sys.argv = ['mlagen', *sys.argv[1:]]; main()")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={**os.environ, "MLAGEN_OUT_DIR": str(tmp_path / "out")})
    out = proc.stdout + proc.stderr
    one_error(proc.returncode, out, time.perf_counter() - t0, "mlagen bench needs PyTorch",
              "pip install torch", "download.pytorch.org/whl/cpu")
