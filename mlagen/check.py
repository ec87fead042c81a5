"""``mlagen check``: the regression check CI runs on a CPU-only machine.

Renders and compiles every spec's default variant (for every specialisation) and every shipped
tuning record, for every target of its spec, and compares what ptxas reports (registers, spill
and stack bytes) and the shared memory each kernel uses with the expectations committed in
``mlagen/expectations/nvrtc-<version>.json``. Register counts are a property of the compiler, so
there is one file per NVRTC version; an NVRTC with no file of its own is compared with the
nearest older one, and the report says so. ``--update`` writes the file of the local NVRTC.

``--gpu`` re-measures the shipped winners on the local GPU against the throughput their records
hold (checked against the reference first), within a tolerance.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from . import arch, db, families, resources, variant
from . import spec as spec_mod
from .build import BuildResult, build_many
from .backends.cuda import NvrtcCompiler
from .cache import atomic_write, check_build_dirs
from .errors import MlagenError

EXPECTATIONS_DIR = Path(__file__).resolve().parent / "expectations"
FORMAT = "mlagen-check"
FIELDS = ("status", "registers", "spill_bytes", "stack_bytes", "smem_bytes")
_FILE = re.compile(r"^nvrtc-(\d+)\.(\d+)\.json$")


class CheckError(MlagenError):
    """The check cannot run (no expectations to compare with, an unreadable file)."""


@dataclass
class Item:
    """One kernel the check builds: a variant for a target, and why it is checked."""

    spec: str
    target: str
    variant: variant.Variant
    why: list[str] = field(default_factory=list)  # "default", "shipped:h100.json causal/h128/q8192/k8192"

    @property
    def key(self) -> str:
        return f"{self.variant.symbol}@{self.target}"


def items(specs: list[str] | None = None, targets: list[str] | None = None) -> list[Item]:
    """Every spec default (per specialisation) and shipped record, for every target of its spec.

    CheckError for an unknown spec or target, and for a selection that names nothing to check
    (a target no selected spec has, or only AMD targets, which expectations do not cover)."""
    out: dict[str, Item] = {}
    loaded = [spec_mod.load(p) for p in spec_mod.available()]
    if specs:
        unknown = set(specs) - {s.name for s in loaded}
        if unknown:
            raise CheckError(f"--spec: unknown spec(s) {', '.join(sorted(unknown))}; known: "
                             f"{', '.join(s.name for s in loaded)}")
        loaded = [s for s in loaded if s.name in specs]
    if targets:
        unknown = [t for t in targets if t not in arch.TARGETS]
        if unknown:
            raise CheckError(f"--arch: unknown target(s) {', '.join(unknown)}; known: {', '.join(arch.TARGETS)}")
        for t in targets:
            if not any(t in s.targets for s in loaded):
                raise CheckError(f"--arch {t}: no selected spec targets it (the selected specs target "
                                 f"{', '.join(sorted({x for s in loaded for x in s.targets}))})")
    records = db.shipped_records()
    for s in loaded:
        family = families.get(s.family, s.path)
        for target in s.targets:
            if targets and target not in targets:
                continue
            t = arch.target(target)
            if t.vendor != "cuda":
                # Expectations are ptxas reports per NVRTC version; AMD kernels are checked by
                # `mlagen build --arch gfx942|gfx950 --all` (MFMA, scratch, budgets; .ci/run).
                continue
            axes = [k for k, _ in s.specialize]
            for combo in itertools.product(*(values for _, values in s.specialize)):
                v = resources.feasible_default(s, t, dict(zip(axes, combo))) or variant.make(s, dict(zip(axes, combo)))
                _add(out, Item(s.name, target, v), "default")
            for r in records:
                if r.key.spec != s.name:
                    continue
                v = variant.make(s, {**r.variant, **family.problem_specialization(r.key.problem)})
                _add(out, Item(s.name, target, v), f"{r.origin} {r.key.problem}")
    if not out:
        raise CheckError("nothing to check: the selection has no NVIDIA target (AMD kernels have no register "
                         "expectations; check them with `mlagen build --arch gfx942 --all`)")
    return sorted(out.values(), key=lambda i: (i.spec, i.target, i.variant.symbol))


def _add(out: dict, item: Item, why: str) -> None:
    out.setdefault(item.key, item).why.append(why)


def measure(result: BuildResult) -> dict:
    """The expectation record of one build."""
    if result.status != "ok":
        return {"status": result.status}
    rep, est = result.report, result.estimate
    return {"status": "ok", "registers": rep.registers, "spill_bytes": rep.spill_stores + rep.spill_loads,
            "stack_bytes": rep.stack_bytes, "smem_bytes": est.smem_bytes + rep.smem_static}


def expectation_files() -> dict[tuple[int, int], Path]:
    out = {}
    if EXPECTATIONS_DIR.is_dir():
        for p in EXPECTATIONS_DIR.iterdir():
            m = _FILE.match(p.name)
            if m:
                out[(int(m.group(1)), int(m.group(2)))] = p
    return out


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def choose_expectations(nvrtc: str, files: dict[tuple[int, int], Path] | None = None) -> tuple[Path, str]:
    """The expectations file for NVRTC ``nvrtc`` and a note (empty for an exact match)."""
    files = expectation_files() if files is None else files
    want = _version(nvrtc)
    if want in files:
        return files[want], ""
    older = [v for v in files if v < want]
    if not older:
        have = ", ".join(f"{a}.{b}" for a, b in sorted(files)) or "none"
        raise CheckError(f"no expectations for NVRTC {nvrtc} or older (have: {have}); run `mlagen check --update` "
                         f"with NVRTC {nvrtc} and commit {EXPECTATIONS_DIR.name}/nvrtc-{nvrtc}.json")
    best = max(older)
    return files[best], (f"no expectations for NVRTC {nvrtc}; comparing with NVRTC {best[0]}.{best[1]}, "
                         "the nearest older version (differences may be the compiler's)")


def read_expectations(path: Path) -> dict[str, dict]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckError(f"{path}: unreadable expectations: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("kernels"), dict):
        raise CheckError(f"{path}: not an mlagen check file (expected \"format\": \"{FORMAT}\" and \"kernels\")")
    return doc["kernels"]


def write_expectations(path: Path, nvrtc: str, measured: dict[str, dict]) -> None:
    doc = {"format": FORMAT, "nvrtc": nvrtc, "kernels": dict(sorted(measured.items()))}
    atomic_write(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())


@dataclass
class Outcome:
    """One kernel's result: what was measured, what was expected, and the differences."""

    item: Item | None
    key: str
    measured: dict | None
    expected: dict | None
    problems: list[str]
    detail: str = ""  # a compile error's log

    @property
    def ok(self) -> bool:
        return not self.problems


