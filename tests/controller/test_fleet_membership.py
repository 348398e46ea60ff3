"""Rollout fleets whose membership changes while the run goes on, with real worker processes.

Proves: workers discovered by DNS join when their address appears (and are brought to the
current weights before their first group) and leave when it disappears (no new groups; the
fleet lets them go once idle) — with an injected resolver returning changing lists of loopback
ports, and once through the real `socket.getaddrinfo("localhost")`; a DNS failure keeps the
fleet; a fleet left with no worker drops groups as infra errors in bounded time; groups go to
the worker with the fewest outstanding groups (pure `least_loaded`, hand-made cases); the
device section's errors name the devices; spawned workers get CUDA_VISIBLE_DEVICES.

Workers are `python -m rollout.server --engine fake` (no model compile; the agent loop, the
calc env and gRPC are real). Run: `.venv/bin/python -m pytest -q -p no:cacheprovider
tests/controller/test_fleet_membership.py` (about a minute).
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest

from controller.config import DeviceConfig, EnvConfig, FleetConfig, load
from controller.fleet import Fleet, FleetError, least_loaded, parse_dns_target, resolve_dns, _Worker
from controller.tasks import default_task_lister
from controller.warmstart import default_env_spec
from model.weights import WeightVersion
from rollout.api import GroupRequest, SamplingParams

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from model.factory import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("fleet-model") / "tiny", vocab_size=300, hidden_size=32,
                           num_layers=2, num_heads=4, num_kv_heads=2)


class FakeWorkers:
    """Real `rollout.server --engine fake` processes on loopback; stopped at the end."""

    def __init__(self, model: pathlib.Path, folder: pathlib.Path):
        self.model, self.folder = model, folder
        self.weights = folder / "weights"
        self.weights.mkdir(parents=True, exist_ok=True)
        self.processes: dict[str, subprocess.Popen] = {}

    def start(self, count: int) -> list[str]:
        pending = []
        for _ in range(count):
            name = f"w{len(self.processes) + len(pending)}"
            port_file = self.folder / f"{name}.port"
            env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
            env.pop("XLA_FLAGS", None)
            process = subprocess.Popen(
                [sys.executable, "-m", "rollout.server", "--engine", "fake", "--model", str(self.model),
                 "--worker-id", name, "--listen", "127.0.0.1:0", "--port-file", str(port_file),
                 "--weights-root", str(self.weights), "--max-concurrent-groups", "4"],
                cwd=ROOT, env=env, stdout=open(self.folder / f"{name}.log", "w"), stderr=subprocess.STDOUT)
            pending.append((name, process, port_file))
        addresses = []
        for name, process, port_file in pending:
            deadline = time.monotonic() + 180
            while not (port_file.exists() and port_file.read_text().strip()):
                assert process.poll() is None, (self.folder / f"{name}.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"{name} never reported its port"
                time.sleep(0.1)
            address = f"127.0.0.1:{int(port_file.read_text())}"
            self.processes[address] = process
            addresses.append(address)
        return addresses

    def stop(self, address: str) -> None:
        process = self.processes.pop(address)
        process.kill()
        process.wait()

    def close(self) -> None:
        for address in list(self.processes):
            self.stop(address)


@pytest.fixture
def workers(tiny_model_dir, tmp_path):
    fleet = FakeWorkers(tiny_model_dir, tmp_path / "workers")
    yield fleet
    fleet.close()


def _requests(n: int, tag: str) -> list[GroupRequest]:
    spec = default_env_spec(EnvConfig(num_tasks=40))
    tasks = default_task_lister(spec)
    return [GroupRequest(group_id=f"{tag}-{i}", env=spec, task=tasks[i % len(tasks)], group_size=2,
                         sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=i)) for i in range(n)]


class ChangingDns:
    """A resolver whose answer the test sets; counts lookups; can fail like a DNS outage."""

    def __init__(self):
        self.answer: list[str] = []
        self.fail = False
        self.lookups: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append((host, port))
        if self.fail:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return list(self.answer)


def test_workers_join_and_leave_as_dns_changes(workers, tiny_model_dir, tmp_path):
    a, b, c = workers.start(3)
    dns = ChangingDns()
    dns.answer = [a]
    # A long interval: the test drives refresh() itself, so each change is applied exactly when it says.
    config = FleetConfig(dns="rollout.test:50051", dns_interval_s=3600, groups_per_worker=2, start_timeout_s=60,
                         rollout_deadline_s=60, call_deadline_s=30)
    fleet = Fleet(config, tiny_model_dir, tmp_path / "run", resolver=dns)
    sizes = []
    fleet.on_change = sizes.append
    try:
        fleet.start()
        assert dns.lookups[0] == ("rollout.test", 50051)
        assert fleet.addresses() == [a]
        results = fleet.rollout(_requests(4, "one"))
        assert {r.worker for r in results} == {a} and all(len(r.trajectories) == 2 for r in results)

        # A new weight version, then two workers join: each is brought to it before serving.
        version = WeightVersion(version=1, step=1, location=str(workers.weights / "v00000001"), format="orbax",
                                digest="sha256:" + "0" * 64, created_at=0.0)
        fleet.update_weights(version)
        dns.answer = [a, b, c]
        fleet.refresh()
        assert sorted(fleet.addresses()) == sorted([a, b, c])
        assert sizes == [1, 3]  # each change reported once (the run status shows it)
        results = fleet.rollout(_requests(12, "three"))
        assert {r.worker for r in results} == {a, b, c}  # 12 groups, at most 2 outstanding per worker
        assert all(len(r.trajectories) == 2 and not r.infra_errors for r in results)
        assert {v for r in results for t in r.trajectories for turn in t.policy_turns for v in turn.versions} == {1}
        assert {i.version for i in fleet.infos()} == {1}

        # A DNS outage keeps the fleet as it is.
        dns.fail = True
        with pytest.raises(OSError):
            fleet.refresh()
        assert fleet.size == 3

        # a leaves the DNS answer: no new groups go to it, and it is let go (idle now).
        dns.fail = False
        dns.answer = [b, c]
        fleet.refresh()
        assert sorted(fleet.addresses()) == sorted([b, c])
        assert a not in fleet.outstanding()
        assert sizes == [1, 3, 2]
        results = fleet.rollout(_requests(6, "two"))
        assert {r.worker for r in results} <= {b, c} and all(len(r.trajectories) == 2 for r in results)

        # b's process dies without leaving DNS first: its groups are retried on c, never scored.
        workers.stop(b)
        results = fleet.rollout(_requests(4, "lost"))
        assert all(len(r.trajectories) == 2 for r in results) and {r.worker for r in results} == {c}
    finally:
        fleet.close()


def test_an_empty_fleet_drops_groups_as_infra_errors_in_bounded_time(workers, tiny_model_dir, tmp_path):
    (a,) = workers.start(1)
    dns = ChangingDns()
    dns.answer = [a]
    config = FleetConfig(dns="rollout.test:50051", dns_interval_s=3600, start_timeout_s=60, rollout_deadline_s=2,
                         call_deadline_s=10, max_group_retries=0)
    fleet = Fleet(config, tiny_model_dir, tmp_path / "run", resolver=dns)
    try:
        fleet.start()
        dns.answer = []
        fleet.refresh()
        assert fleet.size == 0
        (result,) = fleet.rollout(_requests(1, "none"))
        assert result.trajectories == [] and result.infra_errors["worker_lost"] == 1
    finally:
        fleet.close()


@pytest.mark.parametrize("flags, message", [
    (["--rollout-dns", "rollout"], "error: FleetConfig.dns must be name:port"),
    (["--rollout-dns", "svc:1", "--rollout-addresses", "h:2"], "error: FleetConfig.dns and addresses exclude each other"),
    (["--coordinator", "nohost", "--num-processes", "2"], "error: DistributedConfig.coordinator must be host:port"),
    (["--set", "devices.learner=[0]", "--set", "devices.rollout=[[0],[1]]"],
     "error: DeviceConfig.rollout[0] and learner share devices [0]"),
])
def test_controller_flags_for_fleets_and_hosts_fail_in_one_line(flags, message, tmp_path):
    result = subprocess.run([sys.executable, "-m", "controller.main", "--run-dir", str(tmp_path / "run"), *flags],
                            cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr


def test_no_worker_at_the_dns_name_is_a_one_line_error(tiny_model_dir, tmp_path):
    dns = ChangingDns()
    fleet = Fleet(FleetConfig(dns="rollout.test:50051", dns_interval_s=0.2, start_timeout_s=1), tiny_model_dir,
                  tmp_path / "run", resolver=dns)
    with pytest.raises(FleetError, match=r"no rollout worker answered at DNS name rollout.test:50051 within 1"):
        fleet.start()
    fleet.close()


def test_real_resolver_finds_a_worker_by_localhost(workers, tiny_model_dir, tmp_path):
    (a,) = workers.start(1)
    port = int(a.rsplit(":", 1)[1])
    found = resolve_dns("localhost", port)
    assert f"127.0.0.1:{port}" in found
    assert found == sorted(set(found))
    # The real lookup path, end to end: a fleet at localhost:PORT (an ::1 record, if any, does not answer
    # and is skipped; 127.0.0.1 joins).
    fleet = Fleet(FleetConfig(dns=f"localhost:{port}", dns_interval_s=3600, start_timeout_s=60), tiny_model_dir,
                  tmp_path / "run")
    try:
        fleet.start()
        assert fleet.addresses() == [a]
        (result,) = fleet.rollout(_requests(1, "localhost"))
        assert result.worker == a and len(result.trajectories) == 2
    finally:
        fleet.close()


def _worker(name: str, in_flight: int, last_pick: int = 0, healthy: bool = True, leaving: bool = False) -> _Worker:
    return _Worker(name, name, client=None, in_flight=in_flight, healthy=healthy, leaving=leaving,
                   last_pick=last_pick)


def test_least_loaded_picks_the_fewest_outstanding_groups():
    a, b, c = _worker("a", 2), _worker("b", 1, last_pick=5), _worker("c", 1, last_pick=3)
    assert least_loaded([a, b, c], set(), limit=4) is c  # b and c tie at 1; c was used longer ago
    assert least_loaded([a, b, c], {"c"}, limit=4) is b  # untried first
    assert least_loaded([a, _worker("b", 0, leaving=True)], set(), limit=4) is a  # leaving gets nothing
    assert least_loaded([a, _worker("u", 0, healthy=False)], set(), limit=4) is a  # healthy before unhealthy
    assert least_loaded([_worker("u", 0, healthy=False)], set(), limit=4).name == "u"  # but better than none
    assert least_loaded([a, _worker("full", 4)], set(), limit=2) is None  # everyone at the limit: wait


def test_dns_and_device_settings_are_checked_with_clear_errors():
    assert parse_dns_target("rollout.orrery.svc:50051") == ("rollout.orrery.svc", 50051)
    with pytest.raises(ValueError, match=r"FleetConfig.dns must be name:port .*got 'rollout'"):
        parse_dns_target("rollout")
    with pytest.raises(ValueError, match=r"FleetConfig.dns must be name:port .*got 'svc:http'"):
        load(None, ("fleet.dns=svc:http",))
    with pytest.raises(ValueError, match=r"FleetConfig.dns and addresses exclude each other"):
        load(None, ("fleet.dns=svc:1", "fleet.addresses=[a:1]"))
    with pytest.raises(ValueError, match=r"rollout\[1\] and learner share devices \[1\]; set devices.colocate=true"):
        load(None, ("devices.learner=[0,1]", "devices.rollout=[[2],[1]]"))
    assert load(None, ("devices.learner=[0,1]", "devices.rollout=[[2],[1]]", "devices.colocate=true")).devices.colocate
    with pytest.raises(ValueError, match=r"rollout\[0\] and rollout\[1\] share devices \[2\]"):
        load(None, ("devices.rollout=[[2],[2,3]]",))
    with pytest.raises(ValueError, match=r"has 1 device sets for fleet.workers=2"):
        load(None, ("devices.rollout=[[2]]",))
    with pytest.raises(ValueError, match=r"DeviceConfig.learner names a device twice: \[0, 0\]"):
        load(None, ("devices.learner=[0,0]",))
    with pytest.raises(ValueError, match=r"pins spawned workers only"):
        load(None, ("fleet.dns=svc:1", "devices.rollout=[[0],[1]]"))


def test_spawned_workers_see_only_their_devices(tiny_model_dir, tmp_path, monkeypatch):
    devices = DeviceConfig(learner=(0,), rollout=((1,), (2, 3)))
    fleet = Fleet(FleetConfig(workers=2, engine="fake", start_timeout_s=120), tiny_model_dir, tmp_path / "run",
                  devices=devices)
    seen = {}
    real_popen = subprocess.Popen

    def record(command, **kwargs):
        seen[command[command.index("--worker-id") + 1]] = kwargs["env"].get("CUDA_VISIBLE_DEVICES")
        return real_popen(command, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", record)
    try:
        fleet.start()
    finally:
        fleet.close()
    assert seen == {"worker-0": "1", "worker-1": "2,3"}


class _ClosableClient:
    closed = False

    def close(self):
        self.closed = True


def test_a_leaving_worker_finishes_its_groups_before_it_is_let_go(tiny_model_dir, tmp_path):
    # Membership bookkeeping alone (no processes): b leaves with one group outstanding; it gets no new
    # group, stays until that group returns, then is closed and dropped.
    fleet = Fleet(FleetConfig(dns="rollout.test:1"), tiny_model_dir, tmp_path / "run", resolver=ChangingDns())
    a, b = _worker("a:1", 0), _worker("b:1", 1)
    a.client, b.client = _ClosableClient(), _ClosableClient()
    fleet._workers = [a, b]
    fleet.set_addresses(["a:1"])
    assert b.leaving and fleet.addresses() == ["a:1"] and fleet.outstanding() == {"a:1": 0, "b:1": 1}
    assert least_loaded(fleet._workers, set(), limit=4) is a
    with fleet._lock:  # what _run_group does when b's group returns
        b.in_flight -= 1
        fleet._let_go_idle()
    assert fleet.outstanding() == {"a:1": 0} and b.client.closed and not a.client.closed
    fleet.close()
