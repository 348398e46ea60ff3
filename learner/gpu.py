"""XLA flags for sharded training on GPUs, set and documented in one place.

What it is: `GPU_XLA_FLAGS` and `apply_gpu_flags()`, which appends them to the `XLA_FLAGS`
environment variable. XLA reads that variable once, when the backend starts, so call this
before the first `jax.devices()` / first computation (the controller's entry point does).

What it is not: anything that runs on CPU. The flags are only added when the process will
use a GPU (`JAX_PLATFORMS` names cuda/gpu, or an NVIDIA device node exists and
`JAX_PLATFORMS` does not exclude it); flags the user already set in `XLA_FLAGS` win.

Why each flag (see the JAX "GPU performance tips" page and MaxText's GPU configs):
- `--xla_gpu_enable_latency_hiding_scheduler=true`: schedule FSDP all-gathers and gradient
  reduce-scatters so they overlap with the matmuls of neighbouring layers instead of
  serialising with them. The single biggest win for FSDP.
- `--xla_gpu_enable_triton_gemm=false`: use cuBLAS(Lt) GEMMs; Triton GEMM autotuning often
  picks slower kernels for transformer shapes and costs compile time.
- `--xla_gpu_enable_command_buffer=`: disable CUDA graphs (empty list): they interact badly
  with the collective-overlap schedule and with donated buffers in big train steps.
- `--xla_gpu_all_reduce_combine_threshold_bytes`, `..._all_gather_...`,
  `..._reduce_scatter_...` = 128 MiB: combine many small per-parameter collectives into few
  large ones (fewer NCCL launches; better bandwidth).
- `--xla_gpu_enable_pipelined_all_gather` / `..._reduce_scatter` / `..._all_reduce=true`:
  let the scheduler pipeline the collectives of the scanned layer loop (layer i+1's
  all-gather during layer i's compute).
- `--xla_gpu_enable_while_loop_double_buffering=true`: the same idea for the `nn.scan`
  layer loop's while body.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

_COMBINE_BYTES = str(128 * 1024 * 1024)

GPU_XLA_FLAGS: dict[str, str] = {
    "--xla_gpu_enable_latency_hiding_scheduler": "true",
    "--xla_gpu_enable_triton_gemm": "false",
    "--xla_gpu_enable_command_buffer": "",
    "--xla_gpu_all_reduce_combine_threshold_bytes": _COMBINE_BYTES,
    "--xla_gpu_all_gather_combine_threshold_bytes": _COMBINE_BYTES,
    "--xla_gpu_reduce_scatter_combine_threshold_bytes": _COMBINE_BYTES,
    "--xla_gpu_enable_pipelined_all_gather": "true",
    "--xla_gpu_enable_pipelined_reduce_scatter": "true",
    "--xla_gpu_enable_pipelined_all_reduce": "true",
    "--xla_gpu_enable_while_loop_double_buffering": "true",
}


def gpu_expected() -> bool:
    """Whether this process will run JAX on a GPU, decided without starting a backend."""
    platforms = os.environ.get("JAX_PLATFORMS", "").lower()
    if platforms:
        return any(p in platforms for p in ("cuda", "gpu", "rocm"))
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")


def apply_gpu_flags(force: bool = False) -> list[str]:
    """Add `GPU_XLA_FLAGS` to `XLA_FLAGS` (unless already set there); returns those added.

    No-op on machines without a GPU unless `force`. Must run before the JAX backend starts.
    """
    if not (force or gpu_expected()):
        return []
    current = os.environ.get("XLA_FLAGS", "")
    present = {item.split("=", 1)[0] for item in current.split()}
    added = [f"{flag}={value}" for flag, value in GPU_XLA_FLAGS.items() if flag not in present]
    if added:
        os.environ["XLA_FLAGS"] = " ".join([current, *added]).strip()
        logger.info("XLA_FLAGS for GPU training: %s", " ".join(added))
    return added
