"""`write_report`: the end-of-run report, run_dir/report.html with PNG plots in run_dir/plots/.

Input is the metric history as the trackers wrote it (a list of `{"step": s, name: value}` rows,
e.g. `tracker.load_history(run_dir)`), a summary dict from the loop, and optionally the run's
staleness histogram. A plot whose metrics were never logged is skipped and listed as such; the
report never fails for a missing metric. The reward-hacking warning comes from
`controller.judge` and is shown at the top.

Drawn with matplotlib's object API on the Agg canvas (no pyplot, no global backend switch), so it
is safe to call from any thread of the controller. `summarize` and `format_summary` give the same
summary table as text for the console at the end of a run.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import html
import math
import pathlib
import statistics
from typing import Any, Mapping, Sequence

from controller import judge

STALENESS_HIST_PREFIX = "staleness/hist/"
EVAL_SUCCESS = "eval/*success_rate"  # eval/success_rate and the per-env eval/<env>/success_rate
PLOT_DIR = "plots"


@dataclasses.dataclass(frozen=True)
class Panel:
    ylabel: str
    keys: tuple[str, ...]  # metric names; shell-style patterns ("infra/errors/*") match every such metric


@dataclasses.dataclass(frozen=True)
class Plot:
    name: str  # file stem
    title: str
    panels: tuple[Panel, ...]


# Line plots over steps, in report order. Reward vs true metric and staleness have their own drawers.
LINE_PLOTS = (
    Plot("success", "Success rate and true metric", (
        Panel("rate", ("rollout/success_rate", EVAL_SUCCESS, "reward/true_metric", "rollout/verify_pass_rate")),)),
    Plot("length", "Trajectory length", (Panel("turns", ("rollout/turns",)), Panel("tokens", ("rollout/tokens",)))),
    Plot("tools", "Tool calls and cost", (Panel("calls", ("rollout/tool_calls",)), Panel("cost", ("rollout/tool_cost",)))),
    Plot("invalid_loop", "Invalid-loop rate", (Panel("rate", ("rollout/invalid_loop_rate",)),)),
    Plot("safety", "Safety violations", (Panel("violations", ("rollout/safety_violations",)),)),
    Plot("logprob_gap", "Behaviour vs learner logprob gap", (Panel("gap", ("learner/logprob_gap",)),)),
    Plot("throughput", "Throughput and timing", (
        Panel("tokens / s", ("perf/rollout_tokens_per_s", "perf/learner_tokens_per_s")),
        Panel("seconds", ("perf/step_s", "perf/weight_sync_s")))),
    Plot("learner", "Learner", (
        Panel("loss", ("learner/loss",)), Panel("kl", ("learner/kl",)), Panel("entropy", ("learner/entropy",)),
        Panel("clip fraction", ("learner/clip_frac",)), Panel("grad norm", ("learner/grad_norm",)))),
    Plot("infra_errors", "Infrastructure errors (never rewards)", (Panel("count", ("infra/errors/*",)),)),
)


def write_report(
    run_dir: str | pathlib.Path,
    history: Sequence[Mapping[str, Any]],
    summary: Mapping[str, Any],
    staleness_hist: Mapping[Any, float] | None = None,
) -> pathlib.Path:
    """Write run_dir/report.html (+ run_dir/plots/*.png) and return the HTML path.

    `summary` entries are shown after (and override) those `summarize(history)` computes.
    `staleness_hist` maps versions-behind to sample counts; if None it is summed from the
    `staleness/hist/<k>` metrics, if any.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # slow import: only when a report is made
    from matplotlib.figure import Figure

    run_dir = pathlib.Path(run_dir)
    plot_dir = run_dir / PLOT_DIR
    plot_dir.mkdir(parents=True, exist_ok=True)
    history = sorted((r for r in history if "step" in r), key=lambda r: r["step"])
    drawn: list[tuple[str, str]] = []  # (file name, title)
    skipped: list[str] = []

    def save(figure: Figure, name: str, title: str) -> None:
        figure.suptitle(title)
        figure.tight_layout()
        FigureCanvasAgg(figure).print_png(str(plot_dir / f"{name}.png"))
        drawn.append((f"{PLOT_DIR}/{name}.png", title))

    for plot in LINE_PLOTS[:1]:
        _line_plot(Figure, save, skipped, plot, history)
    _reward_vs_true(Figure, save, skipped, history)
    for plot in LINE_PLOTS[1:]:
        _line_plot(Figure, save, skipped, plot, history)
    _staleness(Figure, save, skipped, history, staleness_hist)

    table = {**summarize(history), **summary}
    warning = judge.reward_hacking_warning(history)
    path = run_dir / "report.html"
    path.write_text(_html(table, warning, drawn, skipped), encoding="utf-8")
    return path


def _series(history: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    steps, values = [], []
    for row in history:
        value = row.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(row["step"])
            values.append(float(value))
    return steps, values


def _expand(history: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[str]:
    out: list[str] = []
    for key in keys:
        if any(c in key for c in "*?["):
            out += sorted({k for row in history for k in row if fnmatch.fnmatchcase(k, key)})
        else:
            out.append(key)
    return out


def _line_plot(Figure, save, skipped, plot: Plot, history) -> None:
    panels = []
    for panel in plot.panels:
        lines = [(key, *_series(history, key)) for key in _expand(history, panel.keys)]
        lines = [line for line in lines if line[1]]
        if lines:
            panels.append((panel, lines))
    if not panels:
        skipped.append(f"{plot.title} ({', '.join(k for p in plot.panels for k in p.keys)} not logged)")
        return
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    figure = Figure(figsize=(4.2 * columns, 3.2 * rows), dpi=80)
    for i, (panel, lines) in enumerate(panels):
        axes = figure.add_subplot(rows, columns, i + 1)
        for key, steps, values in lines:
            axes.plot(steps, values, marker="." if len(steps) < 30 else None, label=key)
        axes.set_xlabel("step")
        axes.set_ylabel(panel.ylabel)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, framealpha=0.4)
    save(figure, plot.name, plot.title)


def _reward_vs_true(Figure, save, skipped, history) -> None:
    title = "Reward vs true metric"
    rows = [r for r in history if judge.finite(r.get(judge.REWARD)) and judge.finite(r.get(judge.TRUE_METRIC))]
    if not rows:
        skipped.append(f"{title} ({judge.REWARD} and {judge.TRUE_METRIC} not logged together)")
        return
    steps = [r["step"] for r in rows]
    rewards = [float(r[judge.REWARD]) for r in rows]
    trues = [float(r[judge.TRUE_METRIC]) for r in rows]
    figure = Figure(figsize=(8.4, 3.2), dpi=80)
    over_steps = figure.add_subplot(1, 2, 1)
    over_steps.plot(steps, rewards, label=judge.REWARD)
    over_steps.plot(steps, trues, label=judge.TRUE_METRIC)
    corr_steps, corrs = _series(history, judge.CORRELATION)
    if corrs:
        over_steps.plot(corr_steps, corrs, linestyle="--", label=judge.CORRELATION)
    over_steps.set_xlabel("step")
    over_steps.grid(alpha=0.3)
    over_steps.legend(fontsize=7)
    scatter = figure.add_subplot(1, 2, 2)
    points = scatter.scatter(rewards, trues, c=steps, cmap="viridis", s=12)
    figure.colorbar(points, ax=scatter, label="step")
    scatter.set_xlabel("reward (mean per step)")
    scatter.set_ylabel("true metric (mean per step)")
    scatter.grid(alpha=0.3)
    save(figure, "reward_vs_true", title)


def _staleness(Figure, save, skipped, history, staleness_hist) -> None:
    title = "Staleness (learner version - behaviour version, per sample)"
    if staleness_hist is None:
        summed: dict[int, float] = {}
        for row in history:
            for key, value in row.items():
                if key.startswith(STALENESS_HIST_PREFIX) and judge.finite(value):
                    lag = int(key[len(STALENESS_HIST_PREFIX):])
                    summed[lag] = summed.get(lag, 0.0) + float(value)
        staleness_hist = summed or None
    lines = [(key, *_series(history, key)) for key in ("staleness/mean", "staleness/max")]
    lines = [line for line in lines if line[1]]
    if not staleness_hist and not lines:
        skipped.append(f"{title} (no histogram, staleness/mean or staleness/max)")
        return
    figure = Figure(figsize=(4.2 * (bool(staleness_hist) + bool(lines)), 3.2), dpi=80)
    index = 1
    if staleness_hist:
        axes = figure.add_subplot(1, 1 + bool(lines), index)
        lags = sorted(int(k) for k in staleness_hist)
        axes.bar(lags, [float(staleness_hist.get(k, staleness_hist.get(str(k), 0))) for k in lags])
        axes.set_xlabel("versions behind")
        axes.set_ylabel("samples")
        axes.set_xticks(lags)
        index += 1
    if lines:
        axes = figure.add_subplot(1, index, index)
        for key, steps, values in lines:
            axes.plot(steps, values, label=key)
        axes.set_xlabel("step")
        axes.set_ylabel("versions")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, framealpha=0.4)
    save(figure, "staleness", title)


# -- the summary ---------------------------------------------------------------------------------


def summarize(history: Sequence[Mapping[str, Any]], edge_steps: int = 5) -> dict[str, Any]:
    """Headline numbers of a run from its history; keys are absent when their metrics were not logged.

    Success before/after: the first and last evaluation (`eval/success_rate`, or each env's
    `eval/<env>/success_rate`) if the run evaluated, else the mean `rollout/success_rate` of the first
    and last `edge_steps` steps. Reward and true metric: means
    over the last `edge_steps` steps. Throughput: medians over the run; weight sync: the mean.
    """
    history = sorted((r for r in history if "step" in r), key=lambda r: r["step"])
    out: dict[str, Any] = {"steps": len(history)}
    eval_keys = _expand(history, (EVAL_SUCCESS,))
    for key in eval_keys:
        _, evals = _series(history, key)
        if evals:
            suffix = "" if len(eval_keys) == 1 else f" ({key})"
            out[f"success metric{suffix}"] = key
            out[f"success before{suffix}"], out[f"success after{suffix}"] = evals[0], evals[-1]
    if not eval_keys:
        _, train = _series(history, "rollout/success_rate")
        if train:
            out["success metric"] = f"rollout/success_rate (mean of first/last {edge_steps} steps)"
            out["success before"] = statistics.fmean(train[:edge_steps])
            out["success after"] = statistics.fmean(train[-edge_steps:])
    for label, key in (("reward (last steps)", judge.REWARD), ("true metric (last steps)", judge.TRUE_METRIC)):
        _, values = _series(history, key)
        if values:
            out[label] = statistics.fmean(values[-edge_steps:])
    _, corrs = _series(history, judge.CORRELATION)
    if corrs:
        out["reward/true metric correlation (mean per step)"] = statistics.fmean(corrs)
    for label, key, reduce in (("rollout tokens/s (median)", "perf/rollout_tokens_per_s", statistics.median),
                               ("learner tokens/s (median)", "perf/learner_tokens_per_s", statistics.median),
                               ("weight sync s (mean)", "perf/weight_sync_s", statistics.fmean),
                               ("step s (mean)", "perf/step_s", statistics.fmean)):
        _, values = _series(history, key)
        if values:
            out[label] = reduce(values)
    return out


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def format_summary(summary: Mapping[str, Any]) -> str:
    """The summary as an aligned two-column text table (for the console at the end of a run)."""
    if not summary:
        return "(no summary)"
    width = max(len(str(k)) for k in summary)
    return "\n".join(f"{str(k):<{width}}  {_show(v)}" for k, v in summary.items())


def _html(table: Mapping[str, Any], warning: str | None, drawn, skipped) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Orrery run report</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:80em}td,th{padding:2px 12px;text-align:left}"
        "table{border-collapse:collapse}tr:nth-child(even){background:#f4f4f4}"
        ".warning{background:#fdd;border:1px solid #c00;padding:0.6em;margin:1em 0}"
        "figure{display:inline-block;margin:0.5em}</style></head><body>",
        "<h1>Orrery run report</h1>",
    ]
    if warning:
        parts.append(f"<div class='warning'><b>Reward hacking?</b> {e(warning)}</div>")
    parts.append("<h2>Summary</h2><table>")
    parts += [f"<tr><th>{e(str(k))}</th><td>{e(_show(v))}</td></tr>" for k, v in table.items()]
    parts.append("</table><h2>Plots</h2>")
    parts += [f"<figure><img src='{e(src)}' alt='{e(title)}'><figcaption>{e(title)}</figcaption></figure>"
              for src, title in drawn]
    if skipped:
        parts.append("<h3>Not drawn</h3><ul>" + "".join(f"<li>{e(s)}</li>" for s in skipped) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
