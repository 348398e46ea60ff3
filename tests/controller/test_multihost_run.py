"""The controller as process 0 of a two-process learner: a real run on loopback.

Proves: `python -m controller.main --coordinator ... --num-processes 2` with one
`python -m learner.host` (2 CPU devices each, a data=2,fsdp=2 mesh over both processes) trains,
publishes to a rollout worker, checkpoints, and ends; the learner host follows every step and
exits 0 when the controller is done. The rollout worker is `rollout.server --engine fake`
(the learner is what is under test here; tests/learner/test_multihost.py checks its numbers).

Run: `.venv/bin/python -m pytest -q -p no:cacheprovider tests/controller/test_multihost_run.py`
(about a minute and a half).
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from model.factory import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("mh-model") / "tiny", vocab_size=300, hidden_size=32,
                           num_layers=2, num_heads=4, num_kv_heads=2)


def test_controller_drives_a_learner_host(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    port_file = tmp_path / "worker.port"
    worker = subprocess.Popen(
        [sys.executable, "-m", "rollout.server", "--engine", "fake", "--model", str(tiny_model_dir),
         "--worker-id", "w0", "--listen", "127.0.0.1:0", "--port-file", str(port_file),
         "--weights-root", str(run_dir / "weights")],
        cwd=ROOT, env=_env(), stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT)
    coordinator = f"127.0.0.1:{_free_port()}"
    host = subprocess.Popen(
        [sys.executable, "-m", "learner.host", "--coordinator", coordinator, "--num-processes", "2",
         "--process-id", "1", "--local-cpu-devices", "2", "--timeout-s", "240"],
        cwd=ROOT, env=_env(), stdout=open(tmp_path / "host.log", "w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not (port_file.exists() and port_file.read_text().strip()):
            assert worker.poll() is None and time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.1)
        controller = subprocess.run(
            [sys.executable, "-m", "controller.main", "--mesh", "data=2,fsdp=2", "--run-dir", str(run_dir),
             "--coordinator", coordinator, "--num-processes", "2", "--steps", "2",
             "--rollout-addresses", f"127.0.0.1:{int(port_file.read_text())}",
             "--set", "distributed.local_cpu_devices=2", "--set", f"model.path={tiny_model_dir}",
             "--set", "warm_start.steps=0", "--set", "data.groups_per_step=2", "--set", "data.group_size=2",
             "--set", "data.skip_zero_advantage=false", "--set", "eval.num_tasks=2", "--set", "eval.every=2",
             "--set", "checkpoint.every=1", "--set", "env.num_tasks=40", "--set", "env.max_new_tokens_per_turn=8"],
            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=480)
        assert controller.returncode == 0, controller.stderr[-5000:]
        assert host.wait(timeout=120) == 0, (tmp_path / "host.log").read_text()[-4000:]
    finally:
        for process in (host, worker):
            if process.poll() is None:
                process.kill()
                process.wait()
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [line for line in lines if "learner/loss" in line]
    assert len(losses) == 2
    host_log = (tmp_path / "host.log").read_text()
    assert "process 1 of 2, 2 local / 4 global devices" in host_log
    assert "stop after" in host_log
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()) == ["1", "2"]
