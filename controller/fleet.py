"""The rollout fleet as the controller sees it: local worker processes or remote addresses.

What it is: the stateful shell around `rollout.client.RolloutClient`s. It spawns local
workers (`python -m rollout.server`, one process each), hands each GRPO group to one worker
(so the worker's prefix cache serves all its samples), retries a group lost to an
infrastructure failure on another worker, restarts a dead local worker and brings it to the
current weights before it serves again, and broadcasts weight versions.

Membership: workers are spawned here, given as a fixed address list, or discovered by DNS
(`FleetConfig.dns = "name:port"`: every A/AAAA record of `name` is a worker, re-resolved every
`dns_interval_s`, e.g. a Kubernetes headless service). A discovered worker joins once it answers
`GetInfo` and is brought to the current weights before its first group; one that drops out of
DNS leaves: it gets no new groups and is let go when its last group ends. A failed lookup keeps
the fleet as it is (a DNS blip must not drain it). Several SGLang servers behind SGLang's own
router are one worker (one address) as far as this file is concerned.

Load: each group goes to the worker with the fewest outstanding groups (those dispatched and
not yet returned), at most `groups_per_worker` each; ties go to the worker used least recently.

What it is not: a scheduler of tokens. Workers run the whole agent loop; only finished
trajectories come back.

Invariants:
- A group's trajectories come from one attempt on one worker: a group that fails part-way is
  discarded whole and retried with `attempt + 1` (nothing is trained on twice).
- An infrastructure failure is never a reward: a lost group becomes an `InfraEvent` counted
  under `infra/errors/<class>`, not a trajectory with reward 0.
- Every call has a deadline (`FleetConfig`), so a frozen worker turns into an error in bounded time;
  a local worker that then does not answer `GetInfo` either is killed and restarted.
- A worker serves a group only when it holds the fleet's current weight version: one that missed
  an update (an error, a restart) is brought to it first.
- Spawned workers do not outlive the controller: each gets a parent-death signal (SIGTERM) tied
  to one long-lived spawner thread, and its pid is kept in run_dir/workers/<name>.pid so a
  controller restarted on the same run dir ends any that are left before it spawns new ones.
- Spawned workers share the run's seed: a group's samples depend on the group (its id and
  sampling seed), never on which worker ran it, so runs are reproducible.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import json
import os
import pathlib
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Iterable, Sequence

from controller.config import DeviceConfig, FleetConfig
from model.weights import WeightVersion
from rollout.api import GroupRequest, Trajectory, WorkerInfo
from orrery.security import ClientSecurity, token_sha256
from rollout.client import RolloutClient, RolloutError
from sandbox.api import InfraErrorClass

logger = logging.getLogger(__name__)


class FleetError(RuntimeError):
    """The fleet could not be brought up: a worker did not start or is unreachable."""


# The first thing a spawned worker runs: ask for SIGTERM when its parent (the controller thread
# that spawned it) dies, then become `python -m rollout.server ARGS` (the request survives exec).
# A shim rather than `preexec_fn`: forking a process that runs gRPC threads and then running
# Python before exec breaks gRPC in the child.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(os.environ['ORRERY_CONTROLLER_PID']): sys.exit(1)  # it died already\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'rollout.server', *sys.argv[1:]])\n")


def _end_leftover(pid_file: pathlib.Path) -> None:
    """End a worker a previous controller on this run dir left running (it was killed before it could)."""
    try:
        pid = int(pid_file.read_text().split()[0])
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        return
    if b"rollout.server" in cmdline and str(pid_file.with_suffix(".port")).encode() in cmdline:
        logger.warning("ending rollout worker pid %d left by a previous controller (%s)", pid, pid_file)
        os.kill(pid, signal.SIGKILL)


Resolver = Callable[[str, int], list[str]]
"""(host, port) -> worker addresses 'ip:port'; `resolve_dns` unless a test injects another."""


def parse_dns_target(target: str) -> tuple[str, int]:
    """'name:port' -> (name, port); errors name the value."""
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"FleetConfig.dns must be name:port (e.g. rollout.orrery.svc.cluster.local:50051), "
                         f"got {target!r}")
    return host, int(port)


def resolve_dns(host: str, port: int) -> list[str]:
    """Every address record of `host` as 'ip:port' ('[ip6]:port'), sorted, each once."""
    found = set()
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        ip = sockaddr[0]
        found.add(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
    return sorted(found)


@dataclasses.dataclass
class GroupResult:
    request: GroupRequest
    trajectories: list[Trajectory]
    worker: str
    infra_errors: collections.Counter  # class name -> count, for attempts that failed on the way


@dataclasses.dataclass
class _Worker:
    name: str
    address: str
    client: RolloutClient
    process: subprocess.Popen | None = None
    log_path: pathlib.Path | None = None
    in_flight: int = 0
    healthy: bool = True
    version: int = -1  # the weight version it acknowledged last (-1: not asked yet)
    leaving: bool = False  # dropped out of discovery: no new groups, let go when idle
    last_pick: int = 0  # dispatch counter at its last group (ties go to the least recent)


def least_loaded(workers: Sequence[_Worker], avoid: set[str], limit: int) -> _Worker | None:
    """The worker a group goes to: not leaving; healthy and not yet tried by this group first,
    then untried, then any; among those with fewer than `limit` outstanding groups, the one with
    the fewest (ties: the least recently picked). None when all are full (or there are none)."""
    present = [w for w in workers if not w.leaving]
    candidates = [w for w in present if w.name not in avoid and w.healthy] or \
                 [w for w in present if w.name not in avoid] or present
    free = [w for w in candidates if w.in_flight < limit]
    return min(free, key=lambda w: (w.in_flight, w.last_pick)) if free else None


class Fleet:
    """Spawn or connect rollout workers, dispatch groups, broadcast weights."""

    def __init__(self, config: FleetConfig, model_dir: pathlib.Path, run_dir: pathlib.Path, seed: int = 0,
                 resolver: Resolver = resolve_dns, devices: DeviceConfig = DeviceConfig()):
        self.config = config
        self.devices = devices
        self._resolver = resolver
        self._dns = parse_dns_target(config.dns) if config.dns else None
        self._picks = 0
        self._stop = threading.Event()
        self._membership = threading.Lock()
        self.on_change: Callable[[int], None] | None = None
        """Called with the new size after workers joined or left (e.g. to update the run status)."""
        self._discovery: threading.Thread | None = None
        self.model_dir = pathlib.Path(model_dir)
        self.run_dir = pathlib.Path(run_dir)
        self.seed = seed
        self._workers: list[_Worker] = []
        self._lock = threading.Condition()
        self._version: WeightVersion | None = None
        self._spawned_security = ClientSecurity()  # set by _write_worker_token before the first spawn
        # One thread per outstanding group (threads start on demand): this caps the groups in flight across
        # the whole fleet; beyond it they wait here (docs/operations.md: how far one controller goes).
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1024, thread_name_prefix="group")
        # Workers get their parent-death signal when the thread that spawned them exits, so one
        # thread that lives as long as the fleet spawns them all (the first ones and restarts).
        self._spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spawner")
        self._events: collections.Counter = collections.Counter()  # infra events outside any group

    def drain_events(self) -> dict[str, int]:
        """Infra events not tied to a group since the last call, by class: `worker_restarted` (a local
        worker found dead or frozen and replaced), `weight_update_failed` (a worker refused or missed
        a version; it serves nothing until it has loaded the current one)."""
        with self._lock:
            events, self._events = dict(self._events), collections.Counter()
        return events

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if self._dns is not None:
            self._start_discovered()
            return
        if self.config.addresses:
            for i, address in enumerate(self.config.addresses):
                self._workers.append(_Worker(f"remote-{i}", address, RolloutClient(address, security=self.config.security)))
        else:
            spawned = [self._spawner.submit(self._spawn, i).result() for i in range(self.config.workers)]
            try:
                self._workers.extend(self._await_port(*item) for item in spawned)
            except FleetError:
                for _, process, _, _ in spawned:  # the ones not yet in self._workers too
                    if process.poll() is None:
                        process.kill()
                        process.wait()
                raise
        for worker in self._workers:
            try:
                info = worker.client.info(deadline_s=self.config.call_deadline_s)
            except RolloutError as error:
                raise FleetError(f"rollout worker {worker.name} at {worker.address} is not reachable: {error}") from None
            worker.version = info.version
            logger.info("rollout worker %s at %s: engine=%s version=%d", worker.name, worker.address,
                        info.engine, info.version)

    def _start_discovered(self) -> None:
        """Resolve until at least one worker answers (bounded by start_timeout_s), then keep
        re-resolving in the background."""
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            try:
                self.refresh()
            except OSError as error:
                logger.warning("rollout DNS %s: %s", self.config.dns, error)
            if self.size:
                break
            if time.monotonic() > deadline:
                raise FleetError(f"no rollout worker answered at DNS name {self.config.dns} within "
                                 f"{self.config.start_timeout_s}s")
            time.sleep(min(1.0, self.config.dns_interval_s))
        self._discovery = threading.Thread(target=self._discover_forever, name="fleet-dns", daemon=True)
        self._discovery.start()

    def _discover_forever(self) -> None:
        while not self._stop.wait(self.config.dns_interval_s):
            try:
                self.refresh()
            except OSError as error:  # a failed lookup keeps the fleet as it is
                logger.warning("rollout DNS %s: %s (keeping %d workers)", self.config.dns, error, self.size)
            except Exception:  # the loop must outlive one bad refresh; the next one retries
                logger.exception("rollout DNS refresh failed")

    def refresh(self) -> None:
        """Resolve the DNS name once and let workers join or leave accordingly."""
        assert self._dns is not None, "refresh() needs FleetConfig.dns"
        self.set_addresses(self._resolver(*self._dns))

    def set_addresses(self, addresses: Iterable[str]) -> None:
        """Make the remote fleet exactly `addresses`: new ones join once they answer GetInfo;
        missing ones leave (no new groups; let go when their outstanding groups end)."""
        with self._membership:  # one change at a time (the DNS thread and a caller may race)
            before = self.addresses()
            self._set_addresses(list(addresses))
            if self.on_change is not None and self.addresses() != before:
                self.on_change(self.size)

    def _set_addresses(self, addresses: list[str]) -> None:
        wanted = list(dict.fromkeys(addresses))
        with self._lock:
            known = {w.address: w for w in self._workers}
            for worker in self._workers:
                if worker.address not in wanted and not worker.leaving:
                    logger.info("rollout worker %s leaves the fleet (%d groups outstanding)",
                                worker.name, worker.in_flight)
                    worker.leaving = True
                elif worker.address in wanted and worker.leaving:
                    logger.info("rollout worker %s is back", worker.name)
                    worker.leaving = False
            self._let_go_idle()
            self._lock.notify_all()
        joining = [address for address in wanted if address not in known]
        if joining:  # each new address answers (or not) within its own deadline, side by side
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(joining))) as pool:
                list(pool.map(self._join, joining))

    def _join(self, address: str) -> None:
        client = RolloutClient(address, security=self.config.security)
        try:
            info = client.info(deadline_s=min(self.config.call_deadline_s, 10.0))
        except RolloutError as error:
            client.close()
            logger.warning("rollout worker at %s does not answer yet (%s); next refresh retries", address, error.code)
            return
        worker = _Worker(address, address, client, version=info.version)
        with self._lock:
            if self._stop.is_set():  # the fleet closed while this one was answering
                client.close()
                return
            self._workers.append(worker)
            self._lock.notify_all()
        logger.info("rollout worker %s joins: engine=%s version=%d (%d in the fleet)", address, info.engine,
                    info.version, self.size)

    def _let_go_idle(self) -> None:
        """Drop leaving workers with nothing outstanding (call with the lock held)."""
        for worker in [w for w in self._workers if w.leaving and w.in_flight == 0]:
            self._workers.remove(worker)
            worker.client.close()

    def close(self) -> None:
        with self._lock:
            self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for worker in self._workers:
            worker.client.close()
            if worker.process is not None and worker.process.poll() is None:
                worker.process.terminate()
        for worker in self._workers:
            if worker.process is not None:
                try:
                    worker.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    worker.process.kill()
                    worker.process.wait()
        self._spawner.shutdown(wait=False)

    def _write_worker_token(self) -> pathlib.Path:
        """The tokens file of spawned workers: one fresh token per fleet, role internal.

        The token goes to run_dir/workers/internal.token (mode 0600) for this fleet's clients;
        the workers' tokens file holds only its SHA-256. Restarted workers reuse both."""
        folder = self.run_dir / "workers"
        tokens_file = folder / "tokens.json"
        if not self._spawned_security.token_file:
            folder.mkdir(parents=True, exist_ok=True)
            token, token_file = secrets.token_urlsafe(32), folder / "internal.token"
            token_file.unlink(missing_ok=True)
            with os.fdopen(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(token + "\n")
            entry = {"name": "controller", "sha256": token_sha256(token), "roles": ["internal"]}
            tokens_file.write_text(json.dumps({"tokens": [entry]}) + "\n")
            self._spawned_security = ClientSecurity(token_file=str(token_file))
        return tokens_file

    def _spawn(self, index: int) -> tuple[str, subprocess.Popen, pathlib.Path, pathlib.Path]:
        name = f"worker-{index}"
        logs = self.run_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        port_file = self.run_dir / "workers" / f"{name}.port"
        port_file.parent.mkdir(parents=True, exist_ok=True)
        port_file.unlink(missing_ok=True)
        pid_file = port_file.with_suffix(".pid")
        _end_leftover(pid_file)
        log_path = logs / f"{name}.log"
        env = dict(os.environ)
        # A worker is one JAX process on one host device; the learner's fake-device flag is not its business.
        env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                    if not f.startswith("--xla_force_host_platform_device_count"))
        env["JAX_PLATFORMS"] = env.get("JAX_PLATFORMS", "cpu")
        root = pathlib.Path(__file__).resolve().parent.parent
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
        env["ORRERY_CONTROLLER_PID"] = str(os.getpid())
        if self.devices.rollout:
            # The worker's engine sees only its own accelerators (JAX on GPU and SGLang read this).
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in self.devices.rollout[index])
            if self.devices.colocate:
                # Sharing devices with the learner: allocate on demand instead of JAX's default
                # 75% up front, or the second process on a device runs out of memory at start.
                env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        command = [
            sys.executable, "-c", _DIE_WITH_PARENT,
            "--engine", self.config.engine,
            "--listen", "127.0.0.1:0",
            "--port-file", str(port_file),
            "--model", str(self.model_dir),
            "--worker-id", name,
            "--slots", str(self.config.slots),
            "--max-concurrent-groups", str(self.config.groups_per_worker),
            # Weights load only from the run's snapshots; calls need the fleet's token (role internal).
            "--weights-root", str((self.run_dir / "weights").absolute()),
            "--tokens-file", str(self._write_worker_token()),
            "--seed", str(self.seed),
        ]
        process = subprocess.Popen(command, stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, env=env,
                                   cwd=root, start_new_session=False)
        pid_file.write_text(f"{process.pid}\n")
        logger.info("spawned %s (pid %d), log %s", name, process.pid, log_path)
        return name, process, port_file, log_path

    def _await_port(self, name, process, port_file, log_path) -> _Worker:
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise FleetError(f"rollout worker {name} exited with {process.returncode} while starting; "
                                   f"last log lines:\n{tail}")
            if port_file.exists() and port_file.read_text().strip():
                address = f"127.0.0.1:{int(port_file.read_text().strip())}"
                return _Worker(name, address, RolloutClient(address, security=self._spawned_security), process, log_path)
            time.sleep(0.1)
        process.kill()
        raise FleetError(f"rollout worker {name} did not report a port within {self.config.start_timeout_s}s; "
                           f"see {log_path}")

    def _revive(self, worker: _Worker) -> None:
        """Restart a dead or frozen local worker and bring it to the current weights before it serves."""
        if worker.process is None:
            return
        if worker.process.poll() is None:
            try:
                worker.client.info(deadline_s=self.config.call_deadline_s)
                return  # alive and answering: busy or slow, not lost
            except RolloutError as error:
                logger.warning("rollout worker %s does not answer (%s); killing it", worker.name, error.code)
                worker.process.kill()
                worker.process.wait()
        logger.warning("rollout worker %s died (exit %s); restarting", worker.name, worker.process.returncode)
        self._events["worker_restarted"] += 1
        index = int(worker.name.rsplit("-", 1)[1])
        fresh = self._await_port(*self._spawner.submit(self._spawn, index).result())
        worker.client.close()
        worker.address, worker.client, worker.process = fresh.address, fresh.client, fresh.process
        worker.version = -1
        if self._version is not None:
            worker.version = worker.client.update_weights(self._version, deadline_s=self.config.call_deadline_s).version
        worker.healthy = True

    # -- work --------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Workers that take groups (those leaving are not counted)."""
        return sum(1 for w in self._workers if not w.leaving)

    def addresses(self) -> list[str]:
        return [w.address for w in self._workers if not w.leaving]

    def outstanding(self) -> dict[str, int]:
        """Groups dispatched and not yet returned, per worker (the load balancer's view)."""
        with self._lock:
            return {w.name: w.in_flight for w in self._workers}

    def submit(self, request: GroupRequest) -> concurrent.futures.Future:
        """Roll out one group on the least-loaded worker; the future holds a GroupResult or None (dropped)."""
        return self._pool.submit(self._run_group, request)

    def rollout(self, requests: list[GroupRequest]) -> list[GroupResult | None]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def _pick(self, avoid: set[str]) -> _Worker | None:
        """The least-loaded worker (see `least_loaded`); waits for a free one. None when the fleet
        has had no worker at all for `rollout_deadline_s` (all left and none joined)."""
        empty_since = None
        with self._lock:
            while True:
                worker = least_loaded(self._workers, avoid, self.config.groups_per_worker)
                if worker is not None:
                    worker.in_flight += 1
                    self._picks += 1
                    worker.last_pick = self._picks
                    return worker
                if self.size:
                    empty_since = None
                else:
                    empty_since = empty_since or time.monotonic()
                    if time.monotonic() - empty_since > self.config.rollout_deadline_s:
                        return None
                self._lock.wait(timeout=1.0)

    def _run_group(self, request: GroupRequest) -> GroupResult | None:
        errors: collections.Counter = collections.Counter()
        tried: set[str] = set()
        for attempt in range(self.config.max_group_retries + 1):
            request = dataclasses.replace(request, attempt=attempt)
            worker = self._pick(tried)
            if worker is None:
                errors[InfraErrorClass.WORKER_LOST.value] += 1
                logger.error("group %s: no rollout worker in the fleet for %.0fs", request.group_id,
                             self.config.rollout_deadline_s)
                break
            try:
                self._bring_to_current(worker)
                trajectories = list(worker.client.rollout_group(request, deadline_s=self.config.rollout_deadline_s))
                if len(trajectories) != request.group_size:
                    raise RolloutError("RolloutGroup", worker.address, "INCOMPLETE",
                                       f"{len(trajectories)} of {request.group_size} trajectories")
                worker.healthy = True
                return GroupResult(request, trajectories, worker.name, errors)
            except RolloutError as error:
                errors[InfraErrorClass.WORKER_LOST.value] += 1
                tried.add(worker.name)
                worker.healthy = False
                if worker.process is None:
                    worker.version = -1  # a remote worker may come back restarted: send weights again
                logger.warning("group %s attempt %d failed on %s: %s", request.group_id, attempt, worker.name, error)
                with self._lock:
                    self._revive_quietly(worker)
            finally:
                with self._lock:
                    worker.in_flight -= 1
                    self._let_go_idle()
                    self._lock.notify_all()
        logger.error("group %s dropped after %d attempts", request.group_id, self.config.max_group_retries + 1)
        return GroupResult(request, [], "", errors)

    def _bring_to_current(self, worker: _Worker) -> None:
        """Load the current weights on a worker that missed them (DESIGN rule 5: serve only the current version)."""
        version = self._version
        if version is not None and worker.version != version.version:
            worker.version = worker.client.update_weights(version, deadline_s=self.config.call_deadline_s).version
            if worker.version != version.version:
                raise RolloutError("UpdateWeights", worker.address, "WRONG_VERSION",
                                   f"acknowledged {worker.version}, expected {version.version}")

    def _revive_quietly(self, worker: _Worker) -> None:
        try:
            self._revive(worker)
        except Exception as error:  # a worker that cannot restart stays unhealthy; the others go on
            logger.error("could not restart %s: %s", worker.name, error)

    def update_weights(self, version: WeightVersion) -> float:
        """Send `version` to every worker; returns the slowest worker's load time in seconds."""
        self._version = version
        with self._lock:
            workers = [w for w in self._workers if not w.leaving]
        futures = [self._pool.submit(w.client.update_weights, version, self.config.call_deadline_s)
                   for w in workers]
        slowest = 0.0
        for worker, future in zip(workers, futures):
            try:
                ack = future.result()
                slowest = max(slowest, ack.load_s)
                worker.version = ack.version
                if ack.version != version.version:
                    raise RuntimeError(f"{worker.name} acknowledged version {ack.version}, expected {version.version}")
            except RolloutError as error:
                worker.healthy = False
                worker.version = -1  # brought to the current version before its next group
                logger.warning("weight update to %s failed: %s", worker.name, error)
                with self._lock:
                    self._events["weight_update_failed"] += 1
                    self._revive_quietly(worker)
        return slowest

    def infos(self) -> list[WorkerInfo]:
        with self._lock:
            workers = [w for w in self._workers if not w.leaving]
        return [w.client.info(deadline_s=self.config.call_deadline_s) for w in workers]
