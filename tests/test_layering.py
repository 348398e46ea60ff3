"""The import arrows of DESIGN.md section 2, checked file by file (fast, pure Python).

    controller -> learner, rollout, sandbox, model, orrery
    learner    -> model
    rollout    -> model, sandbox (client side: sandbox.api / .client / .wire), orrery
    sandbox    -> orrery
    model      -> (nothing)

`orrery` holds the generated protobuf code (`orrery.v1`) and the hand-written access control
(`orrery.security`). Outside `orrery/` itself and the tests, only the files that sit on the wire
may import the generated code: wire.py (converters), service.py, server.py and client.py. Every
other file works with the Python dataclasses; any file of a package that may import orrery may
import `orrery.security`.

Tests: tests/<package>/ may import <package> and what <package> may import (the same set
its Bazel py_test can import), `orrery` included only where the package may import it, but
from any file; tests/proto/ (messages and converters) imports orrery, sandbox, rollout and
controller; other test folders and top-level tests are unrestricted.

The same table is in the top-level BUILD as py_library deps; the last tests here check that
the two agree, so `bazel test //...` enforces the arrows too. Run alone with
`python tests/test_layering.py` (prints every violation).
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import sys
import warnings
from collections.abc import Iterable, Iterator

ROOT = pathlib.Path(__file__).absolute().parent.parent

# Top-level first-party packages; `orrery` is the generated protobuf code.
PACKAGES = ("orrery", "model", "learner", "rollout", "sandbox", "controller")

# package -> the other first-party packages it may import.
ALLOWED: dict[str, frozenset[str]] = {
    "orrery": frozenset(),
    "model": frozenset(),
    "learner": frozenset({"model"}),
    "sandbox": frozenset({"orrery"}),
    "rollout": frozenset({"model", "sandbox", "orrery"}),
    "controller": frozenset({"learner", "rollout", "sandbox", "model", "orrery"}),
}

# The only sandbox modules rollout code may import: its client side.
# sandbox.validation is there because a worker checks the specs it is sent as the controller does.
SANDBOX_CLIENT_SIDE = frozenset({"sandbox", "sandbox.api", "sandbox.client", "sandbox.wire", "sandbox.validation"})

# Outside orrery/ and tests, only these files may import the generated code.
WIRE_FILES = frozenset({"wire.py", "service.py", "client.py", "server.py"})

# package -> its Bazel py_library in the top-level BUILD.
BAZEL_TARGET = {p: ("orrery_proto" if p == "orrery" else p) for p in PACKAGES}

# tests/<folder> -> the packages it may import (the deps of its Bazel py_test).
TEST_ALLOWED: dict[str, frozenset[str]] = {
    **{p: ALLOWED[p] | {p} for p in PACKAGES if p != "orrery"},
    # Contract tests: the messages and every side's converters (wire.py) between them and the
    # dataclasses. model and learner never touch the wire.
    "proto": frozenset({"orrery", "sandbox", "rollout", "controller"}),
}

# (file, imported module's package) -> why it is tolerated for now. Each entry is a known
# violation reported to the lead; once the import is gone the test warns that the entry can go.
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {
}


@dataclasses.dataclass(frozen=True)
class Violation:
    path: str
    line: int
    module: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.module}: {self.why}"


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) for every import, including importlib.import_module("x")
    and __import__("x") with a literal name. Relative imports stay inside their package and
    are skipped."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                yield node.lineno, node.module
                # `from sandbox import wire` imports sandbox.wire.
                for alias in node.names:
                    if alias.name != "*":
                        yield node.lineno, f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant) \
                    and isinstance(first.value, str) and not first.value.startswith("."):
                yield node.lineno, first.value


def _generated(module: str) -> bool:
    """Whether `module` is generated protobuf code (orrery.v1...); orrery.security is hand-written
    and open to every package that may import orrery. `from orrery import v1` is judged by its
    second name, "orrery.v1"."""
    return module.split(".")[:2] == ["orrery", "v1"]


def check_file(path: pathlib.Path, rel: str, owner: str, allowed: frozenset[str], *,
               is_test: bool) -> list[Violation]:
    """Violations in one file owned by `owner` (a package, or a tests folder when is_test)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
    except SyntaxError as exc:
        return [Violation(rel, exc.lineno or 0, "?", f"does not parse: {exc.msg}")]
    found: list[Violation] = []
    seen: set[tuple[int, str]] = set()
    for line, module in imported_modules(tree):
        top = module.split(".")[0]
        if top not in PACKAGES or (line, top) in seen:
            continue
        if top == owner and not is_test:
            continue
        if top not in allowed:
            seen.add((line, top))
            who = f"tests/{owner}" if is_test else owner
            ok = ", ".join(sorted(allowed)) or "no first-party package"
            found.append(Violation(rel, line, module, f"{who} may import only {ok} (DESIGN.md section 2)"))
            continue
        if is_test:
            continue
        if top == "orrery" and _generated(module) and path.name not in WIRE_FILES:
            seen.add((line, top))
            found.append(Violation(rel, line, module, "generated protobuf code may be imported only from "
                                   + ", ".join(sorted(WIRE_FILES)) + "; use the package's dataclasses"))
        elif owner == "rollout" and top == "sandbox" and module != "sandbox":
            # `from sandbox import api` yields "sandbox" and "sandbox.api": the second is judged.
            submodule = ".".join(module.split(".")[:2])
            if submodule not in SANDBOX_CLIENT_SIDE and (line, submodule) not in seen:
                seen.add((line, submodule))
                found.append(Violation(rel, line, submodule, "rollout may use only the sandbox's client side: "
                                       + ", ".join(sorted(SANDBOX_CLIENT_SIDE))))
    return found


