"""Fault injection with real processes: rollout workers SIGKILLed and SIGSTOPped at seeded random
moments, gRPC errors and latency injected into the workers' servers (tests/faults/inject), a
remote env server SIGKILLed, restarted and SIGSTOPped mid-run, a controller SIGKILLed while its
remote workers live on, and a corrupt weight snapshot.

The invariants checked after each run:
- the run finishes (exit 0, every step trained, one metrics line per step);
- no group is lost: in every step, trained groups + groups dropped (counted under
  `infra/errors/group_dropped`) = groups_per_step; no trajectory id is trained twice;
- no infra error became a reward: nothing trained ended in `infra_error`, and the injected
  failures show up in `infra/errors/worker_lost` (at least one count per injected error),
  a failed weight update in `infra/errors/weight_update_failed`, and each worker replaced after
  a kill or a freeze in `infra/errors/worker_restarted`;
- sync mode: every trained token was made by the version the learner had (a restarted or
  frozen-then-replaced worker loaded the current weights before it served);
- no process is left behind: every process the controller spawned at any moment has ended.

ORRERY_FAULT_SEED changes the seed (default 0). The soak variant (`-m slow`, or
ORRERY_SOAK_STEPS=N to size it) runs longer with faults struck throughout.

Run: `.venv/bin/python -m pytest tests/faults/test_faults.py -q` (about 5 minutes on 2 cores).
"""

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

from tests.faults.harness import (INJECT, ROOT, Run, alive, final_weights, left_behind, make_tiny_model,
                                  metric_lines, sum_metric, trained, training_lines)

