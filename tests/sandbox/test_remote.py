"""Remote envs over real gRPC on loopback, with the example server as a real separate process.

Proves: `open_env` on a kind="remote" spec plays a full episode against
`python -m sandbox.remote_example` (tasks, tools, steps, verdicts, outcome) exactly like a
built-in env; built-in envs served by `BuiltinEnvHost` round-trip too; an unreachable address, a
server slower than the deadline and a server that dies mid-episode each end within a bounded time
as EnvInfraError (ENV_UNREACHABLE / ENV_TIMEOUT), never a reward; an env's own infra error
crosses the wire with its class; health reports SERVING.

Run: .venv/bin/python -m pytest tests/sandbox/test_remote.py -q
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sandbox.api import EnvInfraError, EnvSpec, InfraErrorClass, Outcome, Task, ToolCall
from sandbox.client import list_remote_tasks, list_tasks, open_env
from sandbox.config import SandboxConfig
from sandbox.service import BuiltinEnvHost, serve_env

ROOT = Path(__file__).resolve().parents[2]
FAST = SandboxConfig(remote_timeout_s=2.0, remote_retries=2, remote_backoff_s=0.05)


def start_example(*flags: str):
    proc = subprocess.Popen([sys.executable, "-m", "sandbox.remote_example", "--listen", "127.0.0.1:0", *flags],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline()  # "listening on port N", or "" if it died
    assert line.startswith("listening on port"), f"example server failed to start: {line!r}"
    return proc, f"127.0.0.1:{int(line.split()[-1])}"


@pytest.fixture
def example():
    started = []

    def start(*flags):
        proc, address = start_example(*flags)
        started.append(proc)
        return proc, address
    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def remote_spec(address: str, **args) -> EnvSpec:
    return EnvSpec("vowels", "remote", {"num_tasks": 8, "seed": 1, **args}, remote_address=address)


def test_full_episode_against_the_example_process(example):
    _, address = example()
    spec = remote_spec(address, eval_fraction=0.25)
    tasks = list_remote_tasks(spec, FAST)
    assert tasks == list_tasks(spec, FAST) and len(tasks) == 8
    assert sum(t.split == "eval" for t in tasks) == 2
    task = tasks[0]
    env = open_env(spec, task, FAST)
    assert env.reset() == task.prompt
    assert [t.name for t in env.tools()] == ["spell", "answer"]
    spelled = env.step(ToolCall("spell", {"word": task.verifier["word"]}))
    assert spelled.observation == " ".join(task.verifier["word"]) and spelled.verdict.score == 1.0
    done = env.step(ToolCall("answer", {"answer": str(task.verifier["count"])}))
    assert done.done
    outcome = env.outcome(None)
    assert outcome == Outcome({"outcome": 1.0, "format": 1.0, "tool_cost": 0.01, "safety": 0.0}, 1.0, True)
    env.close()
    env.close()


def test_health_and_reflection_names(example):
    _, address = example()
    with grpc.insecure_channel(address) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="orrery.v1.EnvService"), timeout=5)
    assert status.status == health_pb2.HealthCheckResponse.SERVING


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_server_is_an_infra_error_after_bounded_retries():
    spec = remote_spec(f"127.0.0.1:{_free_port()}")
    started = time.monotonic()
    with pytest.raises(EnvInfraError) as caught:
        open_env(spec, Task("t", "p"), FAST).reset()
    assert caught.value.error_class is InfraErrorClass.ENV_UNREACHABLE
    assert "Reset" in str(caught.value)
    assert time.monotonic() - started < 3 * FAST.remote_timeout_s


def test_slow_server_misses_the_deadline(example):
    _, address = example("--delay-s", "5")
    spec = remote_spec(address)
    config = SandboxConfig(remote_timeout_s=0.5, remote_retries=2, remote_backoff_s=0.05)
    env = open_env(spec, list_remote_tasks(spec, config)[0], config)
    env.reset()
    started = time.monotonic()
    with pytest.raises(EnvInfraError) as caught:
        env.step(ToolCall("spell", {"word": "x"}))
    assert caught.value.error_class is InfraErrorClass.ENV_TIMEOUT
    assert time.monotonic() - started < 1.5  # Step is not retried after a timeout


def test_server_dying_mid_episode(example):
    proc, address = example("--die-after-steps", "1")
    spec = remote_spec(address)
    env = open_env(spec, list_remote_tasks(spec, FAST)[0], FAST)
    env.reset()
    env.step(ToolCall("spell", {"word": "x"}))
    started = time.monotonic()
    with pytest.raises(EnvInfraError) as caught:
        env.step(ToolCall("spell", {"word": "y"}))
    assert caught.value.error_class is InfraErrorClass.ENV_UNREACHABLE
    assert time.monotonic() - started < 3 * FAST.remote_timeout_s
    assert proc.wait(timeout=5) == 3
    with pytest.raises(EnvInfraError):
        env.outcome(None)


class _BrokenVerifierHost:
    """An env whose scoring hits an infrastructure failure."""

    def list_tasks(self, args):
        return [Task("t0", "say hi")]

    def open(self, task, args, safety):
        class Env:
            def reset(self):
                return task.prompt

            def tools(self):
                return ()

            def step(self, call):
                raise AssertionError("not used")

            def outcome(self, answer):
                raise EnvInfraError(InfraErrorClass.VERIFIER_TIMEOUT, "judge missed its deadline")

            def close(self):
                pass
        return Env()


def test_env_infra_error_keeps_its_class_across_the_wire():
    server, port, servicer = serve_env(_BrokenVerifierHost())
    try:
        spec = EnvSpec("broken", "remote", remote_address=f"127.0.0.1:{port}")
        env = open_env(spec, list_remote_tasks(spec, FAST)[0], FAST)
        env.reset()
        with pytest.raises(EnvInfraError) as caught:
            env.outcome("hi")
        assert caught.value.error_class is InfraErrorClass.VERIFIER_TIMEOUT
        env.session_id = "no-such-session"
        with pytest.raises(EnvInfraError) as lost:
            env.outcome("hi")
        assert lost.value.error_class is InfraErrorClass.ENV_UNREACHABLE and "NOT_FOUND" in str(lost.value)
    finally:
        server.stop(0)
        servicer.shutdown()


def test_builtin_calc_served_remotely_matches_local():
    server, port, servicer = serve_env(BuiltinEnvHost("calc"))
    try:
        spec = EnvSpec("calc-remote", "remote", {"kind": "calc", "level": 2, "num_tasks": 5, "seed": 7},
                       remote_address=f"127.0.0.1:{port}")
        local = EnvSpec("calc", "calc", {"level": 2, "num_tasks": 5, "seed": 7})
        tasks = list_tasks(spec, FAST)
        assert tasks == list_tasks(local)
        task = tasks[0]
        env = open_env(spec, task, FAST)
        env.reset()
        step = env.step(ToolCall("calculator", {"expression": task.verifier["expression"]}))
        assert step.observation == task.verifier["answer"]
        env.step(ToolCall("answer", {"answer": step.observation}))
        outcome = env.outcome(None)
        env.close()
        assert outcome.reward_components["outcome"] == 1.0 and outcome.true_metric == 1.0
    finally:
        server.stop(0)
        servicer.shutdown()
