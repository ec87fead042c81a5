"""The ``mlagen`` command line: a thin click group over the library.

User mistakes (bad spec, unknown tunable, missing GPU, unreadable database) print one line and
exit non-zero; they never show a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import __version__, knobs
from .cli_common import _friendly, table
from .errors import MlagenError

NOTE_WIDTH = 160  # characters of a pruning reason shown per table row
MAX_VARIANT_ROWS = 2000  # `variants --limit`: more rows than anyone reads, checked in about a second


class _Finite(click.ParamType):
    """A finite number greater than ``low`` (click's FloatRange lets nan and inf through)."""

    name = "number"

    def __init__(self, low: float = 0.0, inclusive: bool = False):
        self.low, self.inclusive = low, inclusive

    def convert(self, value, param, ctx):
        import math

        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < self.low or (number == self.low and not self.inclusive):
            self.fail(f"{value!r}: expected a finite number {'>=' if self.inclusive else '>'} {self.low:g}", param, ctx)
        return number


POSITIVE = _Finite()


def known_target(name: str | None, option: str = "--arch") -> str | None:
    """``name`` if it is a target mlagen knows (None passes), else a ClickException listing them."""
    from . import arch

    if name is not None and name not in arch.TARGETS:
        raise click.ClickException(f"{option} {name}: unknown target; known targets: {', '.join(arch.TARGETS)}")
    return name


def default_spec_name(target: str | None = None) -> str:
    """The dispatcher's first choice in the first family (by name) with a packaged spec targeting
    ``target`` (any target if None): that family's highest-priority spec; ties go to the first by
    name. Priorities rank the specs of one family, so they are not compared across families."""
    from . import spec as spec_mod

    specs = [spec_mod.load(p) for p in spec_mod.available()]
    specs = [s for s in specs if target is None or target in s.targets]
    if not specs:
        known = sorted({t for p in spec_mod.available() for t in spec_mod.load(p).targets})
        raise click.ClickException(f"--arch {target}: no spec targets it; targets: {', '.join(known)}")
    family = min(s.family for s in specs)
    return min((s for s in specs if s.family == family), key=lambda s: (-s.priority, s.name)).name


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mlagen")
@click.pass_context
@_friendly
def cli(ctx):
    """Generate, compile, tune and benchmark MLA prefill kernels."""
    import logging

    try:
        level = knobs.log_level()
    except ValueError:
        if ctx.invoked_subcommand != "info":  # info reports the bad value instead
            raise
        level = "WARNING"
    logging.basicConfig(format="mlagen: %(message)s", level=level)


@cli.command("specs")
@_friendly
def specs_cmd():
    """List the packaged kernel specs, and which of their targets were executed or only compiled."""
    from . import arch
    from . import spec as spec_mod
    from .variant import space_size

    rows = []
    for p in spec_mod.available():
        s = spec_mod.load(p)
        ran = [t for t in s.targets if arch.TARGETS[t].executed]
        rows.append([s.name, s.family, s.abi, s.priority, ",".join(s.targets), space_size(s), p.name,
                     ",".join(ran) or "none (compiled only)"])
    click.echo(table(["spec", "family", "abi", "priority", "targets", "variants", "file", "executed"], rows))
    click.echo("\nexecuted: kernels for the target ran (GPU tests, benchmarks); other targets are compiled and "
               "checked only (no AMD GPU has run the gfx942/gfx950 kernels).")


@cli.command("build")
@click.argument("spec", required=False)
@click.option("--arch", "archs", multiple=True, help="Target (repeatable), e.g. sm_90a; default: the spec's first.")
@click.option("--variant", "assignments", multiple=True, metavar="NAME=VALUE[,..]",
              help="Fix tunables (repeatable); others take their defaults, or vary with --all.")
@click.option("--all", "all_variants", is_flag=True,
              help="Build the whole search space (pruned variants are listed); at most --max-variants.")
@click.option("--max-variants", default=2000, show_default=True, type=click.IntRange(min=1),
              help="Refuse --all on a larger space.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Parallel compile processes (default: CPU count).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Where CUBINs go (default: <out>/build).")
@click.option("--progress/--no-progress", "show_bar", default=None,
              help="Progress bar on stderr (default: only on a terminal; a line per variant otherwise).")
@_friendly
def build_cmd(spec, archs, assignments, all_variants, max_variants, jobs, out_dir, show_bar):
    """Render and compile SPEC (default: the dispatcher's first choice; with --arch, every spec
    that targets it) into out/; needs no GPU.

    Without --all, builds the default variant (with --variant overrides) for every
    specialisation (e.g. causal and non-causal), and prints the resource table.
    """
    from . import spec as spec_mod
    from .build import build_many
    from .cache import check_build_dirs, usable_dir

    for t in archs:
        known_target(t)
    if spec is None and archs:
        # No spec but targets: every packaged spec that targets them (for gfx950, the bf16 and the
        # FP8 kernels), highest priority first.
        for t in archs:
            default_spec_name(t)  # a target no spec has is an error naming the known ones
        specs = sorted((x for x in (spec_mod.load(p) for p in spec_mod.available())
                        if all(t in x.targets for t in archs)), key=lambda x: (-x.priority, x.name))
        if not specs:
            raise click.ClickException(f"--arch {', '.join(archs)}: no spec targets all of them")
    else:
        specs = [spec_mod.load(spec or default_spec_name(None))]
    targets = list(archs) or [specs[0].targets[0]]
    variants = []
    for s in specs:
        variants += _build_variants(s, targets, assignments, all_variants, max_variants)
    out = Path(out_dir).expanduser() if out_dir else knobs.out_dir() / "build"
    # An unusable cache or output directory is one line here, not an error per variant.
    check_build_dirs()
    usable_dir(out, "--out" if out_dir else f"where CUBINs go (<${knobs.OUT_DIR.name}>/build)")
    click.echo(f"building {len(variants)} variant(s) of {', '.join(x.name for x in specs)} for {', '.join(targets)} "
               f"-> {out}", err=True)

    from .progress import Progress

    bar = Progress(enabled=show_bar)
    bar.start(len(variants) * len(targets), "build")

    def progress(r, done, total):
        if bar.enabled:
            bar.update(note=f"{r.status} {r.variant.symbol}")
        else:
            # A kernel rejected after compiling (it spills) says why at once; model prunes are in the table.
            why = f": {r.reasons[0].split(':')[0]}" if r.status == "pruned" and r.binary is not None else ""
            click.echo(f"[{done}/{total}] {r.status:13s} {r.variant.symbol} ({r.target}, {r.seconds:.1f}s){why}",
                       err=True)

    results = build_many(variants, targets, jobs=jobs, out_dir=out, progress=progress)
    bar.finish()

    from . import arch

    if any(arch.target(t).vendor == "hip" for t in targets):
        _amd_report(results)
    rows = []
    for r in results:
        rep, est = r.report, r.estimate
        rows.append([r.variant.symbol, r.target, r.status, est.threads if est else "",
                     f"{est.smem_bytes / 1024:.1f}" if est else "", est.registers if est else "",
                     rep.registers if rep else "", (rep.spill_stores + rep.spill_loads) if rep else "",
                     rep.stack_bytes if rep else "", _note((*r.reasons, *(rep.warnings if rep else ())))])
    click.echo(table(["variant", "target", "status", "threads", "smem KB", "regs est", "regs", "spill B",
                      "stack B", "note"], rows))
    click.echo(arch.describe_coverage(targets))
    failed = [r for r in results if r.status == "compile_error"]
    for r in failed:
        click.echo(f"\n{r.variant.symbol} ({r.target}):\n{r.reasons[0]}", err=True)
    if failed or not any(r.ok for r in results) or _amd_problems:
        sys.exit(1)


_amd_problems: list[str] = []


def _amd_report(results) -> None:
    """AMD code objects: VGPR/AGPR/SGPR, LDS, scratch and occupancy from their metadata, the MFMA
    forms in their disassembly, and the checks (MFMA present, no scratch, within budget)."""
    from . import arch
    from .backends import hip

    rows = []
    for r in results:
        if not r.ok or arch.target(r.target).vendor != "hip":
            continue
        rep = r.report
        try:
            dis = hip.disassemble(r.binary.data)
            mfma = hip.mfma_instructions(dis)
            problems = hip.check_code_object(r.binary.data, r.binary.symbol, r.target, ("v_mfma",), dis)
        except MlagenError as exc:
            mfma, problems = {}, [f"not checked: {exc}"]
        _amd_problems.extend(f"{r.variant.symbol} ({r.target}): {p}" for p in problems if not p.startswith("not checked"))
        rows.append([r.variant.symbol, r.target, rep.registers, rep.agprs, rep.sgprs, f"{rep.smem_static / 1024:.1f}",
                     rep.stack_bytes, rep.occupancy,
                     ", ".join(f"{k} x{v}" for k, v in sorted(mfma.items())) or "-", "; ".join(problems) or "ok"])
    if rows:
        click.echo(table(["variant", "target", "vgpr", "agpr", "sgpr", "lds KB", "scratch B", "waves/SIMD",
                          "mfma", "check"], rows))
        click.echo()


FEASIBLE_SEARCH = 400  # variants `build` tries per specialisation for one that fits


def _build_variants(s, targets, assignments, all_variants, max_variants) -> list:
    """The variants of spec ``s`` that ``mlagen build`` compiles (see its help)."""
    from . import arch, resources
    from . import variant as variant_mod

    for t in targets:
        if t not in s.targets:
            raise click.ClickException(f"--arch {t}: {s.name} targets {', '.join(s.targets)}")
    fixed = variant_mod.parse_assignments(s, list(assignments))
    if all_variants:
        size = variant_mod.space_size(s, fixed)
        if size > max_variants:
            raise click.ClickException(f"--all would build {size} variants of {s.name} (more than --max-variants "
                                       f"{max_variants}); fix some tunables with --variant NAME=VALUE")
        return list(variant_mod.enumerate_space(s, fixed))
    axes = dict(s.specialize)
    base = variant_mod.make(s, fixed)
    out, unserved = [], []
    for combo in _product([[fixed[k]] if k in fixed else list(vals) for k, vals in axes.items()]):
        v = base.with_values(**dict(zip(axes, combo)))
        # The spec's default where it fits the first target, else the nearest variant that does
        # (changing only tunables the user left free), as `mlagen check` builds; a specialisation
        # no variant can serve (an FP8 row format of another head dimension) is left out.
        found = resources.nearest_feasible(v, arch.target(targets[0]), keep=fixed, limit=FEASIBLE_SEARCH)
        if found is None and not fixed:
            unserved.append(" ".join(f"{k}={x}" for k, x in zip(axes, combo)))
            continue
        out.append(found or v)
    if unserved:
        click.echo(f"{s.name}: no variant serves {'; '.join(unserved)} on {targets[0]}: not built", err=True)
    if not out:
        raise click.ClickException(f"{s.name}: no variant of any specialisation fits {targets[0]}")
    return out


def _note(reasons) -> str:
    """Reasons for a table cell: each once, in order, cut to one readable line."""
    text = "; ".join(dict.fromkeys(r.splitlines()[0] for r in reasons if r))
    return text if len(text) <= NOTE_WIDTH else text[:NOTE_WIDTH - 3] + "..."


def _product(lists):
    import itertools

    return itertools.product(*lists)


@cli.command("variants")
@click.argument("spec", required=False)
@click.option("--arch", default=None, help="Target to check budgets against (default: the spec's first).")
@click.option("--variant", "assignments", multiple=True, metavar="NAME=VALUE[,..]", help="Fix tunables.")
@click.option("--limit", default=500, show_default=True, type=click.IntRange(min=1, max=MAX_VARIANT_ROWS),
              help="Larger spaces are shown as a seeded random sample of this many variants.")
@_friendly
def variants_cmd(spec, arch, assignments, limit):
    """Enumerate SPEC's search space and show what the resource model prunes, and why."""
    from . import arch as arch_mod
    from . import resources
    from . import spec as spec_mod
    from . import variant as variant_mod

    s = spec_mod.load(spec or default_spec_name(known_target(arch)))
    if arch is not None and arch not in s.targets:
        raise click.ClickException(f"--arch {arch}: {s.name} targets {', '.join(s.targets)}")
    target = arch_mod.target(arch or s.targets[0])
    fixed = variant_mod.parse_assignments(s, list(assignments))
    size = variant_mod.space_size(s, fixed)
    if size > limit:
        click.echo(f"{s.name}: {size} variants; showing a random sample of {limit} (fix tunables with --variant)",
                   err=True)
    rows, kept = [], 0
    for v in variant_mod.sample_space(s, limit, fixed):
        verdict = resources.check(v, target)
        kept += verdict.ok
        est = verdict.resources
        rows.append([v.symbol, "ok" if verdict.ok else "pruned", est.threads if est else "",
                     f"{est.smem_bytes / 1024:.1f}" if est else "", est.registers if est else "",
                     _note(verdict.reasons)])
    click.echo(table(["variant", "verdict", "threads", "smem KB", "regs est", "reason"], rows))
    click.echo(f"{kept} of {len(rows)} variants fit {target.name}", err=True)


from .cli_db import db_cmd  # noqa: E402  (the db group lives in its own module)

cli.add_command(db_cmd)


@cli.command("tune")
@click.argument("spec", required=False)
@click.option("--shape", "shapes", multiple=True, metavar="SHAPE",
              help="Shape to tune for (repeatable), read by the spec's family: an id of BENCHMARKS.md (D1..D7 dense, "
                   "S1..S6 sparse) or a description such as b=4,q=4096,k=4096,h=16,causal (q=[l1,l2,...] for ragged "
                   "lengths; k defaults to q) or sq=4096,h=128,topk=2048,skv=8192[,d=576][,sink=1].")
@click.option("--workload", "workload", type=click.Path(dir_okay=False), default=None,
              help="YAML file of weighted shapes (e.g. written by MLAGEN_RECORD_SHAPES); each shape class is "
                   "tuned, heaviest first, and --budget is split by weight.")
@click.option("--strategy", type=click.Choice(["auto", "global", "exhaustive", "coordinate"]), default="auto",
              show_default=True,
              help="auto: exhaustive if the space fits --max-trials, else global (random samples, successive "
                   "halving, coordinate descent from the survivors).")
@click.option("--max-trials", default=200, show_default=True, type=click.IntRange(min=1),
              help="Most variants tried per shape class.")
@click.option("--budget", "budget_min", type=POSITIVE, default=None, metavar="MINUTES",
              help="Wall time for the whole tune; the search stops and the finalists are re-timed when it is spent.")
@click.option("--resume", is_flag=True,
              help="Reuse the trials the database holds for the same record key and variant instead of running "
                   "them again (continues an interrupted tune).")
@click.option("--seed", default=0, show_default=True, help="Seed of the random samples and of the inputs.")
@click.option("--devices", "devices", default=None, metavar="0,1,...",
              help="GPUs that measure (one worker each); default: every visible GPU of the kind of GPU 0.")
@click.option("--fixed", "assignments", multiple=True, metavar="NAME=VALUE[,..]",
              help="Hold tunables fixed; a kernel symbol (as tables and records print it) fixes all of its "
                   "tunables, so the tune measures and records that one variant.")
@click.option("--timeout", "timeout_s", default=60.0, show_default=True, type=POSITIVE,
              help="Seconds a GPU trial may take before it is recorded as a hang and its worker killed.")
@click.option("--iters", default=20, show_default=True, type=click.IntRange(min=1),
              help="Timed calls per trial (median); with several GPUs, equal shares on each (the mean of their medians).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Parallel compile processes (default: CPU count).")
@click.option("--db", "db_path", type=click.Path(dir_okay=False), default=None,
              help=f"Tuning database (default: ${knobs.TUNING_DB.name} or <out>/tuning.sqlite).")
@click.option("--arch", "target", default=None, help="Target to build for (default: the GPU's).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1),
              help="Rows of the results table per shape.")
@click.option("--progress/--no-progress", "show_bar", default=None,
              help="Progress bar on stderr (default: only on a terminal; plain lines otherwise).")
@click.option("--scheduler", default=None, metavar="tcp://HOST:8786",
              help="Tune on this Dask cluster (pip install 'mlagen[cluster]'): compiles on any worker, "
                   "measurements on the workers started with --resources \"GPU=1\" (docs/cluster.md).")
@click.option("--device-kind", "device_kind", default=None, metavar="NAME",
              help="With --scheduler: tune only on the GPUs whose name (or target) matches; default: every kind.")
@click.option("--measure-ahead/--no-measure-ahead", "measure_ahead", default=True, show_default=True,
              help="While every GPU waits for a batch's compiles, measure a compiled guess of the search's next "
                   "batches (the trials are the same either way; off: the GPUs wait).")
@_friendly
def tune_cmd(spec, shapes, workload, strategy, max_trials, budget_min, resume, seed, devices, assignments,
             timeout_s, iters, jobs, db_path, target, top, show_bar, scheduler, device_kind, measure_ahead):
    """Search SPEC's variants per shape class on this GPU; record every trial and the winner.

    Every variant is checked against the reference before it is timed; compile errors, wrong
    results, crashes and hangs are recorded as trial outcomes and never selected.
    """
    from . import spec as spec_mod
    from . import variant as variant_mod
    from .progress import Progress
    from .shapes import load_workload, parse_shapes
    from .tune import TuneConfig, parse_devices, tune

    if not shapes and not workload:
        raise click.ClickException("give --shape SHAPE (repeatable) or --workload FILE")
    known_target(target)
    if spec is None:
        s, items = _spec_for_shapes(shapes, workload, target)
    else:
        s = spec_mod.load(spec)
        # The spec's family reads the shapes (an id like D1 is its BENCHMARKS.md shape).
        items = [x for text in shapes for x in parse_shapes(text, s)] + (load_workload(workload, s) if workload else [])
    fixed = variant_mod.parse_assignments(s, list(assignments))
    variant_mod.make(s, fixed)  # names and values checked before any GPU work
    config = TuneConfig(spec=s.path, shapes=tuple(items), strategy=strategy, max_trials=max_trials, fixed=fixed,
                        timeout_s=timeout_s, iters=iters, jobs=jobs, db_path=db_path, target=target, seed=seed,
                        budget_s=budget_min * 60 if budget_min else None, resume=resume,
                        devices=parse_devices(devices) if devices else None, measure_ahead=measure_ahead)
    bar = Progress(enabled=show_bar)
    # With the bar on, trial lines would scroll it away: only the stage lines are printed.
    log = (lambda line: None if line.startswith("  [") else bar.message(line)) if bar.enabled else \
        (lambda line: click.echo(line, err=True))
    if scheduler is None:
        if device_kind is not None:
            raise click.ClickException("--device-kind: only with --scheduler (locally --devices picks the GPUs)")
        results = tune(config, progress=log, bar=bar)
        click.echo(format_tune_results(results, top))
        return
    if devices:
        raise click.ClickException("--devices: not with --scheduler (the cluster's GPU workers measure)")
    from .tune import cluster

    results = cluster.tune(config, scheduler, device_kind, progress=log, bar=bar)
    click.echo(format_tune_results(results, top))
    click.echo("\n" + cluster.summary(results))


def _spec_for_shapes(shapes, workload, target):
    """With no SPEC: the family that reads the shapes (every family is asked; ``sq=..,topk=..``
    can only be sparse), and its highest-priority spec that targets ``target`` (if given) and
    serves every shape; the shapes as that family read them."""
    from . import families
    from . import spec as spec_mod
    from .shapes import WorkloadItem, load_workload, parse_shapes

    items = [x for text in shapes for x in parse_shapes(text)] + (load_workload(workload) if workload else [])
    shape_of = [x.shape if isinstance(x, WorkloadItem) else x for x in items]
    names = {f for f in families.names() if all(_reads(families.get(f), sh) for sh in shape_of)}
    if len(names) != 1:
        raise click.ClickException("the shapes are of " + (f"several families ({', '.join(sorted(names))})" if names
                                   else "different families") + "; give a SPEC")
    family = families.get(names.pop())
    specs = sorted((x for x in (spec_mod.load(p) for p in spec_mod.available())
                    if x.family == family.name and (target is None or target in x.targets)),
                   key=lambda x: (-x.priority, x.name))
    for candidate in specs:
        fam = families.get(candidate.family, candidate.path)
        if not any(fam.refuses(candidate, sh) for sh in shape_of):
            return candidate, [x for text in shapes for x in parse_shapes(text, candidate)] + (
                load_workload(workload, candidate) if workload else [])
    raise click.ClickException(f"no {family.name} spec{f' for {target}' if target else ''} serves "
                               f"{', '.join(getattr(sh, 'id', str(sh)) for sh in shape_of)}; give a SPEC")


def _reads(family, shape) -> bool:
    """Whether ``shape`` is one of ``family``'s (its class can be computed)."""
    try:
        family.problem_key(shape)
    except (AttributeError, TypeError, ValueError):
        return False
    return True


def format_tune_results(results, top: int) -> str:
    """The summary: per shape class the outcome counts, the fastest trials, the final re-timing."""
    import collections

    lines = []
    for r in results:
        counts = collections.Counter(t.outcome for t in r.trials)
        resumed = sum(t.resumed for t in r.trials)
        lines.append(f"\n{r.shape} ({r.problem}, weight {r.weight:g}), run {r.run_id}: {len(r.trials)} trials "
                     f"in {r.seconds:.0f} s" + (f" ({resumed} resumed)" if resumed else "")
                     + (" [stopped: budget spent]" if r.stopped else "") + ": "
                     + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        ok = sorted((t for t in r.trials if t.outcome == "ok"), key=lambda t: t.time_ms)
        rows = [[i + 1, t.variant.symbol, f"{t.time_ms:.3f}", f"{t.tflops:.1f}", f"{t.max_error:.1e}",
                 t.registers, t.spills] for i, t in enumerate(ok[:top])]
        if rows:
            lines.append(table(["rank", "variant", "ms", "TFLOP/s", "rel err", "regs", "spill B"], rows))
        if r.finals:
            lines.append("final re-timing (median of rounds, ms): " + ", ".join(
                f"{f.variant.symbol} {f.median_ms:.3f}" for f in sorted(r.finals, key=lambda f: f.median_ms)))
        if r.best and r.default and r.default.outcome == "ok":
            final = {f.variant: f.median_ms for f in r.finals}
            base = final.get(r.default.variant, r.default.time_ms)
            lines.append(f"winner {r.best.variant.symbol}: {base / r.best.time_ms:.2f}x the spec default")
        elif r.best is None:
            lines.append("no variant passed; nothing recorded as winner")
        elif r.best:
            lines.append(f"winner {r.best.variant.symbol}")
        if r.kept:
            lines.append(f"kept the record in use, {r.in_use}: no variant was faster beyond the noise; "
                         "nothing recorded")
        elif r.in_use and r.best:
            final = {f.variant: f.median_ms for f in r.finals}
            before = next((ms for v, ms in final.items() if r.in_use.startswith(v.symbol + " ")), None)
            lines.append(f"replaces the record in use, {r.in_use}"
                         + (f": {before / r.best.time_ms:.2f}x its time" if before else ""))
    return "\n".join(lines)


@cli.command("bench")
@click.option("--shape", "shape_texts", multiple=True, metavar="SHAPE",
              help="Shape (repeatable): an id of BENCHMARKS.md (D1..D11 dense, S1..S6 sparse) or a description "
                   "such as b=4,q=4096,h=16,causal or sq=4096,h=128,topk=2048,skv=8192; its family picks the peers.")
@click.option("--shapes", default=None,
              help="Comma-separated ids (D1,S1), a family's name (its shapes), or all (every family's); "
                   "default: all, unless --shape is given.")
@click.option("--peers", default=None,
              help="Peers, comma-separated; a shape runs those its family has. Dense: fa3 (FlashAttention-3, if "
                   "built), cudnn, fa2, mlagen (the public call), mlagen-check (check_seqlens=True). Sparse: flashmla "
                   "(if built), naive (PyTorch gather + matmul), mlagen. mlagen:<spec> forces one spec, "
                   "mlagen:<kernel symbol> one variant (as tune tables and records print it). Default: "
                   "dense fa3 (if built), cudnn, mlagen; sparse flashmla (if built), naive, mlagen. "
                   "See --list-peers.")
@click.option("--list-peers", is_flag=True, help="List each family's peers and whether they can run here, then exit.")
@click.option("--iters", default=50, show_default=True, type=click.IntRange(min=1), help="Timed calls per block.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(min=1),
              help="Interleaved rounds (peer, ours, peer, ours ...).")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=0),
              help="Untimed calls per peer before timing.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the report here (atomically).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write every measurement as JSON.")
