"""The learner's device mesh and the one table that maps logical axis names onto it.

What it is: mesh axis names (`data`, `fsdp`, `tensor`), a parser for mesh specs such as
`"data=2,fsdp=4,tensor=1"`, `make_mesh`, the logical-axis rule table, and helpers that turn
`model.decoder.param_logical_axes(config)` into `NamedSharding`s (and log every parameter's
resolved sharding once at startup).

What it is not: model code. The model names only logical axes (parameters through
`nn.with_logical_partitioning`, activations through `nn.with_logical_constraint`); this file
decides where those names land. The rollout engine has its own mesh (a separate value).

Two layouts, one table (levanter keeps "parameter" and "compute" mappings apart too):
- parameter layout: where weights (and so optimiser state) live. FSDP shards the `embed`
  dimension of every matrix; tensor parallelism shards `mlp` / `heads` / `kv_heads` / `vocab`.
- activation layout: where activations live inside the step. The batch is split over
  `data` and `fsdp` (FSDP is data parallel for activations; weights are all-gathered per
  layer), `embed` is replicated, the tensor-parallel names stay on `tensor`.

A dimension that does not divide by its mesh axes is left replicated (and logged), so a
tiny model or an odd head count still runs on any mesh.

Shape-suffix letter key (used on array names across learner/): b batch (sequences),
t tokens (positions within a sequence), v vocabulary, d hidden (embed), f mlp width,
h query heads, k kv heads, e head dim, l layers, n flat samples (trajectories), g groups,
u turns of one trajectory, m microbatches.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

logger = logging.getLogger(__name__)

MESH_AXES: tuple[str, ...] = ("data", "fsdp", "tensor")
"""Mesh axis names, outermost first: pure data parallel, fully-sharded data parallel,
tensor (model) parallel. `tensor` is innermost so its collectives stay on the fastest links."""

BATCH_AXES: tuple[str, ...] = ("data", "fsdp")
"""Mesh axes the batch dimension is split over (the data-parallel degree is their product)."""

# logical name -> (parameter layout, activation layout). None means replicated.
# This is the only place logical names meet mesh axes.
LOGICAL_AXIS_TABLE: dict[str, tuple[Any, Any]] = {
    #  logical      parameters   activations
    "batch":      (None,        BATCH_AXES),
    "seq":        (None,        None),
    "embed":      ("fsdp",      None),
    "mlp":        ("tensor",    "tensor"),
    "heads":      ("tensor",    "tensor"),
    "kv_heads":   ("tensor",    "tensor"),
    "vocab":      ("tensor",    "tensor"),
    "head_dim":   (None,        None),
    "layers":     (None,        None),
}

PARAM_RULES: tuple[tuple[str, Any], ...] = tuple(
    (name, layouts[0]) for name, layouts in LOGICAL_AXIS_TABLE.items())
"""Flax-style logical axis rules for parameters (and optimiser state)."""

ACTIVATION_RULES: tuple[tuple[str, Any], ...] = tuple(
    (name, layouts[1]) for name, layouts in LOGICAL_AXIS_TABLE.items())
"""Flax-style logical axis rules for activation constraints inside the step."""


# --------------------------------------------------------------------------- mesh


def parse_mesh_spec(spec: str | None, num_devices: int | None = None) -> dict[str, int]:
    """`"data=2,fsdp=4,tensor=1"` -> {'data': 2, 'fsdp': 4, 'tensor': 1}.

    Missing axes are 1; one axis may be -1, meaning "the devices left over". An empty or
    None spec puts every device on `fsdp`. The product must equal `num_devices`
    (default: `jax.device_count()`).
    """
    if num_devices is None:
        num_devices = jax.device_count()
    sizes = {axis: 1 for axis in MESH_AXES}
    if spec is None or not spec.strip():
        sizes["fsdp"] = num_devices
        return sizes
    seen: set[str] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"mesh spec {spec!r}: each entry must be axis=size, got {part!r}")
        if name not in MESH_AXES:
            raise ValueError(f"mesh spec {spec!r}: axis must be one of {MESH_AXES}, "
                             f"got {name!r}")
        if name in seen:
            raise ValueError(f"mesh spec {spec!r}: axis {name!r} is given twice")
        seen.add(name)
        try:
            size = int(value)
        except ValueError:
            raise ValueError(f"mesh spec {spec!r}: size of {name!r} must be an int or -1, "
                             f"got {value.strip()!r}") from None
        if size == 0 or size < -1:
            raise ValueError(f"mesh spec {spec!r}: size of {name!r} must be positive or -1, "
                             f"got {size}")
        sizes[name] = size
    wild = [name for name, size in sizes.items() if size == -1]
    if len(wild) > 1:
        raise ValueError(f"mesh spec {spec!r}: at most one axis may be -1, got {wild}")
    known = math.prod(size for size in sizes.values() if size != -1)
    if wild:
        if num_devices % known:
            raise ValueError(f"mesh spec {spec!r}: {num_devices} devices do not divide by "
                             f"the fixed axes' product {known}")
        sizes[wild[0]] = num_devices // known
    elif known != num_devices:
        raise ValueError(f"mesh spec {spec!r}: axis sizes multiply to {known}, "
                         f"but there are {num_devices} devices")
    return sizes


def make_mesh(spec: str | dict[str, int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `Mesh` with axes `MESH_AXES` (all `AxisType.Auto`: XLA propagates shardings)."""
    if devices is None:
        devices = jax.devices()
    sizes = spec if isinstance(spec, dict) else parse_mesh_spec(spec, len(devices))
    shape = tuple(sizes[axis] for axis in MESH_AXES)
    if math.prod(shape) != len(devices):
        raise ValueError(f"mesh sizes {sizes} need {math.prod(shape)} devices, "
                         f"got {len(devices)}")
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=list(devices))


