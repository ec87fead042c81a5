"""``mlagen db``: inspect, export, import and compare tuning databases (registered by :mod:`mlagen.cli`)."""

from __future__ import annotations

import click

from . import knobs
from .cli_common import _friendly, table


@click.group("db")
@click.option("--db", "db_path", type=click.Path(dir_okay=False), default=None,
              help=f"Tuning database (default: ${knobs.TUNING_DB.name} or <out>/tuning.sqlite).")
@click.pass_context
def db_cmd(ctx, db_path):
    """Inspect, export and import the tuning database."""
    from .db import TuningDB

    ctx.obj = TuningDB(db_path)


@db_cmd.command("ls")
@click.option("--shipped", is_flag=True, help="Also list the records shipped with the package.")
@click.pass_obj
@_friendly
def db_ls(database, shipped):
    """List the winners per kernel and shape class."""
    from .db import shipped_records

    bests = list(database.bests()) + (list(shipped_records()) if shipped else [])
    rows = [[b.origin, b.key.spec, b.key.problem, b.key.device, b.key.sm_count, b.symbol, f"{b.time_ms:.3f}",
             f"{b.tflops:.0f}" if b.tflops else "", b.key.source_hash] for b in bests]
    click.echo(table(["origin", "spec", "problem", "device", "SMs", "winner", "ms", "TFLOP/s", "source"], rows))
    runs = database.runs()
    if runs:
        click.echo("")
        click.echo(table(["run", "spec", "problem", "device", "trials", "ok"],
                         [[r["run_id"], r["spec"], r["problem"], r["device"], r["trials"], r["ok"]] for r in runs]))


@db_cmd.command("show")
@click.option("--run", "run_id", default=None, help="Only this tuning run.")
@click.option("--problem", default=None, help="Only this shape class, e.g. causal/h128/q8192/k8192.")
@click.option("--spec", "spec_name", default=None, help="Only this spec.")
@click.pass_obj
@_friendly
def db_show(database, run_id, problem, spec_name):
    """Show every recorded trial (ok, pruned, compile error, wrong result, crash, hang)."""
    where = {k: v for k, v in (("problem", problem), ("spec", spec_name)) if v is not None}
    trials = database.trials(run_id=run_id, **where)
    rows = [[t.run_id, t.key.problem, t.symbol, t.outcome, f"{t.time_ms:.3f}" if t.time_ms else "",
             f"{t.tflops:.0f}" if t.tflops else "", f"{t.max_error:.1e}" if t.max_error is not None else "",
             t.registers if t.registers is not None else "", t.spills if t.spills is not None else "",
             (t.detail or "").splitlines()[0][:80] if t.detail else ""] for t in trials]
    click.echo(table(["run", "problem", "variant", "outcome", "ms", "TFLOP/s", "err", "regs", "spill", "detail"], rows))


@db_cmd.command("export")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--best-only", is_flag=True, help="Only the winners (the format shipped with the package).")
@click.option("--force", is_flag=True, help="Replace PATH if it exists (otherwise refused).")
@click.pass_obj
@_friendly
def db_export(database, path, best_only, force):
    """Write the database as JSON to PATH (atomically); an existing PATH needs --force."""
    doc = database.export(path, best_only=best_only, overwrite=force)
    click.echo(f"exported {len(doc['best'])} winner(s) and {len(doc['trials'])} trial(s) to {path}")


@db_cmd.command("import")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--replace", is_flag=True, help="Imported winners replace the database's even where slower.")
@click.pass_obj
@_friendly
def db_import(database, path, replace):
    """Merge a JSON export into the database (validated first; all or nothing).

    Trials already in the database are skipped; a winner replaces the database's only if it is
    faster (or with --replace). Prints what was added, replaced and kept.
    """
    report = database.import_(path, replace=replace)
    click.echo(f"imported {path} into {database.path}")
    for line in report.lines():
        click.echo(line)


@db_cmd.command("compare")
@click.argument("a_path", metavar="A", type=click.Path(exists=True, dir_okay=False))
@click.argument("b_path", metavar="B", type=click.Path(exists=True, dir_okay=False))
@click.option("--retime", is_flag=True, help="Check and time both winners of every class where they differ, "
                                             "interleaved in one process on this GPU.")
@click.option("--rounds", default=6, show_default=True, type=click.IntRange(min=2), help="Rounds of --retime.")
@click.option("--iters", default=20, show_default=True, type=click.IntRange(min=1), help="Timed calls per round.")
@click.option("--shape", "shape_text", default=None, metavar="SHAPE",
              help="Re-time on this shape where it is of the class (default: the class's first named shape).")
@click.option("--spec", "spec_name", default=None, help="Only this spec's records.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")
@_friendly
def db_compare(a_path, b_path, retime, rounds, iters, shape_text, spec_name, seed):
    """The winners of two databases for every record key both hold (A's and B's, the tunables in
    which they differ); with --retime, both re-timed on this GPU and judged by the tuner's own
    noise allowance: "same" (one kernel), "within noise", or which is faster beyond it."""
    from .db import TuningDB
    from .tune import compare

    listing = compare.pairs(TuningDB(a_path), TuningDB(b_path), spec_name)
    if retime and any(not p.same for p in listing.pairs):
        from .measure import require_gpu

        require_gpu("db compare --retime")   # before any work: one line, not one per class
    done = [compare.retime(p, rounds, iters, seed=seed, shape_text=shape_text) if retime else compare.Comparison(p)
            for p in listing.pairs]
    click.echo(f"A {a_path}\nB {b_path}")
    for line in compare.lines(listing, done):
        click.echo(line)