SEED = int(os.environ.get("ORRERY_FAULT_SEED", "0"))
GROUPS = 4  # harness.TINY data.groups_per_step
DEADLINES = ["--set", "fleet.rollout_deadline_s=30", "--set", "fleet.call_deadline_s=15"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model"))


class Watcher:
    """Remembers every process below the controller while the run goes (restarted workers too)."""

    def __init__(self, run: Run):
        self.run, self.seen, self._stop = run, set(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.seen |= self.run.descendants()

    def workers(self) -> list[int]:
        """Live rollout worker processes of the run, oldest first."""
        found = []
        for pid in sorted(self.run.descendants()):
            try:
                cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"rollout.server" in cmdline and alive(pid):
                found.append(pid)
        return found

    def stop(self) -> set[int]:
        self._stop.set()
        self._thread.join()
        return self.seen


def _after_step(run: Run, step: int) -> None:
    run.wait_for(lambda: any(row["step"] >= step for row in training_lines(run.run_dir)), f"step {step}")


def check_invariants(run_dir: pathlib.Path, steps: int, *, sync: bool) -> None:
    lines = training_lines(run_dir)
    assert [row["step"] for row in lines] == list(range(steps))
    rows = trained(run_dir)
    ids = [row["trajectory_id"] for row in rows]
    assert len(ids) == len(set(ids)), "a trajectory was trained on twice"
    assert all(row["termination"] != "infra_error" for row in rows), "an infra error was trained on"
    for line in lines:
        step_groups = {row["group_id"] for row in rows if row["step"] == line["step"]}
        dropped = line.get("infra/errors/group_dropped") or 0.0
        assert len(step_groups) + dropped == GROUPS, f"step {line['step']}: groups lost ({line})"
    if sync:
        for row in rows:
            assert row["versions"] == [row["learner_version"]], row


def test_workers_killed_frozen_and_failing_over_grpc_at_random_moments(tmp_path, tiny_model):
    steps = 6
    rng = random.Random(f"workers/{SEED}")
    log = tmp_path / "injected.jsonl"
    faults = {"seed": SEED, "rollout_error_rate": 0.25, "latency_rate": 0.2, "latency_s": 1.0,
              "update_error_every": 3, "log": str(log)}
    run = Run.start(tmp_path / "run", tiny_model, "--steps", str(steps), "--set", "eval.every=0", *DEADLINES,
                    extra_env={"PYTHONPATH": f"{ROOT}{os.pathsep}{INJECT}", "ORRERY_FAULTS": json.dumps(faults)})
    watcher = Watcher(run)
    kill_step = rng.randrange(0, 2)
    stop_step = rng.randrange(kill_step + 1, 3)
    _after_step(run, kill_step)
    time.sleep(rng.uniform(0.0, 1.5))
    killed = rng.choice(watcher.workers())
    os.kill(killed, signal.SIGKILL)
    killed_lines = len(training_lines(run.run_dir))
    _after_step(run, stop_step)
    time.sleep(rng.uniform(0.0, 1.5))
    frozen = rng.choice(watcher.workers())
    os.kill(frozen, signal.SIGSTOP)
    frozen_lines = len(training_lines(run.run_dir))
    moment = f"seed {SEED}: SIGKILL pid {killed} after step {kill_step}, SIGSTOP pid {frozen} after step {stop_step}"

    out = run.finish()
    seen = watcher.stop()
    assert not left_behind(seen), f"{moment}: processes left behind"
    # Every publish goes to every worker, so one that starts after a fault must meet it. Step m's
    # publish may precede the line count m seen at the fault; step m + 1's cannot.
    if killed_lines <= steps - 2:
        assert "died (exit" in out, moment
    if frozen_lines <= steps - 2:
        assert "does not answer" in out, moment
    check_invariants(run.run_dir, steps, sync=True)
    injected = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    rollout_errors = sum(1 for i in injected if i["method"] == "RolloutGroup" and i["fault"] == "unavailable")
    assert rollout_errors > 0 and any(i["method"] == "UpdateWeights" for i in injected), injected
    assert sum_metric(run.run_dir, "infra/errors/worker_lost") >= rollout_errors, moment
    assert sum_metric(run.run_dir, "infra/errors/weight_update_failed") > 0, moment
    detected = ("died (exit" in out) + ("does not answer" in out)
    assert sum_metric(run.run_dir, "infra/errors/worker_restarted") >= detected, moment


def test_controller_killed_while_remote_workers_live_reattaches_to_them(tmp_path, tiny_model):
    steps = 3
    workers = [_start_worker(tmp_path, tiny_model, f"remote-{i}") for i in range(2)]
    try:
        addresses = ",".join(address for _, address in workers)
        args = ["--steps", str(steps), "--rollout-addresses", addresses]
        run = Run.start(tmp_path / "run", tiny_model, *args)
        run.wait_for(lambda: (run.run_dir / "checkpoints" / "1").exists(), "checkpoint 1")
        time.sleep(random.Random(f"reattach/{SEED}").uniform(0.0, 1.5))
        run.sigkill()
        assert all(process.poll() is None for process, _ in workers), "a remote worker died with the controller"
        out = Run.start(run.run_dir, None, *args, "--resume").finish()
        assert "resumed at step" in out
        check_invariants(run.run_dir, steps, sync=True)
        final = final_weights(run.run_dir)
        from rollout.client import RolloutClient

        for _, address in workers:
            with RolloutClient(address) as client:
                assert client.info(deadline_s=30).version == final["version"]
    finally:
        for process, _ in workers:
            process.kill()
            process.wait()


def _start_worker(tmp_path: pathlib.Path, model: pathlib.Path, name: str) -> tuple[subprocess.Popen, str]:
    port_file = tmp_path / f"{name}.port"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("XLA_FLAGS", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "rollout.server", "--model", str(model), "--worker-id", name, "--slots", "8",
         "--port-file", str(port_file), "--weights-root", str(tmp_path), "--seed", "0"],
        cwd=ROOT, env=env, stdout=open(tmp_path / f"{name}.log", "w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not (port_file.exists() and port_file.read_text().strip()):
        assert process.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "worker never reported its port"
        time.sleep(0.1)
    return process, f"127.0.0.1:{int(port_file.read_text())}"


def test_corrupt_snapshot_is_rejected_and_the_worker_keeps_serving_the_old_version(tmp_path, tiny_model):
    import jax
    import numpy as np

    from controller.config import EnvConfig
    from controller.tasks import default_task_lister
    from controller.warmstart import default_env_spec
    from model.hf_io import load_hf
    from model.weights import WeightVersion, save_snapshot
    from rollout.api import GroupRequest, SamplingParams
    from rollout.client import RolloutClient, RolloutError

    process, address = _start_worker(tmp_path, tiny_model, "worker")
    try:
        _, params = load_hf(tiny_model)
        good = save_snapshot(params, tmp_path / "weights", 1, step=1)
        bad = save_snapshot(jax.tree.map(lambda x: np.asarray(x) + 0.01, params), tmp_path / "weights", 2, step=2)
        with RolloutClient(address) as client:
            assert client.update_weights(good, deadline_s=60).version == 1
            wrong_digest = WeightVersion.from_dict({**bad.to_dict(), "digest": good.digest})
            with pytest.raises(RolloutError) as refused:
                client.update_weights(wrong_digest, deadline_s=60)
            assert "digest" in str(refused.value)
            for path in sorted(pathlib.Path(bad.location).rglob("*")):  # bytes on disk flipped
                if path.is_file() and path.name != "weight_version.json" and path.stat().st_size > 64:
                    data = bytearray(path.read_bytes())
                    data[len(data) // 2] ^= 0xFF
                    path.write_bytes(bytes(data))
            with pytest.raises(RolloutError):
                client.update_weights(bad, deadline_s=60)
            assert client.info(deadline_s=30).version == 1
            spec = default_env_spec(EnvConfig(num_tasks=20))
            task = default_task_lister(spec)[0]
            group = list(client.rollout_group(GroupRequest(
                group_id="after-corrupt", env=spec, task=task, group_size=2,
                sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=1)), deadline_s=120))
            assert len(group) == 2
            assert {v for t in group for turn in t.policy_turns for v in turn.versions} == {1}
    finally:
        process.kill()
        process.wait()


@pytest.mark.slow
def test_soak_faults_struck_throughout_a_longer_run(tmp_path, tiny_model):
    """Workers killed and frozen, the controller killed and resumed, gRPC faults, all at seeded
    random moments until the run ends; then the same invariants (sync mode)."""
    steps = int(os.environ.get("ORRERY_SOAK_STEPS", "20"))
    rng = random.Random(f"soak/{SEED}")
    faults = {"seed": SEED, "rollout_error_rate": 0.1, "latency_rate": 0.1, "latency_s": 2.0,
              "update_error_every": 7, "log": str(tmp_path / "injected.jsonl")}
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{INJECT}", "ORRERY_FAULTS": json.dumps(faults)}
    args = ["--steps", str(steps), "--set", "eval.every=5", *DEADLINES]
    run = Run.start(tmp_path / "run", tiny_model, *args, extra_env=env)
    seen, struck = set(), []
    while True:
        watcher = Watcher(run)
        deadline = time.monotonic() + rng.uniform(5.0, 40.0)
        while run.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        seen |= watcher.stop()
        if run.process.poll() is not None:
            break
        action, workers = rng.choice(["kill worker", "freeze worker", "kill controller"]), watcher.workers()
        struck.append(action)
        if action == "kill controller":
            seen |= run.sigkill()
            run = Run.start(run.run_dir, None, *args, "--resume", extra_env=env)
        elif workers:
            os.kill(rng.choice(workers), signal.SIGKILL if action == "kill worker" else signal.SIGSTOP)
    assert run.process.returncode == 0, (struck, run.output()[-4000:])
    assert not left_behind(seen), f"processes left behind after {struck}"
    check_invariants(run.run_dir, steps, sync=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_env_server(tmp_path: pathlib.Path, port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen([sys.executable, "-m", "sandbox.remote_example", "--listen", f"127.0.0.1:{port}"],
                               cwd=ROOT, env=env, stdout=open(tmp_path / "env_server.log", "a"),
                               stderr=subprocess.STDOUT)
    from sandbox.api import EnvSpec
    from sandbox.client import list_remote_tasks

    deadline = time.monotonic() + 120
    while True:  # serving once it lists its tasks
        try:
            list_remote_tasks(EnvSpec(name="probe", kind="remote", remote_address=f"127.0.0.1:{port}"))
            return process
        except Exception:  # noqa: BLE001 - not up yet
            assert process.poll() is None and time.monotonic() < deadline, "env server did not come up"
            time.sleep(0.3)


def test_env_server_down_killed_then_frozen_mid_run_is_counted_never_rewarded(tmp_path, tiny_model):
    """The env is submitted while its server is down (its task list cannot be fetched), then the
    server comes up, is SIGKILLed, restarted, SIGSTOPped and continued, each at a seeded moment."""
    steps = 10
    rng = random.Random(f"env/{SEED}")
    port = _free_port()
    server = None
    spec = tmp_path / "vowels.yaml"
    spec.write_text(f"name: vowels\nkind: remote\nremote_address: 127.0.0.1:{port}\n"
                    "args: {num_tasks: 64, eval_fraction: 0.125}\n"
                    "budgets: {max_turns: 3, max_new_tokens_per_turn: 24, max_total_tokens: 256}\n")
    run = Run.start(tmp_path / "run", tiny_model, "--steps", str(steps), "--set", "eval.every=0")
    watcher = Watcher(run)
    try:
        run.wait_for(lambda: (run.run_dir / "controller.port").exists(), "controller port")
        submitted = subprocess.run(
            [sys.executable, "-m", "controller.client", "--addr",
             f"127.0.0.1:{(run.run_dir / 'controller.port').read_text().strip()}", "submit", str(spec)],
            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=120)
        assert submitted.returncode == 0, submitted.stderr
        run.wait_for(lambda: sum_metric(run.run_dir, "infra/errors/env_unreachable") > 0,
                     "a vowels group counted while its server was down")
        server = _start_env_server(tmp_path, port)
        run.wait_for(lambda: any(row["env"] == "vowels" for row in trained(run.run_dir)), "a trained vowels group")
        unreachable = sum_metric(run.run_dir, "infra/errors/env_unreachable")
        time.sleep(rng.uniform(0.0, 1.5))
        server.kill()
        server.wait()
        run.wait_for(lambda: sum_metric(run.run_dir, "infra/errors/env_unreachable") > unreachable,
                     "a vowels group counted after its server was killed")
        server = _start_env_server(tmp_path, port)
        frozen_at = len(training_lines(run.run_dir))
        time.sleep(rng.uniform(0.0, 1.5))
        os.kill(server.pid, signal.SIGSTOP)
        run.wait_for(lambda: len(training_lines(run.run_dir)) >= frozen_at + 1, "a step with the env server frozen")
        os.kill(server.pid, signal.SIGCONT)
        run.finish()
    finally:
        if server is not None:
            server.kill()
            server.wait()
    assert not left_behind(watcher.stop()), "processes left behind"
    check_invariants(run.run_dir, steps, sync=True)
    vowels_steps = sorted({row["step"] for row in trained(run.run_dir) if row["env"] == "vowels"})
    assert vowels_steps and vowels_steps[-1] >= frozen_at, "the env was not trained on again after it recovered"