def select_devices(local_indices: Sequence[int] = ()) -> list[jax.Device]:
    """The devices a learner mesh is built on: on every process, its local devices at
    `local_indices` (empty = all of them). Errors name the indices and what there is."""
    if not local_indices:
        return list(jax.devices())
    chosen = []
    for process in range(jax.process_count()):
        local = sorted((d for d in jax.devices() if d.process_index == process), key=lambda d: d.id)
        bad = [i for i in local_indices if not 0 <= i < len(local)]
        if bad:
            raise ValueError(f"devices.learner {list(local_indices)}: indices {bad} are out of range; "
                             f"process {process} has {len(local)} local devices (0..{len(local) - 1})")
        chosen.extend(local[i] for i in local_indices)
    return chosen


def data_parallel_size(mesh: Mesh) -> int:
    """How many ways the batch dimension is split (rows must divide by this)."""
    return math.prod(mesh.shape[axis] for axis in BATCH_AXES)


def describe(mesh: Mesh) -> str:
    return ",".join(f"{axis}={mesh.shape[axis]}" for axis in MESH_AXES)


@contextlib.contextmanager
def activation_context(mesh: Mesh) -> Iterator[None]:
    """Makes the model's `with_logical_constraint` calls bind to `mesh` (use around tracing)."""
    with jax.set_mesh(mesh), nn.logical_axis_rules(ACTIVATION_RULES):
        yield


# --------------------------------------------------------------------------- shardings


def _is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec)


def logical_to_mesh_spec(logical: PartitionSpec, shape: Sequence[int], mesh: Mesh,
                         rules: Sequence[tuple[str, Any]] = PARAM_RULES) -> PartitionSpec:
    """Resolve one logical spec to mesh axes; dimensions that do not divide stay replicated."""
    resolved = nn.logical_to_mesh_axes(tuple(logical), rules)
    dims = []
    for size, axes in zip(shape, tuple(resolved) + (None,) * (len(shape) - len(resolved))):
        if axes is not None:
            names = (axes,) if isinstance(axes, str) else tuple(axes)
            ways = math.prod(mesh.shape[a] for a in names)
            if size % ways:
                axes = None
        dims.append(axes)
    while dims and dims[-1] is None:
        dims.pop()
    return PartitionSpec(*dims)


def param_shardings(mesh: Mesh, logical_axes: Any, shapes: Any) -> Any:
    """NamedShardings for a params tree from its logical specs and shapes (arrays or
    ShapeDtypeStructs with the same tree structure)."""
    return jax.tree.map(
        lambda spec, x: NamedSharding(mesh, logical_to_mesh_spec(spec, x.shape, mesh)),
        logical_axes, shapes, is_leaf=_is_spec)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Rows split over the data-parallel axes, everything else replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def to_host(tree: Any) -> Any:
    """Host (numpy) copy of a tree of arrays. When a mesh spans several processes, an array
    sharded over other processes' devices is gathered (`process_allgather`): that is a
    collective, so every process must make the same call (learner/multihost.py sees to it)."""
    if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(tree)):
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def log_param_shardings(params: Any, shardings: Any, title: str = "params") -> None:
    """One log line per parameter: path, shape, resolved PartitionSpec, per-device shape."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    specs = jax.tree.leaves(shardings, is_leaf=lambda s: isinstance(s, NamedSharding))
    total = 0
    for (path, x), sharding in zip(leaves, specs):
        total += int(np.prod(x.shape))
        logger.info("%s %-40s %-18s %-32s shard %s", title, jax.tree_util.keystr(path),
                    tuple(x.shape), sharding.spec, sharding.shard_shape(tuple(x.shape)))
    logger.info("%s: %d arrays, %.2fM values", title, len(leaves), total / 1e6)
