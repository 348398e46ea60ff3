"""py_test targets that run pytest on a folder inside Bazel's runfiles tree."""

# Files every test target sees besides its own folder: pytest's configuration (the
# tests/conftest.py and tests/support/ helpers are globbed in too when they exist).
COMMON_TEST_DATA = ["//:pyproject.toml"]

def pytest_dir(name, paths, deps, data = [], pytest_args = [], size = "medium", tags = [], **kwargs):
    """One py_test that runs `pytest <paths> <pytest_args>` with exactly `deps` importable.

    Args:
      name: target name.
      paths: the folders or files to test, relative to the workspace root.
      deps: py_library targets the tests may import (and, transitively, theirs).
      data: extra files the tests read (fixtures, .proto sources, ...).
      pytest_args: extra pytest arguments, e.g. ["-m", "not slow"] or ["-k", "not big"].
      size: Bazel test size (sets the default timeout).
      tags: Bazel tags.
      **kwargs: passed to py_test (timeout, shard_count, env, ...).
    """
    own = COMMON_TEST_DATA + native.glob(
        paths + [p + "/**" for p in paths] + ["tests/conftest.py", "tests/__init__.py", "tests/support/**"],
        exclude = ["**/__pycache__/**", "**/*.pyc"],
    )
    native.py_test(
        name = name,
        srcs = ["//tools/bazel:pytest_main.py"],
        main = "//tools/bazel:pytest_main.py",
        args = paths + pytest_args,
        data = data + [f for f in own if f not in data],
        deps = deps,
        python_version = "PY3",
        srcs_version = "PY3",
        size = size,
        tags = tags,
        **kwargs
    )
