"""The rollout fleet as the controller sees it: local worker processes or remote addresses.

What it is: the stateful shell around `rollout.client.RolloutClient`s. It spawns local
workers (`python -m rollout.server`, one process each), hands each GRPO group to one worker
(so the worker's prefix cache serves all its samples), retries a group lost to an
infrastructure failure on another worker, restarts a dead local worker and brings it to the
current weights before it serves again, and broadcasts weight versions.

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
import subprocess
import sys
import threading
import time

from controller.config import FleetConfig
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


class Fleet:
    """Spawn or connect rollout workers, dispatch groups, broadcast weights."""

    def __init__(self, config: FleetConfig, model_dir: pathlib.Path, run_dir: pathlib.Path, seed: int = 0):
        self.config = config
        self.model_dir = pathlib.Path(model_dir)
        self.run_dir = pathlib.Path(run_dir)
        self.seed = seed
        self._workers: list[_Worker] = []
        self._lock = threading.Condition()
        self._version: WeightVersion | None = None
        self._spawned_security = ClientSecurity()  # set by _write_worker_token before the first spawn
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="group")
        # Workers get their parent-death signal when the thread that spawned them exits, so one
        # thread that lives as long as the fleet spawns them all (the first ones and restarts).
        self._spawner = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="spawner")

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
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

    def close(self) -> None:
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
        return len(self._workers)

    def submit(self, request: GroupRequest) -> concurrent.futures.Future:
        """Roll out one group on the least-loaded worker; the future holds a GroupResult or None (dropped)."""
        return self._pool.submit(self._run_group, request)

    def rollout(self, requests: list[GroupRequest]) -> list[GroupResult | None]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def _pick(self, avoid: set[str]) -> _Worker:
        """The least-loaded worker with a free group slot (healthy and untried first); waits for one."""
        with self._lock:
            while True:
                candidates = [w for w in self._workers if w.name not in avoid and w.healthy] or \
                             [w for w in self._workers if w.name not in avoid] or self._workers
                free = [w for w in candidates if w.in_flight < self.config.groups_per_worker]
                if free:
                    worker = min(free, key=lambda w: w.in_flight)
                    worker.in_flight += 1
                    return worker
                self._lock.wait()

    def _run_group(self, request: GroupRequest) -> GroupResult | None:
        errors: collections.Counter = collections.Counter()
        tried: set[str] = set()
        for attempt in range(self.config.max_group_retries + 1):
            request = dataclasses.replace(request, attempt=attempt)
            worker = self._pick(tried)
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
                logger.warning("group %s attempt %d failed on %s: %s", request.group_id, attempt, worker.name, error)
                with self._lock:
                    self._revive_quietly(worker)
            finally:
                with self._lock:
                    worker.in_flight -= 1
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
        futures = [self._pool.submit(w.client.update_weights, version, self.config.call_deadline_s)
                   for w in self._workers]
        slowest = 0.0
        for worker, future in zip(self._workers, futures):
            try:
                ack = future.result()
                slowest = max(slowest, ack.load_s)
                worker.version = ack.version
                if ack.version != version.version:
                    raise RuntimeError(f"{worker.name} acknowledged version {ack.version}, expected {version.version}")
            except RolloutError as error:
                worker.healthy = False
                logger.warning("weight update to %s failed: %s", worker.name, error)
                with self._lock:
                    self._revive_quietly(worker)
        return slowest

    def infos(self) -> list[WorkerInfo]:
        return [w.client.info(deadline_s=self.config.call_deadline_s) for w in self._workers]
