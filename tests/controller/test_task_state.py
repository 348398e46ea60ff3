"""Task cursors across a resume (controller/tasks.py): consumed ids are checked against the env's
current tasks, and an env whose task list cannot be fetched at resume keeps its position.

Run: `.venv/bin/python -m pytest tests/controller/test_task_state.py -q` (seconds).
"""

import pytest

from controller.tasks import TaskSource
from sandbox.api import EnvInfraError, EnvSpec, InfraErrorClass, Task


def _spec(n: int = 10) -> EnvSpec:
    return EnvSpec(name="e", kind="calc", tasks=tuple(Task(f"t{i}", "p") for i in range(n)))


def test_state_lists_the_consumed_ids_and_a_changed_task_list_is_refused():
    source = TaskSource(seed=3)
    handed = [source.next_task(_spec()).task_id for _ in range(4)]
    state = source.state()
    assert state["envs"]["e"]["consumed"] == handed
    changed = EnvSpec(name="e", kind="calc", tasks=tuple(Task(f"u{i}", "p") for i in range(10)))
    with pytest.raises(ValueError, match="task state of env 'e': the 4 consumed task ids must be the first"):
        TaskSource(seed=3).load_state(state, {"e": changed})


def test_an_env_unreachable_at_resume_keeps_its_position_until_it_is_back():
    spec = _spec()
    source = TaskSource(seed=3)
    [source.next_task(spec) for _ in range(4)]
    state = source.state()
    upcoming = [source.next_task(spec).task_id for _ in range(3)]

    down = True

    def lister(s):
        if down:
            raise EnvInfraError(InfraErrorClass.ENV_UNREACHABLE, "ListTasks: connection refused")
        return list(s.tasks)

    resumed = TaskSource(seed=3, lister=lister)
    resumed.load_state(state, {"e": spec})  # does not raise: the position waits
    assert resumed.state()["envs"]["e"] == state["envs"]["e"]  # a checkpoint now keeps it too
    with pytest.raises(EnvInfraError):
        resumed.next_task(spec)
    down = False
    assert [resumed.next_task(spec).task_id for _ in range(3)] == upcoming
