"""A two-process learner under jax.distributed equals the one-process learner on the same mesh.

Proves: with the controller's side as process 0 (`LeaderLearner`) and one learner host
(`python -m learner.host`, process 1), each with 4 CPU devices joined over loopback (gloo
collectives), the 8-device mesh spans both processes, and the scenario in
multihost_scenario.py (two RL steps, logprobs, publish, Orbax checkpoint, restore onto
another mesh shape, one more step) gives the same losses, logprobs, published weights and
final parameters as one process with 8 devices. Also: the learner takes a chosen subset of
each process's devices; bad `DistributedConfig` values and
`learner.host` flags are one-line errors, and a host whose leader never comes, or dies, ends
in bounded time.

Run: `.venv/bin/python -m pytest -q -p no:cacheprovider tests/learner/test_multihost.py`
(about a minute; the reference half needs the 8 fake devices of tests/learner/conftest.py).
"""

import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.learner.helpers import need_devices
from learner.config import DistributedConfig
from learner.learner import Learner
from model.weights import WeightVersion, load_snapshot

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "tests" / "learner" / "multihost_scenario.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Each process sets its own device count (--local-cpu-devices); keep the fast-compile flag.
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if not f.startswith("--xla_force_host_platform_device_count"))
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _run_two_processes(tmp_path: pathlib.Path) -> dict[str, np.ndarray]:
    coordinator = f"127.0.0.1:{_free_port()}"
    out = tmp_path / "leader.npz"
    follower_log = open(tmp_path / "host.log", "w")
    follower = subprocess.Popen(
        [sys.executable, "-m", "learner.host", "--coordinator", coordinator, "--num-processes", "2",
         "--process-id", "1", "--local-cpu-devices", "4", "--timeout-s", "240"],
        cwd=ROOT, env=_env(), stdout=follower_log, stderr=subprocess.STDOUT)
    try:
        leader = subprocess.run(
            [sys.executable, str(SCENARIO), "--coordinator", coordinator, "--num-processes", "2",
             "--local-cpu-devices", "4", "--workdir", str(tmp_path / "multi"), "--out", str(out)],
            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=480)
        assert leader.returncode == 0, f"leader failed:\n{leader.stderr[-4000:]}"
        assert follower.wait(timeout=120) == 0, (tmp_path / "host.log").read_text()[-4000:]
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
        follower_log.close()
    return dict(np.load(out))


@need_devices(8)
def test_two_processes_match_one_process(tmp_path):
    from tests.learner.multihost_scenario import run

    multi = _run_two_processes(tmp_path)
    single = run(Learner, tmp_path / "single")

    # Same program, same global mesh: the only freedom left is the order in which the
    # all-reduces add partial sums (gloo across processes vs XLA:CPU within one), a few ulps
    # (measured: losses within 6e-8, logprobs 5e-7, parameters 1.2e-7 after three steps).
    np.testing.assert_allclose(multi["losses"], single["losses"], rtol=2e-6, atol=0)
    np.testing.assert_allclose(multi["logprobs"], single["logprobs"], rtol=1e-6, atol=5e-6)
    assert int(multi["step"]) == int(single["step"]) == 3
    assert int(multi["cursor"]) == 7  # the controller's extra JSON came back from the checkpoint
    count = sum(1 for key in single if key.startswith("final"))
    assert count == sum(1 for key in multi if key.startswith("final")) == 12
    final_single = [single[f"final{i}"] for i in range(count)]
    final_multi = [multi[f"final{i}"] for i in range(count)]
    for a, b in zip(final_multi, final_single):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Only process 0 wrote the snapshot, and it holds the whole (gathered) parameters.
    location = pathlib.Path(str(multi["published"]))
    assert location.parent.parent == tmp_path / "multi"
    published = load_snapshot(WeightVersion(version=1, step=2, location=str(location), format="orbax",
                                            digest=str(multi["digest"]), created_at=0.0))
    reference = load_snapshot(WeightVersion(version=1, step=2, location=str(single["published"]),
                                            format="orbax", digest=str(single["digest"]), created_at=0.0))
    for a, b in zip(jax.tree.leaves(published), jax.tree.leaves(reference)):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_leader_overrides_keep_the_learners_signatures():
    """LeaderLearner announces each call with its arguments: an argument added to Learner must be
    added (and forwarded) there too, or the hosts would replay a different call."""
    import inspect

    from learner.multihost import LeaderLearner

    overridden = [name for name, value in vars(LeaderLearner).items()
                  if not name.startswith("_") and callable(getattr(Learner, name, None))]
    assert {"train_step", "sft_step", "compute_logprobs", "save", "restore", "close"} <= set(overridden)
    for name in overridden:
        assert inspect.signature(getattr(LeaderLearner, name)) == inspect.signature(getattr(Learner, name)), name
    public = {name for name, value in vars(Learner).items() if not name.startswith("_")
              and (callable(value) or isinstance(value, (staticmethod, classmethod)))}
    # Every Learner method that touches devices or checkpoints is announced. `publish` needs no
    # announcement of its own: it gathers through the announced `params`, then only process 0 writes.
    assert public - set(vars(LeaderLearner)) == {"publish"}, public - set(vars(LeaderLearner))


