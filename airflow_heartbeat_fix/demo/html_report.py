"""
The demo's picture: one self-contained HTML page (inline SVG and CSS, nothing fetched) with a timeline
per run, stock and fixed on the same time axis.

Each try of each Dag is a lane coloured by its task instance state over time; callbacks and emails are
marks on their try's lane, the scheduler crash a red line across the run; a try called back (or emailed)
more than once has its lane tinted red and noted, and each mark after the first ringed and numbered.
Beside it, the counts per try with the expected "1 per try". Pure: results in, text out.
"""

from __future__ import annotations

import html
from collections import Counter
from typing import TYPE_CHECKING

from airflow_heartbeat_fix.demo.result import (
    CALLBACK_DAG_ID,
    CALLBACK_DAG_IDS,
    EMAIL,
    FAILURE_CALLBACK,
    REDELIVERY_SCENARIO,
    RETRY_CALLBACK,
    Mark,
    RunResult,
    StateChange,
    all_try_numbers,
)
from airflow_heartbeat_fix.demo.verdicts import callbacks_cell, emails_cell, verdict_cell

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

STATE_COLOURS = {
    "scheduled": "#c9d6e3",
    "queued": "#9fb6cc",
    "running": "#7ac143",
    "up_for_retry": "#f0a30a",
    "up_for_reschedule": "#f0a30a",
    "failed": "#cc0000",
    "success": "#1b5e20",
    "restarting": "#8e44ad",
}
OTHER_STATE_COLOUR = "#888888"
#: A try's second callback or email, and its lane.
DUPLICATE_COLOUR = "#cc0000"
MARK_COLOURS = {RETRY_CALLBACK: "#e67e00", FAILURE_CALLBACK: "#a40000", EMAIL: "#1f5fbf"}

WIDTH = 1060
LABEL_WIDTH = 250
#: The timeline's plot: between the labels and a 20 px margin on the right.
PLOT_WIDTH = WIDTH - LABEL_WIDTH - 20
LANE_HEIGHT = 46
TOP = 34
BOTTOM = 36

CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 28px 0 6px; }
.sub { color: #555; margin: 0 0 12px; }
.ok { color: #2e7d32; font-weight: 600; } .bad { color: #cc0000; font-weight: 600; }
table { border-collapse: collapse; margin: 8px 0 4px; }
td, th { border: 1px solid #ddd; padding: 3px 10px; text-align: left; font-size: 13px; }
th { background: #f4f4f4; } td.off { background: #fde8e8; }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -1px; }
svg text { font: 12px system-ui, sans-serif; fill: #333; }
svg text.crash { fill: #cc0000; font-weight: 600; } svg text.note { fill: #777; font-style: italic; }
svg text.axis { fill: #666; }
.legend svg { vertical-align: -2px; margin-right: 4px; }
"""


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _lanes(try_numbers: dict[str, list[int]]) -> list[tuple[str, int]]:
    return [(dag_id, n) for dag_id, numbers in try_numbers.items() for n in numbers]


def _segments(
    changes: Iterable[StateChange], dag_id: str, try_number: int, end: float
) -> list[tuple[float, float, str]]:
    """``(start, stop, state)`` of one try, from its state changes; the last lasts until ``end``."""
    mine = sorted((c for c in changes if c.dag_id == dag_id and c.try_number == try_number), key=_at)
    out = []
    for i, change in enumerate(mine):
        stop = mine[i + 1].seconds if i + 1 < len(mine) else end
        if change.state and stop > change.seconds:
            out.append((change.seconds, stop, change.state))
    return out


def _at(change: StateChange) -> float:
    return change.seconds


def _timeline_svg(result: RunResult, try_numbers: dict[str, list[int]], span: float) -> str:
    lanes = _lanes(try_numbers)
    height = TOP + LANE_HEIGHT * len(lanes) + BOTTOM

    def x(seconds: float) -> float:
        return LABEL_WIDTH + PLOT_WIDTH * max(0.0, min(seconds, span)) / span

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{_esc(result.label)} timeline">'
    ]
    parts += _axis_svg(span, height, x)
    if result.crashed_after is not None:  # nothing moves after the crash: shade it
        parts.append(
            f'<rect x="{x(result.crashed_after):.1f}" y="{TOP - 6}" '
            f'width="{x(span) - x(result.crashed_after):.1f}" height="{height - BOTTOM - TOP + 6}" '
            'fill="#cc0000" fill-opacity="0.06"/>'
        )
    for index, (dag_id, try_number) in enumerate(lanes):
        first_of_dag = index == 0 or lanes[index - 1][0] != dag_id
        parts += _lane_svg(result, dag_id, try_number, TOP + index * LANE_HEIGHT + 16, first_of_dag, span, x)
    if result.crashed_after is not None:
        cx = x(result.crashed_after)
        parts.append(
            f'<line x1="{cx:.1f}" y1="{TOP - 14}" x2="{cx:.1f}" y2="{height - BOTTOM}" stroke="#cc0000" '
            f'stroke-width="2" stroke-dasharray="5 3"><title>{_esc(result.scheduler.error or "")}</title>'
            "</line>"
            f'<text class="crash" x="{cx + 4:.1f}" y="{TOP - 18}">'
            f"scheduler crashed at {result.crashed_after:.0f} s</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _axis_svg(span: float, height: int, x: Callable[[float], float]) -> list[str]:
    """A grid line and a label every :func:`_tick_step` seconds, and the axis title."""
    parts = []
    step = _tick_step(span)
    tick = 0.0
    while tick <= span + 1e-9:
        parts.append(
            f'<line x1="{x(tick):.1f}" y1="{TOP - 6}" x2="{x(tick):.1f}" y2="{height - BOTTOM}" '
            'stroke="#eee"/>'
            f'<text x="{x(tick):.1f}" y="{height - BOTTOM + 16}" text-anchor="middle">{tick:.0f} s</text>'
        )
        tick += step
    parts.append(
        f'<text class="axis" x="{LABEL_WIDTH + PLOT_WIDTH}" y="{height - 2}" text-anchor="end">'
        "seconds after trigger</text>"
    )
    return parts


def _lane_svg(
    result: RunResult,
    dag_id: str,
    try_number: int,
    bar_y: int,
    first_of_dag: bool,
    span: float,
    x: Callable[[float], float],
) -> list[str]:
    """One try's lane: its labels, a span per state it was in, and its callback and email marks."""
    parts = [f'<text x="0" y="{bar_y + 6}">{_esc(dag_id)}</text>'] if first_of_dag else []
    parts.append(f'<text x="{LABEL_WIDTH - 10}" y="{bar_y + 6}" text-anchor="end">try {try_number}</text>')
    repeated = _repeated(result, dag_id, try_number)
    if repeated:  # the whole lane says it, not only the marks: a duplicate is seen at a glance
        parts.append(
            f'<rect x="0" y="{bar_y - 20}" width="{LABEL_WIDTH + PLOT_WIDTH}" height="40" '
            f'fill="{DUPLICATE_COLOUR}" fill-opacity="0.08"/>'
            f'<text class="crash" x="{LABEL_WIDTH - 10}" y="{bar_y + 18}" text-anchor="end">'
            f"{_esc(repeated)}</text>"
        )
    parts.append(f'<rect x="{LABEL_WIDTH}" y="{bar_y - 6}" width="{PLOT_WIDTH}" height="12" fill="#f7f7f7"/>')
    segments = _segments(result.timeline, dag_id, try_number, span)
    if not segments:
        parts.append(f'<text class="note" x="{LABEL_WIDTH + 6}" y="{bar_y + 4}">not created</text>')
    for start, stop, state in segments:
        colour = STATE_COLOURS.get(state, OTHER_STATE_COLOUR)
        parts.append(
            f'<rect x="{x(start):.1f}" y="{bar_y - 6}" width="{max(1.0, x(stop) - x(start)):.1f}" '
            f'height="12" fill="{colour}"><title>try {try_number}: {_esc(state)} from '
            f"{start:.0f} s to {stop:.0f} s</title></rect>"
        )
    parts.extend(_marks_svg(result.marks, dag_id, try_number, bar_y, x))
    return parts


def _marks_svg(
    marks: Sequence[Mark], dag_id: str, try_number: int, bar_y: float, x: Callable[[float], float]
) -> list[str]:
    """
    Callbacks above the bar, emails below, each at its time; each one after the first of its row stacks
    outwards (so two callbacks of different kinds never hide each other) and is ringed and numbered.
    """
    out = []
    seen: Counter[bool] = Counter()
    for mark in sorted((m for m in marks if m.dag_id == dag_id and m.try_number == try_number), key=_mark_at):
        is_email = mark.kind == EMAIL
        nth = seen[is_email]
        seen[is_email] += 1
        colour = MARK_COLOURS.get(mark.kind, OTHER_STATE_COLOUR)
        cx = x(mark.seconds)
        tip = f"<title>{_esc(mark.kind)} for try {try_number} at {mark.seconds:.1f} s</title>"
        y = bar_y + 13 + 9 * nth if is_email else bar_y - 12 - 9 * nth
        if is_email:
            out.append(
                f'<rect x="{cx - 5:.1f}" y="{y - 4}" width="10" height="8" fill="{colour}">{tip}</rect>'
            )
        else:
            out.append(
                f'<path d="M{cx - 5:.1f},{y - 5} L{cx + 5:.1f},{y - 5} L{cx:.1f},{y + 3} Z" '
                f'fill="{colour}">{tip}</path>'
            )
        if nth:
            out.append(
                f'<circle cx="{cx:.1f}" cy="{y - 1}" r="8" fill="none" stroke="{DUPLICATE_COLOUR}" '
                f'stroke-width="2"/><text class="crash" x="{cx + 10:.1f}" y="{y + 3}">{nth + 1}</text>'
            )
    return out


def _repeated(result: RunResult, dag_id: str, try_number: int) -> str:
    """What one try got more than once, as the lane's note: "2 callbacks (expected 1)", or ""."""
    mine = Counter(m.kind == EMAIL for m in result.marks if m.dag_id == dag_id and m.try_number == try_number)
    notes = [f"{mine[False]} callbacks"] if mine[False] > 1 else []
    if result.emails_via_backend and mine[True] > 1:
        notes.append(f"{mine[True]} emails")
    return f"{' and '.join(notes)} (expected 1)" if notes else ""


def _mark_at(mark: Mark) -> float:
    return mark.seconds


def _tick_step(span: float) -> float:
    for step in (5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0):
        if span / step <= 12:
            return step
    return 600.0


def _counts_table(result: RunResult, try_numbers: dict[str, list[int]]) -> str:
    dag_id = next((d for d in try_numbers if d in CALLBACK_DAG_IDS), CALLBACK_DAG_ID)
    outcome = result.dags.get(dag_id)
    rows = ["<table><tr><th>" + _esc(dag_id) + "</th><th>callbacks</th><th>emails</th></tr>"]
    for try_number in try_numbers.get(dag_id, []):
        per_kind = outcome.callbacks.get(try_number, {}) if outcome else {}
        emails = outcome.emails.get(try_number, 0) if outcome else 0
        off_cb = sum(per_kind.values()) > 1
        off_mail = result.emails_via_backend and emails > 1
        rows.append(
            f"<tr><td>try {try_number}</td>"
            f'<td class="{"off" if off_cb else ""}">{_esc(callbacks_cell(per_kind))}</td>'
            f'<td class="{"off" if off_mail else ""}">'
            f"{_esc(emails_cell(emails, result.emails_via_backend))}</td>"
            "</tr>"
        )
    rows.append("</table>")
    return "".join(rows)


def _legend() -> str:
    states = "".join(
        f'<span><i style="background:{c}"></i>{_esc(s)}</span>'
        for s, c in STATE_COLOURS.items()
        if s not in ("up_for_reschedule", "restarting")
    )
    triangle = '<path d="M1,2 L11,2 L6,10 Z" fill="{}"/>'
    marks = "".join(
        f'<span><svg width="12" height="12">{shape}</svg>{_esc(label)}</span>'
        for shape, label in (
            (triangle.format(MARK_COLOURS[RETRY_CALLBACK]), "on_retry_callback"),
            (triangle.format(MARK_COLOURS[FAILURE_CALLBACK]), "on_failure_callback"),
            (f'<rect x="1" y="2" width="10" height="8" fill="{MARK_COLOURS[EMAIL]}"/>', "email"),
            (f'<circle cx="6" cy="6" r="5" fill="none" stroke="{DUPLICATE_COLOUR}" stroke-width="2"/>',
             "a try's 2nd, 3rd ... callback or email"),
            ('<line x1="6" y1="0" x2="6" y2="12" stroke="#cc0000" stroke-width="2" stroke-dasharray="3 2"/>',
             "scheduler crash"),
        )
    )  # fmt: skip
    return f'<p class="legend">{states}<br>{marks}</p>'


def render_html(results: list[RunResult]) -> str:
    """The whole page for ``results`` (stock and/or fixed), on one shared time axis."""
    if not results:
        return "<!doctype html><title>airflow-heartbeat-fix demo</title><p>No run.</p>\n"
    first = results[0]
    try_numbers = all_try_numbers(results)
    span = max([10.0, *(_span(r) for r in results)])
    sections = []
    for result in results:
        verdict = verdict_cell(result)
        shows_bug = not result.fix_enabled and bool(result.reproduced)
        style = "bad" if shows_bug or (result.fix_enabled and result.problems) else "ok"
        if not result.fix_enabled and not result.reproduced:
            style = "plain"
        sections.append(
            f"<h2>{_esc(result.label)} ([heartbeat_fix] enabled={result.fix_enabled}): "
            f'<span class="{style}">{_esc(verdict)}</span></h2>'
            + _timeline_svg(result, try_numbers, span)
            + _counts_table(result, try_numbers)
        )
    title = f"airflow-heartbeat-fix demo: Airflow {first.airflow_version}, {first.database}, {first.topology}"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(title)}</title><style>{CSS}</style></head><body>"
        f"<h1>{_esc(title)}</h1>"
        f'<p class="sub">{_esc(_what_runs(first.scenario))}</p>'
        + _legend()
        + "".join(sections)
        + "</body></html>\n"
    )


def _what_runs(scenario: str) -> str:
    if scenario == REDELIVERY_SCENARIO:
        return (
            "The task runs 150 s; Redis redelivers it meanwhile with an expired token, and the refused copy "
            "is reported FAILED. Expected: try 1 succeeds, no callback."
        )
    return (
        "Each Dag's task freezes its own supervisor, so the scheduler fails it on heartbeat timeout and "
        "retries it once. Expected: 1 callback per try and 1 email per try."
    )


def _span(result: RunResult) -> float:
    times = [c.seconds for c in result.timeline] + [m.seconds for m in result.marks]
    if result.crashed_after is not None:
        times.append(result.crashed_after)
    return max([result.watched_seconds, *times]) if times else result.watched_seconds
