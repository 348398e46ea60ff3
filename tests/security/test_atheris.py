"""The coverage-guided fuzzer (tests/security/fuzz_specs.py, atheris) runs briefly and finds no crash.

Starts from seeds of every door (valid EnvSpec and RolloutGroupRequest protos, the example
env.yaml files) and runs a few thousand mutations; a crash fails the test with libFuzzer's
report, and the crashing input is left in the test's tmp folder. Longer runs: see the harness's
docstring.

Run: .venv/bin/python -m pytest tests/security/test_atheris.py -q
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("atheris", reason="atheris is in the test extra (pyproject.toml)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
HARNESS = ROOT / "tests" / "security" / "fuzz_specs.py"
RUNS = int(os.environ.get("ORRERY_ATHERIS_RUNS", "5000"))


def test_spec_fuzzer_finds_no_crash(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    corpus = tmp_path / "corpus"
    subprocess.run([sys.executable, str(HARNESS), "--write-seeds", str(corpus)], check=True, env=env, timeout=120)
    assert len(list(corpus.iterdir())) >= 3  # two specs and a group, plus examples/envs when present
    done = subprocess.run([sys.executable, str(HARNESS), str(corpus), f"-runs={RUNS}", "-seed=1",
                           f"-artifact_prefix={tmp_path}/"], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    report = done.stderr[-4000:]
    assert done.returncode == 0, report
    assert f"Done {RUNS} runs" in done.stderr, report
    assert not list(tmp_path.glob("crash-*")), report
