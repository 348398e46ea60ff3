"""A pure-PyTorch stand-in for SGLang's compiled `sgl_kernel` CPU package (tests only).

Why it exists: SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE=1`) imports `sgl_kernel`, a
compiled extension that PyPI does not ship for CPU. On the path our tests take (a float32
Llama, `--attention-backend torch_native`, `--sampling-backend pytorch`, no CUDA graphs, no
AMX) SGLang calls exactly one of its functions, `assign_req_to_token_pool_cpu`. This package
implements that one in plain PyTorch so a real SGLang server runs on a CPU-only machine.
`.ci/sglang_server.sh` puts `tests/support` on the server's PYTHONPATH; nothing in Orrery
imports it.

What it is not: the rest of sgl_kernel. Any other public name resolves to a stub whose call
raises NotImplementedError naming it (SGLang imports a few kernels at module import time that
this path never calls, so failing on the attribute access itself would stop the server from
starting), so a new SGLang code path that needs another kernel fails loudly at the call site
instead of silently computing something else. It registers no `torch.ops.sgl_kernel` operators, so
SGLang's AMX detection (`hasattr(torch.ops.sgl_kernel, "convert_weight_packed")`) stays off.

Checked against sglang 0.5.23 (`sglang/srt/mem_cache/allocation.py`).
"""

from __future__ import annotations

import torch

__version__ = "0.0.0+orrery.standin"
__all__ = ["assign_req_to_token_pool_cpu"]


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV-cache slot indices into its row of `req_to_token`, in place.

    For request i (row r = req_pool_indices[i]) the slots req_to_token[r, start[i]:end[i]] get
    the next end[i] - start[i] entries of `out_cache_loc`, which holds all requests' new slots
    back to back in batch order (request i's block starts at sum_{j<i} (end[j] - start[j])).
    The same contract as SGLang's Triton kernel `assign_req_to_token_pool`; `pool_len` is
    req_to_token.shape[1], kept for signature compatibility.
    """
    if req_to_token.shape[1] != pool_len:
        raise ValueError(
            f"assign_req_to_token_pool_cpu: pool_len must equal req_to_token.shape[1] "
            f"({req_to_token.shape[1]}), got {pool_len}"
        )
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    if not len(rows) == len(starts) == len(ends):
        raise ValueError(
            "assign_req_to_token_pool_cpu: req_pool_indices, start_offset and end_offset must "
            f"have one entry per request, got {len(rows)}, {len(starts)}, {len(ends)}"
        )
    offset = 0
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        if n <= 0:
            continue
        if end > pool_len:
            raise ValueError(
                f"assign_req_to_token_pool_cpu: end offset {end} exceeds pool_len {pool_len}"
            )
        req_to_token[row, start:end] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n
    if offset > out_cache_loc.numel():
        raise ValueError(
            f"assign_req_to_token_pool_cpu: requests need {offset} slots, out_cache_loc has "
            f"{out_cache_loc.numel()}"
        )


def _not_implemented(name: str):
    def stub(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not implemented by Orrery's pure-PyTorch stand-in "
            f"(tests/support/sgl_kernel); only assign_req_to_token_pool_cpu is. SGLang took a "
            f"CPU code path that needs another compiled kernel: check the server flags "
            f"(.ci/sglang_server.sh) or implement {name} here."
        )

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = f"Not implemented in the stand-in: calling it raises NotImplementedError."
    return stub


def __getattr__(name: str):
    # Called only for names not defined above (PEP 562). SGLang imports several kernels at
    # module import time (`from sgl_kernel import copy_all_layer_kv_cache_cpu` in
    # sglang/kernels/ops/kvcache/cache_move.py) without calling them on our path, so the
    # name resolves to a stub and the NotImplementedError comes when it is called.
    # Private and dunder names stay AttributeError so Python's own probing is unaffected.
    if name.startswith("_"):
        raise AttributeError(f"module 'sgl_kernel' (Orrery stand-in) has no attribute {name!r}")
    return _not_implemented(name)