@_friendly
def bench_cmd(shape_texts, shapes, peers, list_peers, iters, rounds, warmup, seed, markdown_path, json_path):
    """Time mlagen against its peers on the shapes of BENCHMARKS.md (needs a GPU).

    Exits non-zero if any of our kernels gives a wrong result.
    """
    from . import bench
    from .cache import atomic_write

    if list_peers:
        click.echo(bench.format_peer_list())
        return
    asked = list(shape_texts) + ([shapes] if shapes else [])
    env = bench.environment()
    results = bench.run(asked or "all", peers, iters=iters, rounds=rounds, warmup=warmup, seed=seed)
    click.echo(bench.format_table(results, env))
    if markdown_path:
        bench.write_markdown(markdown_path, results, env)
    if json_path:
        atomic_write(json_path, bench.results_to_json(results, env).encode())
    wrong = [f"{r.shape.id} {name}" for r in results for name, p in r.peers.items() if p.ours and p.wrong]
    if wrong:
        raise click.ClickException(f"wrong results: {', '.join(wrong)}")


@cli.command("check")
@click.option("--update", is_flag=True, help="Write the expectations of the local NVRTC instead of comparing.")
@click.option("--gpu", is_flag=True, help="Instead: re-measure the shipped winners on this GPU against their "
                                          "recorded throughput.")
