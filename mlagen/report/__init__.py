"""``mlagen report``: one self-contained HTML page of a tuning database and bench results.

Per shape class: every trial's time against each tunable that varied (coloured by outcome), the
winner against the spec default and the shipped record it replaced, why variants were pruned or
failed, registers and spills of the fastest variants, and the search's progress over time. Per
``mlagen bench --json`` file: bars of each peer per shape with the spread of the rounds and the
ratio to the strongest peer. The table behind every plot is on the page. The page needs no network:
plots are inline SVG, and its one inline script only checks that every plot was drawn (it sets
``data-check`` on ``<html>``, which the tests read).
"""

from __future__ import annotations

import collections
import datetime
import re
from pathlib import Path

from ..cache import atomic_write
from ..db import OUTCOMES, Trial, TuningDB
from .data import BenchFile, BenchShape, ShapeClass, gather, read_bench, value_key
from .svg import PALETTE, PLASTIC, Frame, Svg, esc, hbars, jitter, nice_ticks, padded

__all__ = ["build", "write", "gather", "read_bench", "OUTCOME_COLOURS"]

OUTCOME_COLOURS = {"ok": "#2f9e44", "pruned": "#adb5bd", "compile_error": "#f08c00", "wrong_result": "#e03131",
                   "crash": "#9c36b5", "hang": "#1971c2", "launch_error": "#d6336c"}
_MISSING = object()
TABLE_ROWS = 1000  # a longer table is written as tab-separated text (one text node: fast to open, easy to copy)
SCATTER_W, SCATTER_H = 330, 240

_CSS = """
body{font:13px/1.4 system-ui,sans-serif;margin:16px 24px;color:#222;max-width:1500px}
h1{font-size:20px}h2{font-size:16px;margin-top:32px;border-top:2px solid #ddd;padding-top:12px}
h3{font-size:14px;margin:18px 0 6px}
.plots{display:flex;flex-wrap:wrap;gap:10px}.plots figure{margin:0}
figcaption{font-size:11px;color:#555;max-width:330px}
table{border-collapse:collapse;font-size:12px;margin:4px 0}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left}
th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre.tsv{font-size:11px;max-height:400px;overflow:auto;background:#f8f8f8;padding:6px}
details{margin:4px 0 10px}summary{cursor:pointer;color:#1864ab}.note{color:#555}
.key{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px}
"""

# Counts script errors and plots with nothing drawn, and writes the verdict where a headless
# browser's DOM dump shows it (tests/test_report.py). Runs last in <body>, after every plot.
_ERRORS_JS = ("window.__reportErrors=0;window.addEventListener('error',function(){window.__reportErrors++});"
              "(function(){var e=console.error;console.error=function(){window.__reportErrors++;"
              "return e.apply(console,arguments)}})();")
_CHECK_JS = ("(function(){var s=document.querySelectorAll('svg.plot'),empty=0;"
             "for(var i=0;i<s.length;i++){var r=s[i].getBoundingClientRect();"
             "if(!s[i].querySelector('.mark')||r.width<1||r.height<1)empty++}"
             "var n=window.__reportErrors;document.documentElement.setAttribute('data-check',"
             "(n||empty?'fail':'ok')+' plots='+s.length+' empty='+empty+' errors='+n+' ms='+Math.round(performance.now()))"
             "})();")


def write(out: Path | str, db_path: Path | str | None = None, run_id: str | None = None,
          shapes: tuple[str, ...] = (), bench_paths: tuple[str, ...] = ()) -> dict:
    """Render the report of ``db_path`` (None: no database) and ``bench_paths`` into ``out``
    (atomically). Returns counts: shape classes, trials, bench files, plots, bytes."""
    classes = gather(TuningDB(db_path), run_id, tuple(shapes)) if db_path is not None else []
    benches = [read_bench(p) for p in bench_paths]
    if not classes and not benches:
        raise ValueError("nothing to report: the database has no trials and no --bench file was given")
    sources = ([f"database {db_path}"] if db_path is not None else []) + [f"bench {p}" for p in bench_paths]
    filters = ([f"run {run_id}"] if run_id else []) + [f"shape class {s}" for s in shapes]
    page = build(classes, benches, sources, filters)
    data = page.encode("utf-8")
    atomic_write(Path(out), data)
    return {"classes": len(classes), "trials": sum(len(c.trials) for c in classes), "bench": len(benches),
            "plots": page.count('<svg class="plot"'), "bytes": len(data)}