def compare(measured: dict[str, dict], expected: dict[str, dict], by_key: dict[str, Item],
            details: dict[str, str] | None = None, scope: set[str] | None = None) -> list[Outcome]:
    """One outcome per kernel built, plus one per expected kernel no longer built (within
    ``scope``: the expectation keys the run could have produced)."""
    details = details or {}
    out = []
    for key, got in measured.items():
        want = expected.get(key)
        problems = []
        if want is None:
            problems.append("no expectation recorded (a new kernel? run `mlagen check --update`)")
        else:
            for f in FIELDS:
                if got.get(f) != want.get(f):
                    problems.append(f"{f}: expected {want.get(f)}, got {got.get(f)}")
        if got.get("status") == "compile_error" and not problems:
            problems.append("does not compile")
        out.append(Outcome(by_key.get(key), key, got, want, problems, details.get(key, "")))
    for key in sorted(set(expected) - set(measured)):
        if scope is None or key in scope:
            out.append(Outcome(None, key, None, expected[key], ["expected but no longer built (stale expectation? "
                                                                "run `mlagen check --update`)"]))
    return out


def spec_of(symbol: str, names) -> str | None:
    """The spec a kernel symbol belongs to: the longest of ``names`` it starts with (followed by
    "_"), so mla_prefill_sm90_fp8_... belongs to mla_prefill_sm90_fp8, not mla_prefill_sm90."""
    matches = [n for n in names if symbol.startswith(n + "_")]
    return max(matches, key=len) if matches else None


def _in_scope(key: str, specs: list[str] | None, targets: list[str] | None, names=None) -> bool:
    symbol, _, target = key.rpartition("@")
    if targets and target not in targets:
        return False
    if not specs:
        return True
    names = set(specs) | set(names if names is not None else (p.stem for p in spec_mod.available()))
    return spec_of(symbol, names) in specs


@dataclass
class Report:
    nvrtc: str
    expectations: Path
    note: str
    outcomes: list[Outcome]
    updated: bool = False

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)