@click.option("--tolerance", default=0.10, show_default=True, type=click.FloatRange(min=0, max=1, max_open=True), help="With --gpu: fraction of the recorded TFLOP/s "
                                                                   "a winner may lose.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the result as JUnit XML (atomically).")
@click.option("--spec", "specs", multiple=True, help="Only this spec (repeatable).")
@click.option("--arch", "archs", multiple=True, help="Only this target (repeatable).")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None,
              help="Parallel compile processes (default: CPU count).")
@_friendly
def check_cmd(update, gpu, tolerance, junit_path, specs, archs, jobs):
    """The CI regression check (no GPU needed): compile every spec default and every shipped record
    for every target; compare registers, spills and shared memory with the committed expectations
    of this NVRTC version (mlagen/expectations/nvrtc-<version>.json). Exits non-zero on any
    difference, printing it."""
    from . import check

    if gpu:
        speeds = check.measure_shipped(tolerance)
        if not speeds:
            raise click.ClickException("dispatch uses no shipped record on this GPU (none was made on it or on "
                                       "another device of its architecture); nothing to measure")
        rows = [[s.record.key.spec, s.record.key.problem, s.shape, s.record.symbol, s.record.key.device
                 + (" (another device)" if s.other_device else ""),
                 f"{s.record.tflops:.0f}" if s.record.tflops else "", f"{s.tflops:.0f}" if s.tflops else "",
                 "ok" if s.ok else s.problem] for s in speeds]
        click.echo(table(["spec", "problem", "shape", "winner", "made on", "recorded", "now", "verdict"], rows))
        if any(s.other_device for s in speeds):
            click.echo("records made on another device of this architecture are what dispatch uses here; their "
                       "recorded throughput is that device's", err=True)
        failed = [s for s in speeds if not s.ok]
        if failed:
            raise click.ClickException(f"{len(failed)} of {len(speeds)} shipped winners failed")
        return
    report = check.run(list(specs) or None, list(archs) or None, update=update, jobs=jobs,
                       progress=lambda item, m: click.echo(f"{m['status']:13s} {item.key}", err=True))
    if junit_path:
        check.write_junit(junit_path, report)
    click.echo(check.format_report(report))
    if not report.ok and report.updated:
        raise click.ClickException("some kernels did not compile (see above); their expectations were not changed")
    if not report.ok:
        raise click.ClickException("kernels differ from the expectations (see above); if the change is intended, "
                                   "run `mlagen check --update` and commit the file")