def build(classes: list[ShapeClass], benches: list[BenchFile], sources: list[str] = (),
          filters: list[str] = ()) -> str:
    """The page's HTML text."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = [f"<h1>mlagen report</h1><p class=note>Made {esc(now)} from {esc(', '.join(sources) or 'nothing')}"
            + (f"; only {esc(', '.join(filters))}" if filters else "") + ".</p>"]
    index = [f'<li><a href="#{esc(c.anchor)}">{esc(c.title)}</a> — {len(c.trials)} trials</li>' for c in classes]
    index += [f'<li><a href="#b-{i}">bench {esc(Path(b.path).name)}</a> — {esc(b.device)}</li>'
              for i, b in enumerate(benches)]
    body.append("<ul>" + "".join(index) + "</ul>")
    if classes:
        body.append("<p>Outcomes: " + "".join(f'<span class=key style="background:{c}"></span>{esc(o)}'
                                             for o, c in OUTCOME_COLOURS.items()) + "</p>")
    body += [_shape_class(c) for c in classes]
    body += [_bench(b, i) for i, b in enumerate(benches)]
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>mlagen report</title>"
            f"<style>{_CSS}</style><script>{_ERRORS_JS}</script></head><body>" + "".join(body)
            + f"<script>{_CHECK_JS}</script></body></html>\n")


# --- tables ------------------------------------------------------------------------------------


def _table(headers: list[str], rows: list[list], summary: str, numeric: set[int] = frozenset()) -> str:
    """The data behind a plot, folded away: an HTML table, or tab-separated text when long."""
    if len(rows) > TABLE_ROWS:
        lines = ["\t".join(headers)] + ["\t".join(map(_tsv_cell, r)) for r in rows]
        inner = f'<pre class="tsv">{esc(chr(10).join(lines))}</pre>'
        summary += f" ({len(rows)} rows, tab-separated)"
    else:
        head = "".join(f"<th>{esc(h)}</th>" for h in headers)
        body = "".join("<tr>" + "".join(f"<td{' class=n' if i in numeric else ''}>{esc(_cell(c))}</td>"
                                        for i, c in enumerate(r)) + "</tr>" for r in rows)
        inner = f"<table><tr>{head}</tr>{body}</table>"
    return f"<details><summary>{esc(summary)}</summary>{inner}</details>"


def _tsv_cell(value) -> str:
    cls = value.__class__
    if cls is str:
        return value.replace("\t", " ").replace("\n", " ") if "\t" in value or "\n" in value else value
    if cls is int:
        return str(value)
    return _cell(value)


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 or abs(value) >= 1e5 else f"{value:.4f}"
    return str(value)


# --- one shape class ---------------------------------------------------------------------------


def _shape_class(c: ShapeClass) -> str:
    counts = collections.Counter(t.outcome for t in c.trials)
    runs = list(dict.fromkeys(t.run_id for t in c.trials))
    held = c.held()
    out = [f'<h2 id="{esc(c.anchor)}">{esc(c.title)}</h2>',
           f"<p>{len(c.trials)} trials in {len(runs)} run(s) ({esc(', '.join(runs))}): "
           + ", ".join(f"{n} {esc(o)}" for o, n in counts.most_common()) + "."
           + (f" Held at one value: {esc(', '.join(f'{k}={v}' for k, v in held.items()))}." if held else "")
           + "</p>"]
    out.append(_winner(c))
    out.append(_scatters(c))
    out.append(_reasons(c))
    out.append(_finalists(c))
    out.append(_progress(c, runs))
    return "".join(out)


def _winner(c: ShapeClass) -> str:
    rows: list[tuple[str, float, str, str]] = []
    table = []
    fastest = c.fastest(1)
    default = c.default_trial()
    if c.best is not None:
        rows.append(("winner (re-timed in the final round)", c.best.time_ms, "#2f9e44", c.best.symbol))
    if fastest:
        rows.append(("fastest single trial", fastest[0].time_ms, "#8ce99a", fastest[0].symbol))
    if default is not None:
        rows.append(("spec default", default.time_ms, "#74c0fc", default.symbol))
    if c.shipped is not None:
        rows.append((f"shipped record ({c.shipped.origin}), measured then", c.shipped.time_ms, "#adb5bd",
                     c.shipped.symbol))
    earlier = _earlier_best(c)
    if earlier is not None:
        rows.append((f"fastest of the runs before {c.best.run_id}", earlier.time_ms, "#ced4da", earlier.symbol))
    if not rows:
        return "<h3>Winner</h3><p>No trial passed: nothing to compare.</p>"
    ref = rows[0][1]
    bars = [(label, ms, colour, f"{ms:.3f} ms · speed ×{ref / ms:.2f}") for label, ms, colour, _ in rows]
    for label, ms, _, symbol in rows:
        table.append([label, ms, f"{ref / ms:.3f}", symbol])
    note = ("" if default is not None else
            "<p class=note>The spec default was not measured in these trials"
            + ("" if c.defaults is not None else f" (this mlagen has no spec {esc(c.spec)})") + ".</p>")
    return ("<h3>Winner against the spec default and the record it replaced</h3>"
            + hbars(f"winner of {c.title}", bars, "ms per call (shorter is faster)")
            + f"<p class=note>Speed relative to the first bar ({esc(rows[0][0])}).</p>" + note
            + _table(["what", "ms", "speed vs first row", "variant"], table, "table: winner and references", {1, 2}))


def _earlier_best(c: ShapeClass) -> Trial | None:
    """The fastest ok trial of runs that started before the winner's run."""
    if c.best is None:
        return None
    starts: dict[str, float] = {}
    for t in c.trials:
        starts.setdefault(t.run_id, t.created)
    start = starts.get(c.best.run_id)
    if start is None:
        return None
    before = [t for t in c.timed if starts[t.run_id] < start]
    return min(before, key=lambda t: t.time_ms, default=None)