def run(specs: list[str] | None = None, targets: list[str] | None = None, update: bool = False,
        expectations: Path | None = None, jobs: int | None = None, progress=None) -> Report:
    """Build every item and compare it with the expectations (or write them with ``update``)."""
    nvrtc = NvrtcCompiler().version()
    todo = items(specs, targets)
    check_build_dirs()  # a cache that cannot be written is one error, not a compile_error per kernel
    by_key = {i.key: i for i in todo}
    measured, details = {}, {}
    for t in sorted({i.target for i in todo}):
        group = [i for i in todo if i.target == t]
        for item, result in zip(group, build_many([i.variant for i in group], [t], jobs=jobs)):
            measured[item.key] = measure(result)
            if result.status == "compile_error":
                details[item.key] = result.reasons[0] if result.reasons else ""
            if progress:
                progress(item, measured[item.key])
    if update:
        path = expectations or EXPECTATIONS_DIR / f"nvrtc-{nvrtc}.json"
        return _update(path, nvrtc, measured, by_key, details, specs, targets)
    if expectations is not None:
        path, note = expectations, ""
    else:
        path, note = choose_expectations(nvrtc)
    expected = read_expectations(path)
    names = [p.stem for p in spec_mod.available()]
    scope = {k for k in expected if _in_scope(k, specs, targets, names)}
    return Report(nvrtc, path, note, compare(measured, expected, by_key, details, scope))


def _update(path: Path, nvrtc: str, measured: dict, by_key: dict, details: dict, specs, targets) -> Report:
    """Write the expectations of this run. Only a kernel that compiled sets its expectation: one
    that failed to compile keeps its old expectation (or gets none) and fails the report, and
    stale expectations (kernels no longer built) are removed only by a run in which every kernel
    compiled, so a broken compiler or cache can never turn expectations into compile errors or
    delete them. Expectations outside the run's specs and targets are kept."""
    old = read_expectations(path) if path.exists() else {}
    failed = {k for k, m in measured.items() if m.get("status") == "compile_error"}
    names = [p.stem for p in spec_mod.available()]
    written = {k: v for k, v in old.items()
               if not _in_scope(k, specs, targets, names) or (failed and k not in measured) or k in failed}
    written.update({k: m for k, m in measured.items() if k not in failed})
    write_expectations(path, nvrtc, written)
    outcomes = compare({k: m for k, m in measured.items() if k not in failed}, written, by_key, details, set())
    for k in sorted(failed):
        note = "expectation kept" if k in old else "no expectation written"
        outcomes.append(Outcome(by_key.get(k), k, measured[k], old.get(k),
                                [f"does not compile; {note} (only a kernel that compiles sets its expectation)"],
                                details.get(k, "")))
    return Report(nvrtc, path, "", outcomes, updated=True)


def junit_xml(report: Report, name: str = "mlagen check") -> str:
    """The report as JUnit XML: one test case per kernel, a failure element per broken one."""
    suite = ElementTree.Element("testsuite", name=name, tests=str(len(report.outcomes)),
                                failures=str(sum(not o.ok for o in report.outcomes)), errors="0")
    props = ElementTree.SubElement(suite, "properties")
    for k, v in (("nvrtc", report.nvrtc), ("expectations", str(report.expectations)), ("note", report.note)):
        ElementTree.SubElement(props, "property", name=k, value=v)
    for o in report.outcomes:
        spec = o.item.spec if o.item else o.key.rpartition("@")[0]
        case = ElementTree.SubElement(suite, "testcase", classname=f"mlagen.check.{spec}", name=o.key)
        if not o.ok:
            fail = ElementTree.SubElement(case, "failure", message="; ".join(o.problems))
            fail.text = "\n".join(o.problems + ([o.detail] if o.detail else []))
        elif o.item:
            ElementTree.SubElement(case, "system-out").text = "checked as " + ", ".join(o.item.why)
    root = ElementTree.Element("testsuites")
    root.append(suite)
    return ElementTree.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(path: Path | str, report: Report) -> None:
    atomic_write(Path(path), junit_xml(report).encode())


def format_report(report: Report) -> str:
    lines = [f"NVRTC {report.nvrtc}; expectations {report.expectations}"]
    if report.note:
        lines.append(f"note: {report.note}")
    bad = [o for o in report.outcomes if not o.ok]
    lines.append(f"{len(report.outcomes) - len(bad)} of {len(report.outcomes)} kernels as expected"
                 + (" (expectations written)" if report.updated else ""))
    for o in bad:
        why = f" [{', '.join(o.item.why)}]" if o.item else ""
        lines.append(f"FAIL {o.key}{why}")
        lines.extend(f"  {p}" for p in o.problems)
        if o.detail:
            lines.append("  " + o.detail.splitlines()[0][:300])
    return "\n".join(lines)


# --- on the GPU: the shipped winners still run as fast as their records say -------------------


@dataclass
class Speed:
    record: db.Best
    shape: str
    tflops: float | None
    problem: str | None  # None when it passes; else why not
    other_device: bool = False  # the record was made on another device of this GPU's architecture

    @property
    def ok(self) -> bool:
        return self.problem is None


