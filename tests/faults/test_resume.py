"""Crash-consistent resume with real processes: the controller is SIGKILLed at a seeded random
moment, then `--resume`d.

Proves:
- sync mode: the resumed run ends with bit-identical parameters (the final snapshot's sha256
  digest), the same trained trajectories (trajectories.jsonl line for line) and the same metric
  lines as an uninterrupted run, except wall-clock durations and the engine-vs-learner logprob
  gap (equal to 1e-6; see harness.NEAR);
- metrics.jsonl has exactly one training line per step: the killed run's lines past the
  checkpoint are cut, none are repeated or skipped;
- the killed controller's rollout workers end with it (no orphans);
- async mode, resumed from a chosen earlier checkpoint on a different mesh (2 devices,
  data=2): no trajectory is trained twice, the groups that were in flight or buffered at the
  checkpoint are regenerated under their ids and trained, the staleness bound holds;
- `--resume` with a step that has no checkpoint, or that is not a number, is a one-line error.

The kill moment: after checkpoint k (k drawn from 0..steps-1; 0 = before any checkpoint, so the
resume starts afresh) plus a random delay. ORRERY_FAULT_SEED changes the seed (default 0); the
chosen moment is in every failure message.

Run: `.venv/bin/python -m pytest tests/faults/test_resume.py -q` (about 3-5 minutes on 2 cores).
"""

import json
import os
import random
import subprocess
import sys
import time

import pytest

from tests.faults.harness import (NEAR, ROOT, Run, checkpoint_extra, final_weights, is_timing, left_behind,
                                  make_tiny_model, metric_lines, trained, training_lines)

SEED = int(os.environ.get("ORRERY_FAULT_SEED", "0"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model"))


def _kill_at_random(run: Run, rng: random.Random, steps: int) -> tuple[str, set[int]]:
    """SIGKILL the controller after checkpoint k and a random delay; returns (the moment, its workers)."""
    k = rng.randrange(steps)
    delay = rng.uniform(0.0, 2.0)
    if k == 0:
        run.wait_for(lambda: (run.run_dir / "controller.port").exists(), "controller port")
    else:
        run.wait_for(lambda: (run.run_dir / "checkpoints" / str(k)).exists(), f"checkpoint {k}")
    time.sleep(delay)
    run.wait_for(lambda: len(run.descendants()) >= 2, "two rollout workers")
    moment = f"seed {SEED}: killed {delay:.2f}s after {'start' if k == 0 else f'checkpoint {k}'}"
    return moment, run.sigkill()


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not is_timing(k) and k not in NEAR} for row in rows]


def test_sync_run_killed_at_a_random_moment_resumes_to_the_same_parameters_and_metrics(tmp_path, tiny_model):
    steps = 3
    rng = random.Random(f"sync/{SEED}")
    baseline = Run.start(tmp_path / "baseline", tiny_model, "--steps", str(steps))
    killed = Run.start(tmp_path / "killed", tiny_model, "--steps", str(steps))
    moment, workers = _kill_at_random(killed, rng, steps)
    assert len(workers) >= 2, moment
    assert not left_behind(workers), f"{moment}: rollout workers outlived their controller"

    resumed = Run.start(killed.run_dir, None, "--steps", str(steps), "--resume")
    out = resumed.finish()
    baseline.finish()

    assert "resumed at step" in out or "start" in moment, moment
    assert final_weights(killed.run_dir)["digest"] == final_weights(baseline.run_dir)["digest"], moment
    assert final_weights(killed.run_dir)["version"] == final_weights(baseline.run_dir)["version"], moment
    assert trained(killed.run_dir) == trained(baseline.run_dir), moment
    want, got = metric_lines(baseline.run_dir), metric_lines(killed.run_dir)
    assert [row["step"] for row in got] == [row["step"] for row in want], moment
    assert _comparable(got) == _comparable(want), moment
    for a, b in zip(want, got):
        for key in NEAR:
            assert (key in a) == (key in b) and abs((a.get(key) or 0.0) - (b.get(key) or 0.0)) <= 1e-6, (moment, key)
    assert [row["step"] for row in training_lines(killed.run_dir)] == list(range(steps)), moment
    assert _summary(killed.run_dir) == _summary(baseline.run_dir), moment


def _summary(run_dir) -> str:
    summary = json.loads((run_dir / "summary.json").read_text())
    return json.dumps({k: v for k, v in summary.items() if not (k.endswith("_per_s") or k.endswith("_s"))})


def test_async_run_resumed_from_a_chosen_checkpoint_on_another_mesh_trains_each_trajectory_once(
        tmp_path, tiny_model):
    steps, chosen = 4, 2
    rng = random.Random(f"async/{SEED}")
    args = ["--steps", str(steps), "--mode", "async", "--max-staleness", "1", "--set", "learner.importance=tis"]
    run = Run.start(tmp_path / "async", tiny_model, *args)
    run.wait_for(lambda: (run.run_dir / "checkpoints" / str(chosen + 1)).exists(), f"checkpoint {chosen + 1}")
    time.sleep(rng.uniform(0.0, 2.0))
    workers = run.sigkill()
    assert not left_behind(workers), "rollout workers outlived their controller"
    pending = {item["group_id"] for item in checkpoint_extra(run.run_dir, chosen)["pending"]}
    assert len(pending) >= 4  # the fleet keeps groups_per_step groups in flight

    resumed = Run.start(run.run_dir, None, *args, "--resume", str(chosen), mesh="data=2", devices=2)
    out = resumed.finish()
    assert "data=2" in out and f"resumed at step {chosen}" in out

    rows = trained(run.run_dir)
    ids = [row["trajectory_id"] for row in rows]
    assert len(ids) == len(set(ids)), "a trajectory was trained on twice"
    step_of_group = {}
    for row in rows:
        assert step_of_group.setdefault(row["group_id"], row["step"]) == row["step"], row
        assert row["learner_version"] - min(row["versions"]) <= 1, row
    regenerated = {g for g, step in step_of_group.items() if step >= chosen}
    assert pending <= regenerated, f"in-flight groups lost on resume: {sorted(pending - regenerated)}"
    assert sorted({row["step"] for row in rows}) == list(range(steps))
    assert [row["step"] for row in training_lines(run.run_dir)] == list(range(steps))


def test_resume_errors_name_the_value(tmp_path, tiny_model):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    bad = subprocess.run([sys.executable, "-m", "controller.main", "--mesh", "--resume", "latest-ish"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == \
        "error: --resume STEP must be a checkpoint step (an integer >= 0), got 'latest-ish'"

    run_dir = tmp_path / "empty"
    missing = Run.start(run_dir, tiny_model, "--steps", "1", "--resume", "7")
    missing.process.wait(timeout=300)
    assert missing.process.returncode == 2, missing.output()[-3000:]
    assert missing.output().strip().splitlines()[-1] == \
        f"error: --resume 7: no checkpoint 7 in {run_dir / 'checkpoints'}; the checkpoints there are none"
