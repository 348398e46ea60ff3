"""The pure-PyTorch `sgl_kernel` stand-in (tests/support/sgl_kernel) that lets SGLang's CPU
server run without the compiled package.

Proves: `assign_req_to_token_pool_cpu` writes the same req_to_token table as a slow reference
written from the contract of SGLang's Triton kernel `assign_req_to_token_pool` (request i's
new slots are out_cache_loc[sum_{j<i} (end_j - start_j) :][: end_i - start_i], written at
columns start_i..end_i of row req_pool_indices[i]); any other kernel resolves to a stub that
raises NotImplementedError naming it when called. Needs torch (the project's test extra).

    .venv/bin/python -m pytest tests/rollout/test_sglang_kernel.py -q
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

SUPPORT = Path(__file__).resolve().parents[1] / "support"


@pytest.fixture(scope="module")
def sgl_kernel():
    sys.path.insert(0, str(SUPPORT))
    try:
        module = importlib.import_module("sgl_kernel")
        assert Path(module.__file__).is_relative_to(SUPPORT), module.__file__
        yield module
    finally:
        sys.path.remove(str(SUPPORT))
        sys.modules.pop("sgl_kernel", None)


def reference(rows, table, starts, ends, out_cache_loc):
    """The Triton kernel's contract, one program per request, in numpy."""
    table = table.copy()
    for i, row in enumerate(rows):
        offset = sum(ends[j] - starts[j] for j in range(i))
        n = ends[i] - starts[i]
        table[row, starts[i]:ends[i]] = out_cache_loc[offset:offset + n]
    return table


def test_writes_each_requests_slots_into_its_row(sgl_kernel):
    rng = np.random.default_rng(0)
    pool_len = 16
    rows, starts, ends = [3, 0, 5], [0, 7, 4], [5, 8, 4]  # a prefill, a decode, an empty one
    out_cache_loc = rng.permutation(100)[: sum(e - s for s, e in zip(starts, ends))]
    table = np.full((6, pool_len), -1, np.int32)
    expected = reference(rows, table, starts, ends, out_cache_loc)

    got = torch.from_numpy(table.copy())
    sgl_kernel.assign_req_to_token_pool_cpu(
        torch.tensor(rows, dtype=torch.int64), got, torch.tensor(starts, dtype=torch.int64),
        torch.tensor(ends, dtype=torch.int64), torch.from_numpy(out_cache_loc), pool_len)
    np.testing.assert_array_equal(got.numpy(), expected)
    # rows 1, 2 and 4 (and row 5: its request had no new tokens) are untouched
    assert (got.numpy()[[1, 2, 4, 5]] == -1).all()


def test_pool_len_must_match_the_table(sgl_kernel):
    table = torch.zeros((2, 8), dtype=torch.int32)
    one = torch.tensor([0])
    with pytest.raises(ValueError, match="pool_len"):
        sgl_kernel.assign_req_to_token_pool_cpu(one, table, torch.tensor([0]), torch.tensor([1]),
                                                torch.tensor([4]), 9)


def test_other_kernels_import_but_raise_when_called(sgl_kernel):
    from sgl_kernel import copy_all_layer_kv_cache_cpu  # SGLang imports this at module load

    with pytest.raises(NotImplementedError, match="copy_all_layer_kv_cache_cpu"):
        copy_all_layer_kv_cache_cpu()
    with pytest.raises(AttributeError):
        sgl_kernel.__wrapped__  # private names stay ordinary AttributeErrors