@cli.command("info")
@_friendly
def info_cmd():
    """Show compilers, devices and the environment variables mlagen reads."""
    from .backends.cuda import NvrtcCompiler

    rows = [["mlagen", __version__]]
    try:
        c = NvrtcCompiler()
        rows.append(["nvrtc", f"{c.version()} (targets {', '.join(c.supported_targets())}) from {c.library_path()}"])
    except MlagenError as exc:
        rows.append(["nvrtc", f"unavailable: {exc}"])
    from .backends import hip

    try:
        clang = hip.find_clang()
        rows.append(["amd offline clang", f"{clang.name} {clang.version} ({' '.join(clang.argv)})" if clang else
                     "none (apt-get install clang-22 lld-22 llvm-22, or pip install ziglang)"])
    except ValueError as exc:
        rows.append(["amd offline clang", f"unavailable: {exc}"])
    try:
        rows.append(["hiprtc", hip.hiprtc_version()])
    except MlagenError as exc:
        rows.append(["hiprtc", f"unavailable: {str(exc).splitlines()[0]}"])
    try:
        from .runtime import device_info

        d = device_info(0)
        rows.append(["device 0", f"{d.name}, {d.sm_count} SMs, compute {d.compute[0]}.{d.compute[1]}, "
                                 f"driver {d.driver_version}, target {d.target.name if d.target else '?'}"])
    except MlagenError as exc:
        rows.append(["device", f"none ({str(exc).splitlines()[0]})"])
    resolved = {knobs.OUT_DIR.name: knobs.out_dir, knobs.CACHE_DIR.name: knobs.cache_dir,
                 knobs.TUNING_DB.name: knobs.tuning_db}
    for k in knobs.ALL:
        value = k.raw()
        if k.name in resolved:  # the path in use, also where the variable is unset
            value = str(resolved[k.name]().resolve())
        bad = knobs.problem(k)
        rows.append([k.name, f"{value if value is not None else '(unset)'}  ({k.doc})"
                     + (f"  INVALID: {bad}" if bad else "")])
    click.echo(table(["what", "value"], rows))


