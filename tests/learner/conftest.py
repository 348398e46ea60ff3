"""tests/learner set-up: 8 fake CPU devices (helpers live in tests/learner/helpers.py).

The device count must be forced before JAX starts its backend, so it is set here, at
import time, before the test modules import jax. Tests that need 8 devices use
`need_devices(8)` and skip (not fail) when the backend has fewer (e.g. another folder's
conftest started JAX first: run `pytest tests/learner` alone, or export XLA_FLAGS yourself).
"""

import os

# 8 fake CPU devices for the mesh tests; LLVM optimisation level 0 makes XLA:CPU compile
# ~2.5x faster (these tests compile a dozen tiny train steps and run each a few times; the
# numerics are IEEE float32 either way). The benchmark does not use this.
for _flag in ("--xla_force_host_platform_device_count=8", "--xla_backend_optimization_level=0"):
    if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
