"""Weight snapshots: what the learner publishes and rollout workers load.

What it is: `WeightVersion` (the Python twin of the proto message), `params_digest` (a
content hash of a params tree) and save / load of params-only snapshots:

    root_dir/v00000042/params/              Orbax PyTree checkpoint of host numpy arrays
    root_dir/v00000042/weight_version.json  the WeightVersion, digest included

`save_hf_snapshot` writes the same thing as a HF safetensors folder (for SGLang's
`update_weights_from_disk`); its digest is over the same params tree, so either format
verifies against the params that were published.

What it is not: the learner's training checkpoint (optimiser state, RNG, data cursors live
in learner/ and controller/), and not a version allocator. **The publisher owns version
monotonicity**: it must hand out strictly increasing `version` numbers; this module only
refuses to overwrite an existing version folder. Workers must also refuse to go backwards
(design rule 5).

Invariants:
- a snapshot folder appears only complete: everything is written into a temporary sibling
  folder, then renamed into place in one `os.rename` (Orbax also finalises its own tmp dir);
- `load_snapshot` returns host numpy arrays only after their digest matched the
  WeightVersion's, otherwise raises `SnapshotDigestError`; a snapshot that cannot be read
  at all raises `SnapshotError` (its base class) with the cause chained.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import jax
import numpy as np

logger = logging.getLogger(__name__)

FORMATS = ("orbax", "hf_safetensors")
VERSION_FILE = "weight_version.json"
PARAMS_DIR = "params"


class SnapshotError(ValueError):
    """A weight snapshot is unreadable or does not match its WeightVersion."""


class SnapshotDigestError(SnapshotError):
    """The loaded params do not hash to the WeightVersion's digest."""


