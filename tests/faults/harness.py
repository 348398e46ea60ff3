"""What the fault and resume tests share: a tiny real run of `python -m controller.main`, the
processes it spawned, seeded moments to strike, and the run's records.

A run here is the CPU demo shrunk (1-layer 32-wide model, 4 groups x 4 samples, 2 rollout workers
over gRPC on loopback) with a checkpoint after every step. Its warm start is too short for the
policy to solve anything, so every reward is 0 and GRPO advantages vanish; the small entropy bonus
and KL term make every update move the parameters by an amount that depends on the sampled tokens,
so comparing final parameters compares everything that was trained on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

ROOT = pathlib.Path(__file__).absolute().parents[2]
INJECT = pathlib.Path(__file__).absolute().parent / "inject"

TINY = [
    "--set", "model.hidden_size=32", "--set", "model.num_layers=1", "--set", "model.vocab_size=320",
    "--set", "warm_start.steps=4", "--set", "warm_start.batch_size=8",
    "--set", "data.groups_per_step=4", "--set", "data.group_size=4", "--set", "data.skip_zero_advantage=false",
    "--set", "env.num_tasks=200", "--set", "eval.num_tasks=4", "--set", "eval.every=2",
    "--set", "fleet.slots=8", "--set", "env.max_new_tokens_per_turn=24",
    "--set", "checkpoint.every=1", "--set", "learner.entropy_coef=0.01", "--set", "learner.kl_coef=0.05",
]

# Metric keys that differ between two identical runs by nature: wall-clock durations and rates.
# `learner/logprob_gap*` compares the engine's behaviour logprobs with the learner's; their last bits
# depend on how the engine batched a sample (which prefill shape, whether a cached prefix was reused),
# not on anything trained on, so they are compared to 1e-6 rather than bit for bit.
TIMING = ("time",)
NEAR = ("learner/logprob_gap", "learner/logprob_gap_max")


def is_timing(key: str) -> bool:
    return key in TIMING or key.startswith("perf/") or key.endswith("_s")


def make_tiny_model(folder: pathlib.Path) -> pathlib.Path:
    """The HF folder the TINY runs use (made once per test session, copied into each run dir)."""
    from controller import config as config_lib
    from controller import warmstart

    config = config_lib.load(None, tuple(TINY[1::2]))
    return warmstart.ensure_model(config.model, folder, warmstart.default_env_spec(config.env))


@dataclasses.dataclass
class Run:
    """One `python -m controller.main` process on `run_dir` (output in run_dir.parent/<name>.log)."""

    run_dir: pathlib.Path
    process: subprocess.Popen
    log: pathlib.Path

    @classmethod
    def start(cls, run_dir: pathlib.Path, model: pathlib.Path | None, *args: str, mesh: str = "",
              devices: int = 0, extra_env: dict[str, str] | None = None, workers: int = 2) -> Run:
        run_dir.mkdir(parents=True, exist_ok=True)
        if model is not None and not (run_dir / "model").exists():
            shutil.copytree(model, run_dir / "model")
        env = {**os.environ, "PYTHONPATH": str(ROOT), **(extra_env or {})}
        env.pop("XLA_FLAGS", None)
        if devices:
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
        log = run_dir.parent / f"{run_dir.name}.{int(time.time() * 1000) % 10**8}.log"
        mesh_args = ["--mesh", mesh] if mesh else ["--mesh"]
        with open(log, "w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "controller.main", *mesh_args, "--run-dir", str(run_dir),
                 "--rollout-workers", str(workers), *TINY, *args],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        return cls(run_dir, process, log)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def finish(self, timeout: float = 600) -> str:
        """Wait for the run to end; it must exit 0."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"controller did not finish within {timeout}s:\n{self.output()[-4000:]}")
        assert self.process.returncode == 0, self.output()[-4000:]
        return self.output()

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                raise AssertionError(f"controller exited ({self.process.returncode}) before {what}:\n"
                                     f"{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {timeout}s:\n{self.output()[-4000:]}")
            time.sleep(0.1)

    def descendants(self) -> set[int]:
        return descendants(self.process.pid)

    def sigkill(self) -> set[int]:
        """SIGKILL the controller (only it); returns the processes it had spawned."""
        spawned = self.descendants()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        return spawned


def _parents() -> dict[int, int]:
    parents = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return parents


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (children, their children, ...)."""
    parents = _parents()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def left_behind(pids: set[int], timeout: float = 60) -> set[int]:
    """The pids still alive after `timeout` seconds (empty when all ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        living = {p for p in pids if alive(p)}
        if not living:
            return set()
        time.sleep(0.2)
    return {p for p in pids if alive(p)}


def jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def metric_lines(run_dir: pathlib.Path) -> list[dict]:
    return jsonl(run_dir / "metrics.jsonl")


def training_lines(run_dir: pathlib.Path) -> list[dict]:
    """The one line per step the loop writes (evaluation lines carry only eval/ keys)."""
    return [row for row in metric_lines(run_dir) if "learner/loss" in row or "batch/groups" in row]


def trained(run_dir: pathlib.Path) -> list[dict]:
    return jsonl(run_dir / "trajectories.jsonl")


def final_weights(run_dir: pathlib.Path) -> dict:
    """The WeightVersion of the newest snapshot (its digest is the final parameters')."""
    newest = sorted((run_dir / "weights").glob("v*"))[-1]
    return json.loads((newest / "weight_version.json").read_text())


def checkpoint_extra(run_dir: pathlib.Path, step: int) -> dict:
    """The pipeline state a checkpoint saved next to the learner state (Orbax writes it as JSON)."""
    return json.loads((run_dir / "checkpoints" / str(step) / "extra" / "metadata").read_text())


def sum_metric(run_dir: pathlib.Path, key: str) -> float:
    return sum(row.get(key) or 0.0 for row in training_lines(run_dir))
