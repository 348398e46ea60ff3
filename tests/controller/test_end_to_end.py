"""End to end with real processes: `python -m controller.main` spawning two rollout workers over
gRPC on loopback, the calc env, warm start, GRPO steps, weight publishing, eval, report — and an
env submitted from a separate client process while the run goes on.

Proves: the metrics file has every step with the headline metrics; weight versions advance in
the trained trajectories (each step trains on the version published by the step before, so
staleness is 0 in sync mode); in async mode no admitted sample is older than the bound; the
submitted env is sampled; the report and summary are written.

Run: `.venv/bin/python -m pytest tests/controller/test_end_to_end.py -q` (about 2-4 minutes on 2 cores).
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).absolute().parents[2]
TINY = [
    "--set", "model.hidden_size=32", "--set", "model.num_layers=1", "--set", "model.vocab_size=320",
    "--set", "warm_start.steps=4", "--set", "warm_start.batch_size=8",
    "--set", "data.groups_per_step=4", "--set", "data.group_size=4", "--set", "data.skip_zero_advantage=false",
    "--set", "env.num_tasks=200", "--set", "eval.num_tasks=4", "--set", "eval.every=2",
    "--set", "fleet.slots=8", "--set", "checkpoint.every=0", "--set", "env.max_new_tokens_per_turn=24",
]


def _controller(run_dir: pathlib.Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "controller.main", "--mesh", "--run-dir", str(run_dir), "--rollout-workers", "2",
         *TINY, *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process: subprocess.Popen, timeout: float = 600) -> str:
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        pytest.fail(f"controller did not finish within {timeout}s:\n{out[-4000:]}")
    assert process.returncode == 0, out[-4000:]
    return out


def _jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_sync_run_with_two_workers_and_a_client_submitted_env(tmp_path):
    run_dir = tmp_path / "run"
    process = _controller(run_dir, "--steps", "4")
    port_file = run_dir / "controller.port"
    deadline = time.monotonic() + 180
    while not port_file.exists():
        assert process.poll() is None, process.stdout.read()[-4000:]
        assert time.monotonic() < deadline, "controller never wrote its port"
        time.sleep(0.2)
    submit = subprocess.run(
        [sys.executable, "-m", "controller.client", "--addr", f"127.0.0.1:{port_file.read_text().strip()}",
         "submit", str(ROOT / "examples/envs/calc_hard.yaml")],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60)
    assert submit.returncode == 0, submit.stderr
    out = _finish(process)

    metrics = [row for row in _jsonl(run_dir / "metrics.jsonl") if "learner/loss" in row or "reward/mean" in row]
    assert sorted({row["step"] for row in metrics}) == [0, 1, 2, 3]
    for key in ("rollout/success_rate", "reward/mean", "reward/true_metric", "rollout/turns",
                "rollout/tool_calls", "perf/weight_sync_s", "perf/step_s"):
        assert any(key in row for row in metrics), key

    trained = _jsonl(run_dir / "trajectories.jsonl")
    by_step = {}
    for row in trained:
        by_step.setdefault(row["step"], set()).update(row["versions"])
        assert row["versions"] == [row["learner_version"]]  # sync: made by the current policy
    steps = sorted(by_step)
    assert [max(by_step[s]) for s in steps] == sorted(max(by_step[s]) for s in steps)
    assert max(by_step[steps[-1]]) > min(by_step[steps[0]])  # versions advance
    assert any(row["env"] == "calc-hard" for row in trained), "the env submitted over gRPC was never sampled"
    assert (run_dir / "report.html").exists()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4
    assert "eval success after RL" in out


def test_async_run_respects_the_staleness_bound(tmp_path):
    run_dir = tmp_path / "run"
    out = _finish(_controller(run_dir, "--steps", "3", "--mode", "async", "--max-staleness", "1",
                              "--set", "learner.importance=tis"))
    trained = _jsonl(run_dir / "trajectories.jsonl")
    assert trained, out[-2000:]
    for row in trained:
        assert row["learner_version"] - min(row["versions"]) <= 1, row
    metrics = [row for row in _jsonl(run_dir / "metrics.jsonl") if "staleness/dropped" in row]
    assert len(metrics) == 3 and all("staleness/max" in row for row in metrics)
