"""`Tracker`: where the controller's per-step metrics go. Only the controller writes metrics.

One interface, `log(step, metrics)` once per learner step and `close()` at the end, with
implementations named for where they write: `JsonlTracker` (run_dir/metrics.jsonl),
`TensorBoardTracker` (run_dir/tb), `ConsoleTracker` (a progress line per step, plus the
reward-hacking warning of `controller.judge`), `MultiTracker` (fan-out) and `NullTracker`.
`controller.service.RunStatus` has the same two methods, so the metrics stream is one more tracker.

Metric names are flat and namespaced (DESIGN.md section 6): `rollout/success_rate`,
`reward/mean`, `staleness/mean`, `learner/loss`, `perf/rollout_tokens_per_s`,
`infra/errors/<class>`, ... Two names this module adds to that list, which the loop emits:
  `reward/true_metric`  mean held-out true metric of the step's trajectories
  `eval/success_rate`   greedy success on the eval splits, on the steps that evaluate
and, optionally, the staleness histogram of the step as `staleness/hist/<versions behind>` (counts);
`controller.report` sums those into the run's histogram.

metrics.jsonl: one JSON object per line, `{"step": int, "time": unix seconds, <name>: float, ...}`;
NaN and infinities are written as null so that any JSON reader can parse the file.
The file is appended to, so a resumed run continues it: the pipeline checkpoint records the file's
length and a resumed run first cuts it back to that length, so no step's lines are duplicated or
missing. A step may have several lines (the training metrics, then the evaluation's);
`load_history` merges the lines of each step, later values winning.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import sys
import time
from typing import Mapping, Protocol, Sequence, TextIO

from controller import judge

logger = logging.getLogger(__name__)

SUCCESS = "rollout/success_rate"
EVAL_SUCCESS = "eval/success_rate"
REWARD = judge.REWARD  # "reward/mean"
TRUE_METRIC = judge.TRUE_METRIC  # "reward/true_metric"
CORRELATION = judge.CORRELATION  # "reward/true_metric_corr"
STALENESS = "staleness/mean"
LOSS = "learner/loss"
ROLLOUT_TOKENS_PER_S = "perf/rollout_tokens_per_s"
STALENESS_HIST_PREFIX = "staleness/hist/"


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record metrics of one learner step. Steps do not go down; one step may be logged more
        than once with different keys (training metrics, then evaluation)."""

    def close(self) -> None:
        """Flush and release. Safe to call twice."""


class NullTracker:
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def close(self) -> None:
        pass


class MultiTracker:
    """Log to every tracker in order; close all of them even if one fails."""

    def __init__(self, trackers: Sequence[Tracker]):
        self.trackers = list(trackers)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for tracker in self.trackers:
            tracker.log(step, metrics)

    def close(self) -> None:
        errors = []
        for tracker in self.trackers:
            try:
                tracker.close()
            except Exception as error:  # noqa: BLE001 - close the rest, then re-raise the first
                errors.append(error)
        if errors:
            raise errors[0]