def python_files(folder: pathlib.Path) -> Iterable[pathlib.Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def check_tree(root: pathlib.Path) -> tuple[list[Violation], int]:
    """All violations under root, and how many files were read."""
    violations: list[Violation] = []
    count = 0
    for package in PACKAGES:
        for path in python_files(root / package):
            count += 1
            violations += check_file(path, path.relative_to(root).as_posix(), package, ALLOWED[package],
                                     is_test=False)
    tests = root / "tests"
    for folder, allowed in TEST_ALLOWED.items():
        for path in python_files(tests / folder):
            count += 1
            violations += check_file(path, path.relative_to(root).as_posix(), folder, allowed, is_test=True)
    return violations, count


def bazel_library_deps(build_file: pathlib.Path) -> dict[str, list[str]]:
    """name -> deps of every py_library in a BUILD file (Starlark parses as Python here)."""
    tree = ast.parse(build_file.read_text(encoding="utf-8"), filename=str(build_file))
    libraries: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "py_library":
            kwargs = {k.arg: k.value for k in node.keywords}
            name = ast.literal_eval(kwargs["name"])
            libraries[name] = ast.literal_eval(kwargs["deps"]) if "deps" in kwargs else []
    return libraries


def bazel_test_deps(build_file: pathlib.Path) -> dict[str, list[str]]:
    """The TEST_DEPS table of the BUILD file: tests/<folder> -> deps of its py_test."""
    tree = ast.parse(build_file.read_text(encoding="utf-8"), filename=str(build_file))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TEST_DEPS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("BUILD has no TEST_DEPS table")


# --- tests ------------------------------------------------------------------------------------


def test_imports_follow_the_arrows():
    found, count = check_tree(ROOT)
    assert count > 0, f"no Python files found under {ROOT}"
    violations = [v for v in found if (v.path, v.module.split(".")[0]) not in KNOWN_VIOLATIONS]
    fixed = sorted(set(KNOWN_VIOLATIONS) - {(v.path, v.module.split(".")[0]) for v in found})
    if fixed:
        warnings.warn(f"no longer violated, delete from KNOWN_VIOLATIONS in tests/test_layering.py: {fixed}")
    assert not violations, f"{len(violations)} import(s) cross the arrows of DESIGN.md:\n" + "\n".join(
        map(str, violations))


def test_bazel_library_deps_are_the_arrows():
    build = ROOT / "BUILD"
    libraries = bazel_library_deps(build)
    for package in PACKAGES:
        target = BAZEL_TARGET[package]
        assert target in libraries, f"BUILD has no py_library {target!r} for {package}/"
        want = sorted(f":{BAZEL_TARGET[p]}" for p in ALLOWED[package])
        assert sorted(libraries[target]) == want, f"BUILD: {target} deps {libraries[target]}, arrows say {want}"
    extra = set(libraries) - set(BAZEL_TARGET.values())
    assert not extra, f"BUILD has py_library targets outside the design's table: {sorted(extra)}"


def test_bazel_test_deps_match():
    test_deps = bazel_test_deps(ROOT / "BUILD")
    want = {p: [f":{BAZEL_TARGET[p]}"] for p in PACKAGES if p != "orrery"} | {"proto": [":controller"]}
    assert test_deps == want, "BUILD TEST_DEPS must give tests/<package> exactly its package's target"


def _write(root: pathlib.Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_checker_catches_each_kind_of_violation(tmp_path):
    _write(tmp_path, "model/ok.py", "import numpy\nfrom model import config\nfrom . import x\n")
    _write(tmp_path, "model/bad.py", "import os\nfrom learner.losses import grpo\n")
    _write(tmp_path, "learner/bad.py", "import importlib\nm = importlib.import_module('rollout.engine')\n")
    _write(tmp_path, "learner/ok.py", "import model.decoder\n")
    _write(tmp_path, "sandbox/tools.py", "from orrery.v1 import env_pb2\n")
    _write(tmp_path, "sandbox/wire.py", "from orrery.v1 import env_pb2\n")
    _write(tmp_path, "rollout/agent.py", "from sandbox import api\nfrom sandbox.pool import Pool\n"
                                         "from sandbox import isolation\n")
    _write(tmp_path, "rollout/client.py", "from sandbox.wire import to_proto\nfrom orrery.v1 import env_pb2\n")
    _write(tmp_path, "controller/main.py", "import learner, rollout, sandbox, model\n")
    _write(tmp_path, "tests/learner/test_x.py", "import learner\nimport model\nimport sandbox\n")
    _write(tmp_path, "tests/rollout/test_x.py", "from sandbox.pool import Pool\nimport orrery\n")
    _write(tmp_path, "tests/e2e/test_x.py", "import controller, learner\n")
    violations, _ = check_tree(tmp_path)
    got = sorted((v.path, v.line, v.module) for v in violations)
    assert got == [
        ("learner/bad.py", 2, "rollout.engine"),
        ("model/bad.py", 2, "learner.losses"),
        ("rollout/agent.py", 2, "sandbox.pool"),
        ("rollout/agent.py", 3, "sandbox.isolation"),
        ("sandbox/tools.py", 1, "orrery.v1"),
        ("tests/learner/test_x.py", 3, "sandbox"),
    ], "\n".join(map(str, violations))
    message = str(next(v for v in violations if v.path == "model/bad.py"))
    assert message.startswith("model/bad.py:2: imports learner.losses: model may import only no first-party")


if __name__ == "__main__":
    found, n = check_tree(ROOT)
    for v in found:
        known = KNOWN_VIOLATIONS.get((v.path, v.module.split(".")[0]))
        print(f"{v}" + (f"  [known: {known}]" if known else ""))
    print(f"{n} files read, {len(found)} violation(s)")
    sys.exit(1 if any((v.path, v.module.split(".")[0]) not in KNOWN_VIOLATIONS for v in found) else 0)