@dataclasses.dataclass(frozen=True)
class WeightVersion:
    """One published set of weights (mirrors proto WeightVersion)."""

    version: int
    """Strictly increasing per run; assigned by the publisher."""
    step: int
    """Learner step that produced these weights."""
    location: str
    """Snapshot folder (Orbax: holds params/ and weight_version.json; HF: the model folder)."""
    format: str
    """'orbax' or 'hf_safetensors'."""
    digest: str
    """params_digest of the params tree ('sha256:<hex>')."""
    created_at: float
    """Unix time (seconds) the snapshot was written."""

    def __post_init__(self) -> None:
        for name in ("version", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"WeightVersion.{name} must be an int >= 0, got {value!r}")
        if self.format not in FORMATS:
            raise ValueError(f"WeightVersion.format must be one of {FORMATS}, "
                             f"got {self.format!r}")
        if not self.digest.startswith("sha256:"):
            raise ValueError(f"WeightVersion.digest must start with 'sha256:', "
                             f"got {self.digest!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WeightVersion:
        return cls(**data)

    @classmethod
    def read(cls, folder: str | Path) -> WeightVersion:
        """The WeightVersion stored in `folder/weight_version.json`."""
        return cls.from_dict(json.loads((Path(folder) / VERSION_FILE).read_text()))


def params_digest(params: Any) -> str:
    """'sha256:<hex>' over every leaf's path, dtype, shape and little-endian bytes, leaves
    in sorted path order. Equal digests mean bit-identical trees (same structure too)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    items = sorted((jax.tree_util.keystr(path), leaf) for path, leaf in leaves)
    h = hashlib.sha256()
    for path, leaf in items:
        array = np.asarray(leaf)
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        header = f"{path}|{array.dtype.name}|{array.shape}|{array.nbytes}\n".encode()
        h.update(len(header).to_bytes(8, "little"))
        h.update(header)
        h.update(array.tobytes())
    return "sha256:" + h.hexdigest()


def _to_host(params: Any) -> Any:
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), params)


def _publish(root_dir: Path, version: int, write) -> Path:
    """Run write(tmp_dir) and rename tmp_dir to root_dir/v{version:08d} in one step."""
    final = root_dir / f"v{version:08d}"
    if final.exists():
        raise ValueError(f"save_snapshot version must be new (the publisher owns "
                         f"monotonicity), got {version} which already exists at {final}")
    root_dir.mkdir(parents=True, exist_ok=True)
    tmp = root_dir / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
    try:
        write(tmp)
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def save_snapshot(params: Any, root_dir: str | Path, version: int, step: int) -> WeightVersion:
    """Write params (copied to host numpy) as an Orbax snapshot; return its WeightVersion."""
    import orbax.checkpoint as ocp

    host = _to_host(params)
    digest = params_digest(host)
    root_dir = Path(root_dir).absolute()
    location = root_dir / f"v{version:08d}"
    wv = WeightVersion(version=version, step=step, location=str(location), format="orbax",
                       digest=digest, created_at=time.time())

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        # Host arrays written by this process alone: in a multi-process learner only process 0
        # publishes, so Orbax must not wait for the others at its barriers.
        import jax

        alone = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(),
                                                   active_processes={jax.process_index()})
        checkpointer = ocp.StandardCheckpointer(multiprocessing_options=alone)
        checkpointer.save(tmp / PARAMS_DIR, host)
        checkpointer.wait_until_finished()
        checkpointer.close()
        (tmp / VERSION_FILE).write_text(json.dumps(wv.to_dict(), indent=2) + "\n")

    _publish(root_dir, version, write)
    logger.info("published weights v%d (step %d) at %s %s", version, step, location, digest)
    return wv


def save_hf_snapshot(params: Any, config: Any, root_dir: str | Path, version: int, step: int,
                     *, tokenizer_dir: str | Path | None = None) -> WeightVersion:
    """Write params as a float32 HF safetensors folder (model.hf_io.save_hf) + its version."""
    from model.hf_io import save_hf

    host = _to_host(params)
    root_dir = Path(root_dir).absolute()
    location = root_dir / f"v{version:08d}"
    wv = WeightVersion(version=version, step=step, location=str(location),
                       format="hf_safetensors", digest=params_digest(host),
                       created_at=time.time())

    def write(tmp: Path) -> None:
        save_hf(tmp, config, host, tokenizer_dir=tokenizer_dir)
        (tmp / VERSION_FILE).write_text(json.dumps(wv.to_dict(), indent=2) + "\n")

    _publish(root_dir, version, write)
    logger.info("published HF weights v%d (step %d) at %s %s", version, step, location,
                wv.digest)
    return wv


def load_snapshot(wv: WeightVersion, expected_structure: Any = None) -> Any:
    """Restore the params of `wv` as host numpy arrays and check their digest.

    expected_structure (optional): a tree of arrays or ShapeDtypeStructs; the restored tree
    must have the same paths, shapes and dtypes (SnapshotError otherwise)."""
    location = Path(wv.location)
    try:
        if wv.format == "orbax":
            params = _restore_orbax(location / PARAMS_DIR)
        else:
            from model.hf_io import load_hf
            _, params = load_hf(location)
    except Exception as e:  # add which version failed; the cause stays chained
        raise SnapshotError(f"weight snapshot v{wv.version} at {location} must be readable, "
                            f"got {type(e).__name__}: {e}") from e
    if expected_structure is not None:
        _check_structure(wv, params, expected_structure)
    actual = params_digest(params)
    if actual != wv.digest:
        raise SnapshotDigestError(f"weight snapshot v{wv.version} at {location} digest must be "
                                  f"{wv.digest}, got {actual}")
    logger.info("loaded weights v%d from %s (digest ok)", wv.version, location)
    return params


def _restore_orbax(path: Path) -> Any:
    import orbax.checkpoint as ocp

    with ocp.PyTreeCheckpointer() as checkpointer:
        tree = checkpointer.metadata(path).item_metadata.tree
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        return checkpointer.restore(path, restore_args=restore_args)


def _signature(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p): (tuple(x.shape), np.dtype(x.dtype).name) for p, x in leaves}


def _check_structure(wv: WeightVersion, params: Any, expected: Any) -> None:
    got, want = _signature(params), _signature(expected)
    if got != want:
        diff = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise SnapshotError(
            f"weight snapshot v{wv.version} must match expected_structure, got differences at "
            f"{[(k, want.get(k), got.get(k)) for k in diff[:3]]} (expected, actual)")
