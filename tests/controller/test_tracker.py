"""Trackers: the files they write parse back to what was logged; the console line and warning.

Run: `.venv/bin/python -m pytest tests/controller/test_tracker.py`.
"""

import io
import json
import math
import struct

import pytest

from controller.service import RunStatus
from controller.tracker import (ConsoleTracker, JsonlTracker, MultiTracker, NullTracker, TensorBoardTracker,
                                load_history, progress_line)


def test_jsonl_one_object_per_step_and_nan_as_null(tmp_path):
    tracker = JsonlTracker(tmp_path)
    tracker.log(1, {"rollout/success_rate": 0.25, "infra/errors/tool_timeout": 2})
    tracker.log(2, {"rollout/success_rate": 0.5, "learner/loss": float("nan")})
    tracker.close()
    tracker.close()  # twice is fine
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    first, second = (json.loads(line) for line in lines)  # strict JSON: no NaN tokens
    assert first["step"] == 1 and isinstance(first["time"], float)
    assert first["rollout/success_rate"] == 0.25 and first["infra/errors/tool_timeout"] == 2.0
    assert second["learner/loss"] is None
    with pytest.raises(RuntimeError, match="after close"):
        tracker.log(3, {})


def test_jsonl_appends_on_resume_and_history_keeps_last_row_per_step(tmp_path):
    first = JsonlTracker(tmp_path)
    for step in (1, 2, 3):
        first.log(step, {"reward/mean": step})
    first.close()
    resumed = JsonlTracker(tmp_path)  # a crash after step 3, resumed from a step-2 checkpoint
    resumed.log(3, {"reward/mean": 30})
    resumed.log(4, {"reward/mean": 40})
    resumed.log(4, {"eval/calc/success_rate": 0.5})  # evaluation after step 4: merged into its row
    resumed.close()
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 5, "rew')  # killed mid-write
    history = load_history(tmp_path)
    assert [(r["step"], r["reward/mean"]) for r in history] == [(1, 1), (2, 2), (3, 30), (4, 40)]
    assert history[3]["eval/calc/success_rate"] == 0.5 and "eval/calc/success_rate" not in history[2]


def _read_events(path):
    """Events of one TFRecord file: [u64 length][u32 crc][data][u32 crc] per record."""
    from tensorboardX.proto import event_pb2

    data, events, offset = path.read_bytes(), [], 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset:offset + 8])
        event = event_pb2.Event()
        event.ParseFromString(data[offset + 12:offset + 12 + length])
        events.append(event)
        offset += 12 + length + 4
    return events


def test_tensorboard_scalars_in_run_dir_tb(tmp_path):
    tracker = TensorBoardTracker(tmp_path)
    tracker.log(1, {"reward/mean": 0.5, "learner/loss": 2.0})
    tracker.log(2, {"reward/mean": 0.75})
    tracker.close()
    (event_file,) = (tmp_path / "tb").iterdir()
    scalars = [(e.step, v.tag, v.simple_value) for e in _read_events(event_file) for v in e.summary.value]
    assert scalars == [(1, "reward/mean", 0.5), (1, "learner/loss", 2.0), (2, "reward/mean", 0.75)]


def test_progress_line_headline_numbers():
    metrics = {"rollout/success_rate": 0.45, "reward/mean": 0.52, "reward/true_metric": 0.44, "staleness/mean": 0.3,
               "learner/loss": 0.0123, "perf/rollout_tokens_per_s": 1234.4, "infra/errors/worker_lost": 1.0,
               "learner/kl": 9.0}
    assert progress_line(12, 100, metrics) == (
        "step  12/100 [#.........]  12% | success 0.450 | reward 0.520 | true 0.440 | stale 0.30 | "
        "loss 0.0123 | tok/s 1234 | infra errors 1")
    assert progress_line(3, None, {"learner/loss": float("nan")}) == "step 3 | loss nan"


def test_console_writes_a_line_per_step_and_warns_once_on_reward_hacking():
    out = io.StringIO()
    console = ConsoleTracker(total_steps=12, stream=out, judge_window=10)
    for step in range(1, 13):  # reward .1 * step up, true metric .9 - .05 * step down
        console.log(step, {"reward/mean": 0.1 * step, "reward/true_metric": 0.9 - 0.05 * step})
    console.close()
    lines = out.getvalue().splitlines()
    progress = [line for line in lines if line.startswith("step")]
    warnings = [line for line in lines if line.startswith("WARNING")]
    assert len(progress) == 12 and progress[-1].startswith("step 12/12 [##########] 100%")
    # judge needs 8 steps: the first warning comes at step 8, and it is not repeated
    assert len(warnings) == 1 and warnings[0].startswith("WARNING step 8: reward rose while the true metric fell")
    assert console.warnings == [warnings[0].removeprefix("WARNING ")]


def test_console_eval_line():
    out = io.StringIO()
    ConsoleTracker(total_steps=10, stream=out).log(5, {"eval/calc/success_rate": 0.45, "eval/calc/turns": 2.0,
                                                       "eval/calc-hard/success_rate": 0.125})
    assert out.getvalue() == "eval at step 5: calc success 0.450 | calc-hard success 0.125\n"


def test_console_logs_through_logging_without_a_stream(caplog):
    caplog.set_level("INFO", logger="controller.tracker")
    ConsoleTracker(total_steps=2).log(1, {"reward/mean": 1.0})
    assert [r.getMessage() for r in caplog.records] == ["step 1/2 [#####.....]  50% | reward 1.000"]


def test_multi_tracker_fans_out_and_closes_all(tmp_path):
    status = RunStatus()
    q = status.subscribe()

    class Broken(NullTracker):
        def close(self):
            raise OSError("disk full")

    jsonl = JsonlTracker(tmp_path)
    multi = MultiTracker([jsonl, status, Broken()])
    multi.log(7, {"reward/mean": 0.5})
    assert q.get_nowait() == (7, {"reward/mean": 0.5}) and status.snapshot().step == 7
    with pytest.raises(OSError, match="disk full"):
        multi.close()
    assert status.snapshot().finished and q.get_nowait() is None  # closed although a later one failed
    assert load_history(tmp_path)[0]["reward/mean"] == 0.5
    assert not math.isnan(load_history(tmp_path)[0]["time"])
