"""Entry point of Orrery's Bazel py_test targets: runs pytest on the paths it is given.

Bazel runs it from the test's runfiles tree, which holds only the files of the targets the
test depends on. The project is not installed in the venv, so `import learner` inside a test
of `//:model` fails here even though it works from the checkout: that is the point.

    tools/bazel/pytest_main.py tests/model [pytest args...]

pytest's exit code 5 (nothing collected, e.g. every test deselected by a marker) counts as a
pass and says so.
"""

from __future__ import annotations

import os
import pathlib
import sys


def _workspace_root() -> pathlib.Path:
    srcdir = os.environ.get("TEST_SRCDIR")
    workspace = os.environ.get("TEST_WORKSPACE")
    if srcdir and workspace:
        return pathlib.Path(srcdir) / workspace
    # Run by hand from the checkout: tools/bazel/pytest_main.py -> repo root.
    return pathlib.Path(__file__).absolute().parent.parent.parent


def _check_interpreter() -> None:
    try:
        import pytest  # noqa: F401
    except ImportError:
        sys.exit(
            f"pytest is not importable from {sys.executable}: install the test dependencies "
            "with `bash scripts/setup_env.sh test` (.ci/bazel.sh does this)."
        )


def main(argv: list[str]) -> int:
    _check_interpreter()
    import pytest

    root = _workspace_root()
    os.chdir(root)
    args = ["-p", "no:cacheprovider", "--rootdir", str(root)]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append(f"--junitxml={xml}")
    rc = pytest.main(args + argv)
    if rc == pytest.ExitCode.NO_TESTS_COLLECTED:
        print(f"pytest collected nothing from {argv}: counted as a pass")
        return 0
    return int(rc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