class JsonlTracker:
    """Appends one JSON object per step to run_dir/metrics.jsonl, flushed at every step."""

    def __init__(self, run_dir: str | pathlib.Path, filename: str = "metrics.jsonl"):
        self.path = pathlib.Path(run_dir) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._file is None:
            raise RuntimeError(f"JsonlTracker({self.path}): log after close")
        row = {"step": int(step), "time": time.time()}
        row.update({k: _finite_or_none(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _finite_or_none(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def load_history(path: str | pathlib.Path) -> list[dict]:
    """The rows of a metrics.jsonl (or of run_dir/metrics.jsonl), one per step, in step order.

    Lines of the same step are merged, later values winning (evaluation logged after training, or
    a step repeated after a resume). A truncated line (the run was killed mid-write) is skipped.
    """
    path = pathlib.Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    rows: dict[int, dict] = {}
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("%s:%d: skipping an unreadable line", path, number)
                continue
            rows.setdefault(int(row["step"]), {}).update(row)
    return [rows[s] for s in sorted(rows)]


class TensorBoardTracker:
    """Scalars to TensorBoard event files in run_dir/tb (tensorboardX; `tensorboard --logdir run_dir/tb`)."""

    def __init__(self, run_dir: str | pathlib.Path, flush_secs: int = 10, purge_step: int | None = None):
        """`purge_step`: a resumed run's first step; TensorBoard hides events the killed run wrote from it on."""
        from tensorboardX import SummaryWriter  # slow import: only when asked for

        self.logdir = pathlib.Path(run_dir) / "tb"
        self._writer = SummaryWriter(logdir=str(self.logdir), flush_secs=flush_secs, purge_step=purge_step)
        self._closed = False

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, float(value), global_step=int(step))

    def close(self) -> None:
        if not self._closed:
            self._writer.close()
            self._closed = True


class ConsoleTracker:
    """One progress line per step with the headline numbers, and the reward-hacking warning.

        step  12/100 [##........]  12% | success 0.450 | reward 0.520 | true 0.440 | stale 0.30 | loss 0.0123 | tok/s 1234

    Writes to `stream` if given (e.g. sys.stdout), else to this module's logger at INFO. Every
    step it asks `judge.reward_hacking_warning` about the history so far and writes the warning
    (at WARNING) when it appears or changes its reason, not on every step.
    """

    def __init__(self, total_steps: int | None = None, stream: TextIO | None = None, every: int = 1,
                 judge_window: int = judge.DEFAULT_WINDOW):
        if every < 1:
            raise ValueError(f"ConsoleTracker.every: must be >= 1, got {every}")
        self.total_steps = total_steps
        self.stream = stream
        self.every = every
        self.judge_window = judge_window
        self._history: list[dict] = []  # only the keys the judge reads, to stay small
        self._last_warning_rule: str | None = None
        self.warnings: list[str] = []  # every warning written, for the end-of-run summary

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self._history.append({"step": step, **{k: metrics[k] for k in judge.KEYS if k in metrics}})
        del self._history[: -4 * self.judge_window]
        if metrics and all(k.startswith("eval/") for k in metrics):
            self._write(logging.INFO, eval_line(step, metrics))
        elif step % self.every == 0 or step == self.total_steps:
            self._write(logging.INFO, progress_line(step, self.total_steps, metrics))
        warning = judge.reward_hacking_warning(self._history, window=self.judge_window)
        rule = warning.split(":", 1)[0] if warning else None
        if warning and rule != self._last_warning_rule:
            self.warnings.append(f"step {step}: {warning}")
            self._write(logging.WARNING, f"WARNING step {step}: {warning}")
        self._last_warning_rule = rule

    def close(self) -> None:
        if self.stream is not None:
            self.stream.flush()

    def _write(self, level: int, line: str) -> None:
        if self.stream is not None:
            print(line, file=self.stream, flush=True)
        else:
            logger.log(level, line)


def progress_line(step: int, total_steps: int | None, metrics: Mapping[str, float], width: int = 10) -> str:
    """The console line for one step; headline numbers that are missing are left out."""
    if total_steps:
        done = min(max(step / total_steps, 0.0), 1.0)
        filled = int(done * width)
        head = f"step {step:>{len(str(total_steps))}}/{total_steps} [{'#' * filled}{'.' * (width - filled)}] {done:4.0%}"
    else:
        head = f"step {step}"
    parts = [head]
    for label, key, fmt in (("success", SUCCESS, ".3f"), ("eval", EVAL_SUCCESS, ".3f"), ("reward", REWARD, ".3f"),
                            ("true", TRUE_METRIC, ".3f"), ("stale", STALENESS, ".2f"), ("loss", LOSS, ".4g"),
                            ("tok/s", ROLLOUT_TOKENS_PER_S, ".0f")):
        if key in metrics:
            value = float(metrics[key])
            parts.append(f"{label} {value:{fmt}}" if math.isfinite(value) else f"{label} {value}")
    errors = sum(float(v) for k, v in metrics.items() if k.startswith("infra/errors/"))
    if errors:
        parts.append(f"infra errors {errors:g}")
    return " | ".join(parts)


def eval_line(step: int, metrics: Mapping[str, float]) -> str:
    """The console line for an evaluation: the success rate of each env (`eval/<env>/success_rate`)."""
    rates = {k.removeprefix("eval/").removesuffix("success_rate").rstrip("/") or "all": float(v)
             for k, v in metrics.items() if k.endswith("success_rate")}
    shown = " | ".join(f"{env} success {rate:.3f}" for env, rate in sorted(rates.items()))
    return f"eval at step {step}: {shown or 'no success rates'}"


def stdout_console(total_steps: int | None = None) -> ConsoleTracker:
    """A ConsoleTracker on standard output (what `controller.main` shows)."""
    return ConsoleTracker(total_steps=total_steps, stream=sys.stdout)
