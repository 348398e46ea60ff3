"""`calc`: arithmetic problems solved with the calculator tool. The demo environment.

Args (EnvSpec.args): `level` 1..3, `num_tasks` (default 256), `seed` (default 0).
- level 1: `a + b` or `a * b`, a and b with 2 or 3 digits ("What is 37 * 48?")
- level 2: three 2-digit operands, two operators from + - * ("What is 12 + 34 * 56?")
- level 3: the same with parentheses ("What is (12 + 34) * 56?")

Tools: `calculator` {"expression": ...} (observation: just the value, e.g. "1776") and `answer`
{"answer": ...}. Scoring: "outcome" 1.0 when the answer is exactly the true integer (commas,
spaces and a trailing period are ignored), true_metric the same; "format" 1.0 when the agent
answered through the answer tool; "process" the mean over calculator calls of how much of the
task's computation the call reproduces (`expression_credit`: 1.0 when it has the task's value,
else the share of the task's numbers and operators it has in the same places). The process
component is shaping: it credits the operator and each operand separately, so a sample that
picked the right operation but miscopied a digit is told so, which the all-or-nothing outcome
cannot say. The calculator is pure Python: no sandbox, no workspace.

Tasks are a deterministic function of (level, num_tasks, seed). Expressions are unique within a
generated set, so the eval split (`EnvSpec.eval_fraction`, a seeded choice) never shares a
problem with train.

Simulated tool latency (for benchmarks; all default 0 = no delay, today's behaviour exactly):
`tool_delay_s` seconds slept inside every calculator call, `slow_fraction` the share of calls
that are slow and `slow_factor` how many times longer a slow call sleeps (a heavy tail, e.g.
`{tool_delay_s: 0.05, slow_fraction: 0.1, slow_factor: 10}`). Which calls are slow is a
deterministic function of (task id, index of the calculator call in the episode), see
`tool_delay`, so every sample of a GRPO group meets the same latencies on the same call.
"""

from __future__ import annotations

import random
import re
import time

from sandbox.api import EnvSpec, ProcessVerdict, Task
from sandbox.envs.base import BuiltinEnv, Score, assign_splits
from sandbox.tools import CalculatorError, calculate

LEVELS = (1, 2, 3)

_sleep = time.sleep  # the delay's clock (tests replace it)


def _operand(rng: random.Random, digits: tuple[int, int]) -> int:
    n = rng.randint(*digits)
    return rng.randint(10 ** (n - 1), 10 ** n - 1)


def make_expression(rng: random.Random, level: int) -> str:
    if level == 1:
        return f"{_operand(rng, (2, 3))} {rng.choice('+*')} {_operand(rng, (2, 3))}"
    a, b, c = (_operand(rng, (2, 2)) for _ in range(3))
    op1, op2 = rng.choice("+-*"), rng.choice("+-*")
    if level == 2:
        return f"{a} {op1} {b} {op2} {c}"
    if rng.random() < 0.5:
        return f"({a} {op1} {b}) {op2} {c}"
    return f"{a} {op1} ({b} {op2} {c})"


def generate_tasks(spec: EnvSpec) -> list[Task]:
    level = int(spec.args.get("level", 1))
    num_tasks = int(spec.args.get("num_tasks", 256))
    seed = int(spec.args.get("seed", 0))
    if level not in LEVELS:
        raise ValueError(f"calc: args.level must be one of {LEVELS}, got {level!r}")
    if num_tasks <= 0:
        raise ValueError(f"calc: args.num_tasks must be > 0, got {num_tasks}")
    tool_delay(spec.args, "", 0)  # rejects bad latency args at submission, not mid-episode
    rng = random.Random(f"calc/{level}/{seed}")
    expressions: dict[str, None] = {}  # ordered set
    attempts = 0
    while len(expressions) < num_tasks:
        attempts += 1
        if attempts > 50 * num_tasks:
            raise ValueError(f"calc: cannot draw {num_tasks} distinct level-{level} problems")
        expressions.setdefault(make_expression(rng, level))
    tasks = [
        Task(
            task_id=f"calc-l{level}-s{seed}-{i:05d}",
            prompt=f"What is {expr}?",
            verifier={"answer": calculate(expr), "expression": expr},
            metadata={"level": level},
        )
        for i, expr in enumerate(expressions)
    ]
    return assign_splits(tasks, spec.eval_fraction, seed=f"calc/{level}/{seed}")


_NOISE = re.compile(r"[\s,_$]")
_TERM = re.compile(r"\d+|[-+*/()]")


def expression_credit(expression: object, target: str) -> float:
    """How much of `target`'s computation `expression` reproduces, in [0, 1].

    1.0 when both evaluate to the same value (so `14 * 742` counts for `742 * 14`); otherwise
    the share of the target's terms (integers, operators, parentheses) that `expression` has
    at the same index, over the longer of the two term lists — so extra terms cost credit too.
    Text that is not an expression scores 0."""
    if not isinstance(expression, str):
        return 0.0
    try:
        if calculate(expression) == calculate(target):
            return 1.0
    except CalculatorError:
        return 0.0
    got, want = _TERM.findall(expression), _TERM.findall(target)
    same = sum(a == b for a, b in zip(got, want))
    return same / max(len(got), len(want), 1)


def parse_integer(answer: str | None) -> int | None:
    """"1,776" / " 1776. " -> 1776; anything that is not a plain integer -> None."""
    if answer is None:
        return None
    text = _NOISE.sub("", str(answer)).rstrip(".")
    return int(text) if re.fullmatch(r"[+-]?\d{1,400}", text) else None


def tool_delay(args, task_id: str, call_index: int) -> float:
    """Seconds the `call_index`-th calculator call of an episode of `task_id` sleeps (0 by default)."""
    base = float(args.get("tool_delay_s", 0) or 0)
    fraction = float(args.get("slow_fraction", 0) or 0)
    factor = float(args.get("slow_factor", 0) or 0)
    if base < 0 or not 0 <= fraction <= 1 or factor < 0:
        raise ValueError(f"calc: need tool_delay_s >= 0, 0 <= slow_fraction <= 1, slow_factor >= 0; "
                         f"got {base}, {fraction}, {factor}")
    if base == 0:
        return 0.0
    slow = fraction > 0 and random.Random(f"calc-delay/{task_id}/{call_index}").random() < fraction
    return base * factor if slow else base


class CalcEnv(BuiltinEnv):
    KIND = "calc"
    DEFAULT_TOOLS = ("calculator", "answer")
    NEEDS_WORKSPACE = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tool_delays: list[float] = []  # the delay chosen for each calculator call so far

    def _dispatch(self, call):
        if call.name == "calculator":
            delay = tool_delay(self.spec.args, self.task.task_id, len(self.tool_delays))
            self.tool_delays.append(delay)
            if delay > 0:
                _sleep(delay)
        return super()._dispatch(call)

    def process_verdict(self, call, result, changes) -> ProcessVerdict | None:
        if call.name != "calculator":
            return None
        credit = expression_credit(call.arguments.get("expression"), self.task.verifier["expression"])
        return ProcessVerdict(credit, f"calculator call reproduces {credit:.0%} of the task's expression")

    def score(self, answer: str | None) -> Score:
        value = parse_integer(answer)
        correct = value is not None and value == int(self.task.verifier["answer"])
        return Score(outcome=float(correct), true_metric=float(correct), verified=correct)