# --- mlagen report (issue 41): a self-contained block, kept apart from the commands above ---------


@cli.command("report")
@click.option("--db", "db_path", type=click.Path(dir_okay=False), default=None,
              help=f"Tuning database (default: ${knobs.TUNING_DB.name} or <out>/tuning.sqlite, if it exists).")
@click.option("--run", "run_id", default=None, help="Only the trials of this tuning run.")
@click.option("--shape", "shapes", multiple=True, help="Only this shape class (repeatable), e.g. causal/h128/q8192/k8192.")
@click.option("--bench", "bench_paths", multiple=True, type=click.Path(dir_okay=False),
              help="A file written by mlagen bench --json (repeatable).")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False), default="report.html", show_default=True,
              help="The HTML file to write.")
@_friendly
def report_cmd(db_path, run_id, shapes, bench_paths, out):
    """Write one self-contained HTML page of the tuning database and bench results: per shape class,
    time against each tunable by outcome, the winner against the spec default and the record it
    replaced, registers and spills, the search's progress; per bench file, bars of every peer."""
    from . import report

    if db_path is None:
        default = knobs.tuning_db()
        db_path = default if default.is_file() or not bench_paths else None
    if db_path is None and (run_id or shapes):
        raise click.ClickException("--run and --shape need a tuning database (--db)")
    summary = report.write(out, db_path, run_id, tuple(shapes), tuple(bench_paths))
    click.echo(f"wrote {out}: {summary['classes']} shape class(es), {summary['trials']} trials, "
               f"{summary['bench']} bench file(s), {summary['plots']} plots, {summary['bytes'] // 1024} KiB")


def main() -> None:
    cli(prog_name="mlagen")


if __name__ == "__main__":
    main()