def _covers(family, problem: str, shape) -> bool:
    """Whether a record of ``problem`` in ``family`` serves ``shape`` (False for another family's shape)."""
    try:
        return family.problem_covers(problem, shape)
    except (AttributeError, TypeError, ValueError):
        return False


def records_in_use(info) -> list[tuple[db.Best, bool]]:
    """The shipped records dispatch uses on the device ``info`` describes, each with whether it
    was made on another device: the device's own records, and where it has none for a spec,
    shape class and dtypes, those of other devices of its architecture (the H100 records on an
    H200), as :func:`mlagen.db.candidates` ranks them."""
    from .dispatch import record_target

    if info.target is None:
        return []
    out, own = [], set()
    records = [r for r in db.shipped_records()
               if info.target.name in spec_mod.load(r.key.spec).targets]
    for r in records:
        if r.key.device == info.name:
            out.append((r, False))
            own.add((r.key.spec, r.key.problem, r.key.dtypes))
    for r in records:
        if r.key.device != info.name and (r.key.spec, r.key.problem, r.key.dtypes) not in own \
                and record_target(spec_mod.load(r.key.spec), r.key.device) == info.target.name:
            out.append((r, True))
    return out


def measure_shipped(tolerance: float = 0.10, iters: int = 30, seed: int = 0, shapes=None, device=None, info=None,
                    timer=None) -> list[Speed]:
    """Time every shipped winner dispatch uses on this GPU (:func:`records_in_use`) on the BENCHMARKS.md shapes of its shape
    class (the family's ``check_shapes``), after checking it against the reference; a winner
    slower than its recorded TFLOP/s by more than ``tolerance`` (a fraction) in three timings fails. ``timer(fn) -> seconds`` defaults to the
    benchmark's: the median of ``iters`` calls timed by CUDA events, L2 flushed before each."""
    import torch

    from . import measure
    from .runtime import device_info

    if device is None:
        if not torch.cuda.is_available():
            from .errors import NoDeviceError

            raise NoDeviceError(f"check --gpu needs a CUDA GPU; this PyTorch ({torch.__version__}) sees none")
        device = torch.device("cuda", torch.cuda.current_device())
    info = device_info(device.index) if info is None else info
    if timer is None:
        flush = measure.L2Flush(device)

        def timer(fn):
            return measure.median(measure.time_calls(fn, iters, flush))

    out = []
    for r, other in records_in_use(info):
        spec = spec_mod.load(r.key.spec)
        family = families.get(spec.family, spec.path)
        # The record's family's BENCHMARKS.md shapes of its class (D1-D7 for dense records; the
        # family's check_shapes) unless shapes are given.
        if shapes is None:
            matching = family.check_shapes(r.key.problem)
        else:
            matching = [s for s in shapes if _covers(family, r.key.problem, s)]
        if not matching:
            out.append(Speed(r, "", None, f"no benchmark shape of class {r.key.problem} to time it on", other))
            continue
        v = variant.make(spec, {**r.variant, **family.problem_specialization(r.key.problem)})
        # A record of quantized inputs (the dense FP8 spec's) is timed on inputs of its dtypes.
        dtype = {} if r.key.dtypes == "bf16" else {"dtype": r.key.dtypes}
        for shape in matching:
            inputs = family.make_inputs(shape, device, seed, **dtype)
            got = family.call(inputs, variant=v, check=True)
            check = family.compare(got, family.reference(shape, inputs, heads=2), **dtype)
            if not check.ok:
                out.append(Speed(r, shape.id, None, f"wrong result: {check.problem}", other))
                continue
            outputs = family.call(inputs, variant=v)

            def call():
                family.call(inputs, variant=v, outputs=outputs)

            for _ in range(3):
                call()
            # A winner below its floor is timed again, up to three times in all, and judged by its
            # best timing: clocks and the power cap move a single median by 10% from run to run
            # (D5 754 then 688 TFLOP/s in two runs minutes apart on the H100), a regression does not.
            floor = (r.tflops or 0) * (1 - tolerance)
            seconds = timer(call)
            for _ in range(2):
                if family.flops(shape) / seconds / 1e12 >= floor:
                    break
                seconds = min(seconds, timer(call))
            tflops = family.flops(shape) / seconds / 1e12
            problem = None if tflops >= floor else (f"{tflops:.0f} TFLOP/s is below the recorded {r.tflops:.0f} "
                                                    f"less {tolerance:.0%} ({floor:.0f})")
            out.append(Speed(r, shape.id, tflops, problem, other))
    return out