@pytest.mark.parametrize("fields, message", [
    (dict(num_processes=0), "num_processes must be an int >= 1, got 0"),
    (dict(num_processes=2, process_id=2, coordinator="h:1"), "process_id must be in [0, 2), got 2"),
    (dict(num_processes=2, coordinator="nohost"), "coordinator must be host:port"),
    (dict(local_cpu_devices=-1), "local_cpu_devices must be an int >= 0, got -1"),
])
def test_bad_distributed_config_names_the_value(fields, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        DistributedConfig(**fields)


def test_host_refuses_process_zero_in_one_line():
    result = subprocess.run(
        [sys.executable, "-m", "learner.host", "--coordinator", "127.0.0.1:1", "--num-processes", "2",
         "--process-id", "0"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: learner.host --process-id must be >= 1 (process 0 is the controller)"


def test_host_without_leader_gives_up_in_bounded_time():
    # Nothing listens at the coordinator: the host must fail after --timeout-s, not hang.
    result = subprocess.run(
        [sys.executable, "-m", "learner.host", "--coordinator", f"127.0.0.1:{_free_port()}",
         "--num-processes", "2", "--process-id", "1", "--local-cpu-devices", "2", "--timeout-s", "5"],
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=180)
    assert result.returncode != 0


@need_devices(8)
def test_learner_devices_are_a_subset_of_each_process():
    from learner.sharding import make_mesh, select_devices

    assert select_devices(()) == jax.devices()
    chosen = select_devices([1, 3])
    assert chosen == [jax.devices()[1], jax.devices()[3]]
    assert sorted(d.id for d in make_mesh("fsdp=2", devices=chosen).devices.flat) == [chosen[0].id, chosen[1].id]
    with pytest.raises(ValueError, match=r"devices.learner \[0, 9\]: indices \[9\] are out of range; "
                                         r"process 0 has 8 local devices \(0..7\)"):
        select_devices([0, 9])


def test_host_exits_when_its_leader_dies():
    # Process 0 joins, then dies without a word (SIGKILL): the host, blocked waiting for the next
    # command, must end with an error in bounded time, not wait forever (DESIGN rule 4).
    coordinator = f"127.0.0.1:{_free_port()}"
    leader_code = (
        "import os, signal, time\n"
        "from learner import multihost\n"
        "from learner.config import DistributedConfig\n"
        f"multihost.initialize(DistributedConfig(coordinator={coordinator!r}, num_processes=2, process_id=0, "
        "local_cpu_devices=1, timeout_s=120))\n"
        "time.sleep(2)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    host = subprocess.Popen(
        [sys.executable, "-m", "learner.host", "--coordinator", coordinator, "--num-processes", "2",
         "--process-id", "1", "--local-cpu-devices", "1", "--timeout-s", "120"],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        leader = subprocess.run([sys.executable, "-c", leader_code], cwd=ROOT, env=_env(), capture_output=True,
                                text=True, timeout=180)
        assert leader.returncode == -9, leader.stdout + leader.stderr
        output, _ = host.communicate(timeout=180)
        assert host.returncode != 0
        assert "process 1 of 2" in output  # it had joined, and was waiting in `follow`
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