def _scatters(c: ShapeClass) -> str:
    names = sorted(c.varied, key=lambda n: -c.importance(n))
    if not names:
        return "<h3>Time against each tunable</h3><p>No tunable varied across these trials.</p>"
    times = [t.time_ms for t in c.timed]
    lo, hi = padded(min(times), max(times)) if times else (0.0, 1.0)
    span = hi - lo
    strip = lo - 0.12 * span   # trials without a time are drawn in a band below the axis
    f0 = Frame(SCATTER_W, SCATTER_H, 0.0, 1.0, strip - 0.06 * span, hi, left=50, bottom=44)
    # Every scatter shares the y axis: each trial's y (and sideways jitter) is worked out once.
    none_y = f0.y(strip)
    ys = [f"{f0.y(t.time_ms) if t.outcome == 'ok' and t.time_ms is not None else none_y + jitter(i, 8, PLASTIC):.1f}"
          for i, t in enumerate(c.trials)]
    plot_w = SCATTER_W - f0.left - f0.right
    segments: dict[int, list[str]] = {}  # per number of values: each trial's dot, relative to its value's column
    figures, rows = [], []
    for name in names:
        values = c.value_order(name)
        slot = {value_key(v): i for i, v in enumerate(values)}
        f = Frame(SCATTER_W, SCATTER_H, -0.5, len(values) - 0.5, f0.y_lo, f0.y_hi, left=f0.left, bottom=f0.bottom)
        s = Svg(f, f"time against {name}")
        s.y_axis("ms", _ticks(lo, hi))
        s.line(f.left, f.y(lo - 0.03 * span), f.width - f.right, f.y(lo - 0.03 * span), "#ddd", dash="3 3")
        s.label(f.left - 4, none_y + 3, "none", anchor="end", colour="#888")
        ticks = [(i, _short(v)) for i, v in enumerate(values)]
        s.x_axis(name, ticks if len(values) <= 12 else ticks[:: (len(values) + 11) // 12])
        if len(values) not in segments:
            scale = plot_w / len(values)
            segments[len(values)] = [f"M{jitter(i, 0.7) * scale:.1f} {y}h0" for i, y in enumerate(ys)]
        seg = segments[len(values)]
        points: dict[tuple, list[str]] = collections.defaultdict(list)   # (outcome, column): dots
        by_value: dict[tuple, list[float]] = collections.defaultdict(list)
        for i, t in enumerate(c.trials):
            v = t.variant.get(name, _MISSING)
            if v is _MISSING:
                continue
            k = slot[value_key(v)]
            points[t.outcome, k].append(seg[i])
            if t.outcome == "ok" and t.time_ms is not None:
                by_value[k].append(t.time_ms)
        for outcome in [o for o in OUTCOMES if o != "ok"] + ["ok"]:  # ok last: drawn on top
            for k in range(len(values)):
                dots = points.get((outcome, k))
                if dots:
                    s.add(f'<g transform="translate({f.x(k):.1f} 0)">')
                    s.path(dots, OUTCOME_COLOURS[outcome], 4.5, 0.6 if outcome == "ok" else 0.75)
                    s.add("</g>")
        figures.append(f"<figure>{s.text()}<figcaption>{esc(name)}: the slowest value's best time is "
                       f"{c.importance(name):.2f}× the fastest's</figcaption></figure>")
        for i, v in enumerate(values):
            ms = sorted(by_value.get(i, ()))
            n = sum(len(points.get((o, i), ())) for o in OUTCOMES)
            rows.append([name, _short(v, 40), n, len(ms), ms[0] if ms else None, ms[len(ms) // 2] if ms else None])
    table = _table(["tunable", "value", "trials", "ok", "best ms", "median ms"], rows,
                   "table: trials per tunable value (every trial is in the trials table below)", {2, 3, 4, 5})
    return ("<h3>Time against each tunable</h3><p class=note>One dot per trial, spread sideways within its "
            "value; tunables ordered by how much they matter. Trials without a time (pruned, failed) sit in "
            "the band marked none.</p><div class=plots>" + "".join(figures) + "</div>" + table)


def _short(v, n: int = 8) -> str:
    text = "true" if v is True else "false" if v is False else str(v)
    return text if len(text) <= n else text[: n - 1] + "…"


def _ticks(lo: float, hi: float) -> list[float]:
    return [t for t in nice_ticks(lo, hi, 5) if lo <= t <= hi]


_NUMBERS = re.compile(r"\d+(\.\d+)?")


def _reasons(c: ShapeClass) -> str:
    """Why variants were pruned or failed, numbers folded so that alike reasons count together."""
    groups: collections.Counter = collections.Counter()
    example: dict[tuple, str] = {}
    for t in c.trials:
        if t.outcome == "ok":
            continue
        first = (t.detail or "").strip().splitlines()[0] if (t.detail or "").strip() else "(no detail recorded)"
        k = (t.outcome, _NUMBERS.sub("N", first)[:160])
        groups[k] += 1
        example.setdefault(k, first)
    if not groups:
        return "<h3>Why variants were pruned or failed</h3><p>Every trial passed.</p>"
    ranked = groups.most_common()
    bars = [(f"{o}: {r}", n, OUTCOME_COLOURS[o], str(n)) for (o, r), n in ranked[:15]]
    rows = [[o, n, r, example[(o, r)]] for (o, r), n in ranked]
    more = f"<p class=note>{len(ranked) - 15} more reasons in the table.</p>" if len(ranked) > 15 else ""
    return ("<h3>Why variants were pruned or failed</h3>"
            + hbars(f"reasons in {c.title}", bars, "trials", width=1100, label_width=640, note_width=60) + more
            + _table(["outcome", "trials", "reason (numbers as N)", "first example"], rows,
                     "table: reasons", {1}))


def _finalists(c: ShapeClass) -> str:
    fast = c.fastest()
    default = c.default_trial()
    if default is not None and default.symbol not in {t.symbol for t in fast}:
        fast.append(default)
    if not fast:
        return ""
    winner = c.best.symbol if c.best is not None else None
    bars, rows = [], []
    for t in fast:
        tags = [x for x, on in (("winner", t.symbol == winner), ("default", t is default)) if on]
        label = (f"{', '.join(tags)}: " if tags else "") + f"{t.time_ms:.3f} ms"
        regs = t.registers or 0
        spill = f", {t.spills} B spilled" if t.spills else ""
        bars.append((label, regs, "#e03131" if t.spills else "#4dabf7", f"{regs} regs{spill} · {t.symbol}"))
        rows.append([t.symbol, ", ".join(tags), t.time_ms, t.registers, t.spills, t.max_error, t.run_id])
    return ("<h3>Registers and spills of the fastest variants</h3><p class=note>The final round re-times the "
            "fastest few of these; a variant that spills (red) is never made the winner.</p>"
            + hbars(f"registers in {c.title}", bars, "registers per thread", width=1100, label_width=170,
                     note_width=520)
            + _table(["variant", "", "ms", "registers", "spills (bytes)", "max error", "run"], rows,
                     "table: fastest variants", {2, 3, 4, 5}))


def _progress(c: ShapeClass, runs: list[str]) -> str:
    start = {}
    for t in c.trials:
        start.setdefault(t.run_id, t.created)
    elapsed = [t.created - start[t.run_id] for t in c.trials]
    times = [t.time_ms for t in c.timed]
    lo, hi = padded(min(times), max(times)) if times else (0.0, 1.0)
    span = hi - lo
    strip = lo - 0.12 * span
    f = Frame(1100, 300, 0.0, max(max(elapsed, default=0.0), 1.0) * 1.02, strip - 0.06 * span, hi, bottom=44)
    s = Svg(f, f"progress of the search for {c.title}")
    s.y_axis("ms", _ticks(lo, hi))
    s.x_axis("seconds since the run's first trial")
    s.label(f.left - 4, f.y(strip) + 3, "none", anchor="end", colour="#888")
    colour = {r: PALETTE[i % len(PALETTE)] for i, r in enumerate(runs)}
    points: dict[str, list] = collections.defaultdict(list)
    best: dict[str, float] = {}
    steps: dict[str, list] = collections.defaultdict(list)
    rows = []
    for i, (t, x) in enumerate(zip(c.trials, elapsed)):
        px = f.x(x)
        if t.outcome == "ok" and t.time_ms is not None:
            points["ok"].append((px, f.y(t.time_ms)))
            if t.time_ms < best.get(t.run_id, float("inf")):
                if t.run_id in best:
                    steps[t.run_id].append((px, f.y(best[t.run_id])))
                best[t.run_id] = t.time_ms
                steps[t.run_id].append((px, f.y(t.time_ms)))
        else:
            points[t.outcome].append((px, f.y(strip) + jitter(i, 8, PLASTIC)))
        rows.append([i + 1, t.run_id, round(x, 2), t.outcome, t.time_ms, best.get(t.run_id), t.tflops,
                     t.registers, t.spills, t.max_error, t.symbol,
                     *(t.variant.get(n) for n in c.varied), (t.detail or "").strip().split("\n")[0]])
    for outcome in OUTCOMES:
        if outcome != "ok":
            s.dots(points.get(outcome, []), OUTCOME_COLOURS[outcome], 4.5)
    s.dots(points.get("ok", []), OUTCOME_COLOURS["ok"], 4.5, 0.5)
    for r in runs:
        line = steps.get(r)
        if line:
            line.append((f.x(max(x for t, x in zip(c.trials, elapsed) if t.run_id == r)), line[-1][1]))
            s.polyline(line, colour[r], 2)
    if len(runs) > 1:
        s.legend([(colour[r], f"best so far, run {r}") for r in runs], x=f.left + 10)
    else:
        s.legend([(colour[runs[0]], "best so far")], x=f.left + 10)
    headers = ["#", "run", "s since run start", "outcome", "ms", "best so far ms", "TFLOP/s", "registers",
               "spills", "max error", "variant", *c.varied, "detail"]
    return ("<h3>Progress of the search</h3><p class=note>Every trial as it finished; the line is the fastest "
            "time found so far in each run (before the final round re-times the finalists).</p>" + s.text()
            + _table(headers, rows, "table: every trial (behind the plots above)", {0, 2, 4, 5, 6, 7, 8, 9}))


# --- bench -------------------------------------------------------------------------------------


def _bench(b: BenchFile, index: int) -> str:
    env = "; ".join(f"{k}: {v}" for k, v in b.environment.items())
    out = [f'<h2 id="b-{index}">bench {esc(Path(b.path).name)}</h2><p class=note>{esc(env)}</p>']
    families: dict[str, list[BenchShape]] = {}
    for sh in b.shapes:
        families.setdefault(sh.family, []).append(sh)
    for family, shapes in families.items():
        out.append(f"<h3>{esc(family)}</h3>" + _bench_bars(family, shapes))
    return "".join(out)


def _bench_bars(family: str, shapes: list[BenchShape]) -> str:
    peers = list(dict.fromkeys(p.name for sh in shapes for p in sh.peers))
    colour = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(peers)}
    bar_w, gap = 22, 26
    group_w = bar_w * len(peers) + gap
    hi = max((sh.tflops(min(p.rounds_s, default=p.median_s)) or 0.0 for sh in shapes for p in sh.peers
              if p.median_s is not None), default=1.0) * 1.12 or 1.0
    f = Frame(max(500, 70 + group_w * len(shapes)), 340, 0.0, float(len(shapes)), 0.0, hi, left=60, bottom=58,
              top=34)
    s = Svg(f, f"{family}: TFLOP/s per peer and shape")
    s.y_axis("TFLOP/s (taller is faster)", _ticks(0.0, hi))
    s.line(f.left, f.plot_bottom, f.width - f.right, f.plot_bottom, "#999")
    s.legend([(colour[p], p) for p in peers])
    rows = []
    for gi, sh in enumerate(shapes):
        x0 = f.x(gi) + gap / 2
        s.label(x0 + bar_w * len(peers) / 2, f.plot_bottom + 14, sh.shape, bold=True)
        s.label(x0 + bar_w * len(peers) / 2, f.plot_bottom + 27, _short(sh.description, 3 * len(peers) + 4),
                size=9, colour="#666")
        strong = sh.strongest()
        for pi, name in enumerate(peers):
            p = next((p for p in sh.peers if p.name == name), None)
            x = x0 + pi * bar_w
            if p is None:
                continue
            ratio = strong.median_s / p.median_s if strong is not None and p.median_s else None
            tf = sh.tflops(p.median_s)
            fast = sh.tflops(min(p.rounds_s)) if p.rounds_s else None
            slow = sh.tflops(max(p.rounds_s)) if p.rounds_s else None
            rows.append([sh.shape, name, "ours" if p.ours else "", p.median_s * 1e3 if p.median_s else None, tf,
                         slow, fast, f"{ratio:.3f}" if ratio is not None else None,
                         strong.name if strong is not None else None, p.error or "", p.note])
            if tf is None or (p.error or "").startswith("WRONG"):
                s.label(x + bar_w / 2, f.plot_bottom - 6, "n/a" if tf is None else "WRONG", size=9,
                        colour="#e03131", rotate=True, anchor="start")
                if tf is None:
                    continue
            s.rect(x + 2, f.y(tf), bar_w - 4, f.plot_bottom - f.y(tf), colour[name],
                   f"{sh.shape} {name}: {tf:.1f} TFLOP/s" + (f", {ratio:.2f}× of {strong.name}" if ratio else ""))
            if fast is not None and slow is not None:  # the spread of the rounds' medians
                cx = x + bar_w / 2
                s.line(cx, f.y(fast), cx, f.y(slow), "#222", 1.2)
                s.line(cx - 4, f.y(fast), cx + 4, f.y(fast), "#222", 1.2)
                s.line(cx - 4, f.y(slow), cx + 4, f.y(slow), "#222", 1.2)
            if ratio is not None:
                s.label(x + bar_w / 2, min(f.y(fast or tf), f.y(tf)) - 4, f"{ratio:.2f}", size=9)
    return (s.text() + "<p class=note>Bars: the median over every timed call; whiskers: the slowest and "
            "fastest round's median; the number above a bar: its speed over the strongest peer that is not "
            "ours (1.00 is that peer).</p>"
            + _table(["shape", "peer", "", "median ms", "TFLOP/s", "slowest round TFLOP/s", "fastest round TFLOP/s",
                      "speed vs strongest", "strongest peer", "error", "note"], rows, f"table: {family} bench",
                     {3, 4, 5, 6, 7}))
