"""The learner across several processes: `jax.distributed`, and followers that copy process 0.

What it is: `initialize` (start JAX's distributed runtime from a `DistributedConfig`), a
`Channel` that carries commands from process 0 to the others over JAX's own collectives
(`multihost_utils.broadcast_one_to_all`, so no second network stack), `LeaderLearner` (a
`Learner` for process 0 that announces every call before making it) and `follow` (the loop
learner hosts run: receive a command, make the same call on their own `Learner`).

Why followers: JAX is multi-controller. Every process must call the same jitted function,
on the same global shapes, in the same order; each one feeds and reads only its own devices.
The controller (process 0) decides what happens — it alone talks to rollout workers and
builds batches — so the other processes replay its learner calls. The batch itself crosses
once per step through the broadcast; the mesh spans every process's devices
(`jax.devices()` is global once the runtime is up).

Weights out: `Learner.params` gathers the sharded parameters onto every process
(`process_allgather`); only process 0 writes snapshots (publish). Checkpoints go through
Orbax on every process at once (each writes its own shards to the shared directory; the
primary process writes metadata), so a checkpoint directory must be on storage every
process sees (a shared PVC on Kubernetes).

What it is not: fault tolerant. If process 0 dies, JAX's coordination service (which runs in
process 0) stops answering and the followers exit with an error; restart the whole learner
and `--resume`. A follower that fails a call the leader also failed (e.g. a NaN loss) logs
it and goes on, since the leader raised the same error.

Cost: construction from host parameters broadcasts every weight once (a psum over the
processes' devices), which is fine for models that fit one device; larger models should
start from a checkpoint (`restore`), which reads shards straight into place.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh

from learner import sharding as sh
from learner.api import Batch
from learner.config import DistributedConfig, LearnerConfig
from learner.learner import Learner
from model import decoder
from model.config import ModelConfig

logger = logging.getLogger(__name__)

_HEADER_MIN_BYTES = 256


def initialize(config: DistributedConfig) -> None:
    """Start `jax.distributed` for this process (no-op for one process). Call before any JAX
    computation: the device list becomes global."""
    if not config.enabled:
        return
    if config.local_cpu_devices:
        # The fake-device XLA flag and jax_num_cpu_devices must not disagree.
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        os.environ["XLA_FLAGS"] = " ".join(flags)
        jax.config.update("jax_num_cpu_devices", config.local_cpu_devices)
    # CPU collectives across processes go through gloo (the default since JAX 0.4.3x; set
    # explicitly so an older default of 'none' cannot turn a psum into a silent local sum).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=config.coordinator,
                               num_processes=config.num_processes,
                               process_id=config.process_id,
                               initialization_timeout=config.timeout_s)
    logger.info("jax.distributed: process %d of %d, %d local / %d global devices",
                jax.process_index(), jax.process_count(), jax.local_device_count(),
                jax.device_count())


def is_leader() -> bool:
    return jax.process_index() == 0


# --------------------------------------------------------------------------- channel


class Channel:
    """Commands from process 0 to all processes: a JSON header, then named arrays.

    Every process calls `send` (process 0) or `receive` (the rest) in the same order.
    Header lengths are padded to powers of two so the broadcast compiles once per size class.
    """

    def send(self, op: str, meta: dict[str, Any] | None = None,
             arrays: dict[str, np.ndarray] | None = None) -> None:
        assert is_leader(), "only process 0 sends commands"
        assert not _stopped, f"learner call {op!r} after the learner hosts were stopped"
        arrays = {k: np.asarray(v) for k, v in (arrays or {}).items()}
        header = json.dumps({"op": op, "meta": meta or {},
                             "arrays": [[k, list(v.shape), v.dtype.name] for k, v in arrays.items()]}
                            ).encode()
        self._header(header)
        if arrays:
            multihost_utils.broadcast_one_to_all(arrays)

    def receive(self) -> tuple[str, dict[str, Any], dict[str, np.ndarray]]:
        assert not is_leader(), "process 0 sends, the others receive"
        message = json.loads(self._header(b"").decode())
        specs = message["arrays"]
        arrays: dict[str, np.ndarray] = {}
        if specs:
            zeros = {name: np.zeros(shape, dtype=jax.numpy.dtype(dtype)) for name, shape, dtype in specs}
            arrays = dict(multihost_utils.broadcast_one_to_all(zeros))
        return message["op"], message["meta"], arrays

    @staticmethod
    def _header(payload: bytes) -> bytes:
        length = int(multihost_utils.broadcast_one_to_all(np.array([len(payload)], np.int32))[0])
        size = max(_HEADER_MIN_BYTES, 1 << (length - 1).bit_length())
        buffer = np.zeros(size, np.uint8)
        buffer[:len(payload)] = np.frombuffer(payload, np.uint8)
        return multihost_utils.broadcast_one_to_all(buffer)[:length].tobytes()


_channel = Channel()
_ids = itertools.count()


def _mesh_meta(mesh: Mesh) -> dict[str, Any]:
    return {"shape": [int(mesh.shape[a]) for a in mesh.axis_names], "axes": list(mesh.axis_names),
            "devices": [int(d.id) for d in mesh.devices.flat]}


def _mesh_from_meta(meta: dict[str, Any]) -> Mesh:
    by_id = {d.id: d for d in jax.devices()}
    devices = np.array([by_id[i] for i in meta["devices"]]).reshape(meta["shape"])
    return Mesh(devices, tuple(meta["axes"]),
                axis_types=(jax.sharding.AxisType.Auto,) * len(meta["axes"]))


def _model_config_dict(config: ModelConfig) -> dict[str, Any]:
    d = dataclasses.asdict(config)
    if d.get("rope_scaling") is not None:
        d["rope_scaling"] = dict(d["rope_scaling"])
    return d


def _flatten(prefix: str, tree: Any) -> dict[str, np.ndarray]:
    return {f"{prefix}{i}": np.asarray(leaf) for i, leaf in enumerate(jax.tree.leaves(tree))}


def _unflatten(prefix: str, arrays: dict[str, np.ndarray], model_config: ModelConfig) -> Any:
    abstract = jax.eval_shape(lambda: decoder.init_params(model_config, jax.random.PRNGKey(0)))
    leaves, treedef = jax.tree.flatten(abstract)
    got = [arrays[f"{prefix}{i}"] for i in range(len(leaves))]
    for want, have in zip(leaves, got):
        if tuple(want.shape) != tuple(have.shape):
            raise ValueError(f"follower: parameter shape {have.shape} does not match the model's "
                             f"{want.shape}; processes disagree on the model config")
    return jax.tree.unflatten(treedef, got)


# --------------------------------------------------------------------------- leader


class LeaderLearner(Learner):
    """A `Learner` on process 0 of a multi-process learner: each call that touches devices is
    first announced to the followers, which make the same call. Same interface as `Learner`."""

    _restoring: int | None = None

    def __init__(self, config: LearnerConfig, model_config: ModelConfig, params: Any,
                 mesh: Mesh, *, ref_params: Any | None = None, _state: Any = None) -> None:
        if _state is not None and LeaderLearner._restoring is not None:
            self._remote_id = LeaderLearner._restoring  # announced by `restore`
        else:
            self._remote_id = next(_ids)
        if _state is None:
            arrays = _flatten("p", params)
            if ref_params is not None:
                arrays.update(_flatten("r", ref_params))
            _channel.send("create", {"id": self._remote_id, "config": dataclasses.asdict(config),
                                     "model": _model_config_dict(model_config),
                                     "mesh": _mesh_meta(mesh), "ref": ref_params is not None},
                          arrays)
        super().__init__(config, model_config, params, mesh, ref_params=ref_params, _state=_state)

    @classmethod
    def restore(cls, ckpt_dir: str | Path, *, mesh: Mesh, step: int | None = None,
                config: LearnerConfig | None = None) -> tuple[Learner, dict[str, Any]]:
        if step is None:
            step = cls.latest_step(ckpt_dir)  # one step for everyone, read once
        remote_id = next(_ids)
        _channel.send("restore", {"id": remote_id,
                                  "dir": str(Path(ckpt_dir).absolute()), "mesh": _mesh_meta(mesh),
                                  "step": step,
                                  "config": dataclasses.asdict(config) if config else None})
        cls._restoring = remote_id  # Learner.restore constructs through cls(..., _state=...)
        try:
            return super().restore(ckpt_dir, mesh=mesh, step=step, config=config)
        finally:
            cls._restoring = None

    # Orbax's CheckpointManager meets the other processes at barriers even to list steps, so
    # every process opens it for these too.
    @staticmethod
    def latest_step(ckpt_dir: str | Path) -> int | None:
        _channel.send("latest_step", {"dir": str(Path(ckpt_dir).absolute())})
        return Learner.latest_step(ckpt_dir)

    @staticmethod
    def checkpoint_steps(ckpt_dir: str | Path) -> list[int]:
        _channel.send("checkpoint_steps", {"dir": str(Path(ckpt_dir).absolute())})
        return Learner.checkpoint_steps(ckpt_dir)

    @staticmethod
    def discard_after(ckpt_dir: str | Path, step: int) -> list[int]:
        _channel.send("discard_after", {"dir": str(Path(ckpt_dir).absolute()), "step": step})
        return Learner.discard_after(ckpt_dir, step)

    def _batch_call(self, op: str, batch: Batch, **meta: Any) -> None:
        _channel.send(op, {"id": self._remote_id, **meta}, batch.arrays())

    def train_step(self, batch: Batch) -> dict[str, float]:
        self._batch_call("train", batch)
        return super().train_step(batch)

    def sft_step(self, batch: Batch) -> dict[str, float]:
        self._batch_call("sft", batch)
        return super().sft_step(batch)

    def compute_logprobs(self, batch: Batch, *, reference: bool = False) -> np.ndarray:
        self._batch_call("logprobs", batch, reference=reference)
        return super().compute_logprobs(batch, reference=reference)

    @property
    def params(self) -> Any:
        _channel.send("gather", {"id": self._remote_id})
        return super().params

    def save(self, ckpt_dir: str | Path, extra: dict[str, Any] | None = None, *,
             step: int | None = None) -> int:
        _channel.send("save", {"id": self._remote_id, "dir": str(Path(ckpt_dir).absolute()),
                               "extra": extra or {}, "step": step})
        return super().save(ckpt_dir, extra, step=step)

    def wait(self) -> None:
        _channel.send("wait", {"id": self._remote_id})
        super().wait()

    def close(self) -> None:
        _channel.send("close", {"id": self._remote_id})
        super().close()


_stopped = False


def stop_followers() -> None:
    """Tell every learner host to leave its loop (process 0, at the end of a run). Once: later
    calls do nothing (the hosts are gone and nobody would receive)."""
    global _stopped
    if jax.process_count() > 1 and is_leader() and not _stopped:
        _channel.send("stop")
        _stopped = True


def learner_type() -> type[Learner]:
    """`LeaderLearner` on process 0 of several, else the plain `Learner`."""
    return LeaderLearner if jax.process_count() > 1 else Learner


# --------------------------------------------------------------------------- followers


def follow() -> int:
    """Run a learner host: replay process 0's learner calls until it says stop. Returns the
    number of commands handled."""
    learners: dict[int, Learner] = {}
    handled = 0
    while True:
        op, meta, arrays = _channel.receive()
        handled += 1
        if op == "stop":
            for learner in learners.values():
                learner.close()
            logger.info("learner host %d: stop after %d commands", jax.process_index(), handled)
            return handled
        try:
            _handle(op, meta, arrays, learners)
        except FloatingPointError as error:
            # A non-finite loss: the leader made the same call on the same values and raised
            # the same error; it decides whether the run goes on.
            logger.warning("learner host %d: %s failed like the leader's: %s", jax.process_index(), op, error)
        except BaseException:
            # Anything else means this host can no longer follow. Exit at once (no shutdown
            # barrier): the coordination service then fails the other processes instead of
            # leaving process 0 waiting in a collective.
            logger.exception("learner host %d: %s failed; exiting", jax.process_index(), op)
            logging.shutdown()
            os._exit(1)


def _handle(op: str, meta: dict[str, Any], arrays: dict[str, np.ndarray],
            learners: dict[int, Learner]) -> None:
    if op == "create":
        model_config = ModelConfig(**meta["model"])
        params = _unflatten("p", arrays, model_config)
        ref = _unflatten("r", arrays, model_config) if meta["ref"] else None
        learners[meta["id"]] = Learner(LearnerConfig(**meta["config"]), model_config, params,
                                       _mesh_from_meta(meta["mesh"]), ref_params=ref)
    elif op == "restore":
        config = LearnerConfig(**meta["config"]) if meta["config"] else None
        learners[meta["id"]], _ = Learner.restore(meta["dir"], mesh=_mesh_from_meta(meta["mesh"]),
                                                  step=meta["step"], config=config)
    elif op == "latest_step":
        Learner.latest_step(meta["dir"])
    elif op == "checkpoint_steps":
        Learner.checkpoint_steps(meta["dir"])
    elif op == "discard_after":
        Learner.discard_after(meta["dir"], meta["step"])
    elif op == "train":
        learners[meta["id"]].train_step(Batch(**arrays))
    elif op == "sft":
        learners[meta["id"]].sft_step(Batch(**arrays))
    elif op == "logprobs":
        learners[meta["id"]].compute_logprobs(Batch(**arrays), reference=meta["reference"])
    elif op == "gather":
        learners[meta["id"]].params  # noqa: B018 - the gather is a collective; the leader keeps the result
    elif op == "save":
        learners[meta["id"]].save(meta["dir"], meta["extra"], step=meta["step"])
    elif op == "wait":
        learners[meta["id"]].wait()
    elif op == "close":
        learners.pop(meta["id"]).close()
    else:
        raise RuntimeError(f"learner host: unknown command {op!r} (leader and host run different "
                           f"versions of Orrery?)")
    logger.debug("learner host %d: %s done", jax.process_index(), op)
