"""An example remote environment: a separate process serving `EnvService` with its own tasks.

    python -m sandbox.remote_example --listen 127.0.0.1:50071 [--delay-s 0.5] [--die-after-steps 3]

The env, "vowels", asks how many vowels a word has. Tools: `spell` {"word"} returns the word's
letters separated by spaces, and `answer` {"answer"}. Scoring: "outcome" and the true metric are
1.0 for the exact count; "format" 1.0 when the agent answered with the tool. Args (EnvSpec.args
of the remote spec): `num_tasks` (default 64), `seed` (default 0), `eval_fraction`.

It implements `sandbox.api.Env` from scratch, without the built-in base class, to show what a
third party writes: an Env, an EnvHost (list_tasks, open) and one call to
`sandbox.service.serve_env`. The controller uses it exactly like a built-in env:
EnvSpec(kind="remote", remote_address="127.0.0.1:50071").

`--delay-s` (a slow server) and `--die-after-steps` (a server that crashes) exist so tests can
check that deadlines, bounded retries and infra errors handle them.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import time

from sandbox.api import Outcome, ProcessVerdict, SafetyPolicy, StepResult, Task, ToolCall, ToolResult, ToolSpec
from sandbox.service import serve_env

WORDS = ("orrery", "planet", "gradient", "sandbox", "verifier", "trajectory", "banana", "rhythm", "sequence",
         "tokenizer", "reward", "policy", "queue", "aeiou", "strength", "education", "abstemious", "crypt")
VOWELS = set("aeiou")
TOOLS = (
    ToolSpec("spell", "Spell a word letter by letter.",
             {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}, 0.01),
    ToolSpec("answer", "Submit your final answer; ends the episode.",
             {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}),
)


class VowelsEnv:
    """One episode: count the vowels of `task.verifier["word"]`."""

    def __init__(self, task: Task, safety: SafetyPolicy):
        self.task = task
        self.safety = safety
        self.answer: str | None = None
        self.cost = 0.0
        self.done = False

    def reset(self) -> str:
        return self.task.prompt

    def tools(self):
        return TOOLS

    def step(self, call: ToolCall) -> StepResult:
        if self.done:
            return StepResult("error: the episode is over", ToolResult(error="episode over", exit_status=1), done=True)
        if call.name == "spell":
            word = str(call.arguments.get("word", ""))[:100]
            self.cost += 0.01
            relevant = word == self.task.verifier["word"]
            return StepResult(" ".join(word), ToolResult(output=" ".join(word), cost=0.01),
                              verdict=ProcessVerdict(1.0 if relevant else 0.0, "spelled the task's word" if relevant
                                                     else "spelled another word"))
        if call.name == "answer":
            self.answer = str(call.arguments.get("answer", ""))
            self.done = True
            return StepResult("submitted", ToolResult(output="submitted"), done=True)
        message = f"unknown tool {call.name!r}; available: spell, answer"
        return StepResult(f"error: {message}", ToolResult(error=message, exit_status=1))

    def outcome(self, answer: str | None) -> Outcome:
        answer = self.answer if answer is None else answer
        correct = answer is not None and answer.strip() == str(self.task.verifier["count"])
        components = {"outcome": float(correct), "format": float(self.answer is not None), "tool_cost": self.cost,
                      "safety": 0.0}
        return Outcome(components, float(correct), correct)

    def close(self) -> None:
        pass


class VowelsHost:
    """The EnvHost: tasks from args, one VowelsEnv per episode; optionally slow or crashing."""

    def __init__(self, delay_s: float = 0.0, die_after_steps: int = 0):
        self.delay_s = delay_s
        self.die_after_steps = die_after_steps
        self.steps = 0

    def list_tasks(self, args):
        num_tasks, seed = int(args.get("num_tasks", 64)), int(args.get("seed", 0))
        rng = random.Random(f"vowels/{seed}")
        n_eval = round(num_tasks * float(args.get("eval_fraction", 0.0)))
        tasks = []
        for i in range(num_tasks):
            word = rng.choice(WORDS)
            tasks.append(Task(f"vowels-s{seed}-{i:04d}", f"How many vowels are in the word '{word}'?",
                              {"word": word, "count": sum(c in VOWELS for c in word)},
                              split="eval" if i < n_eval else "train"))
        return tasks

    def open(self, task, args, safety):
        host = self

        class Env(VowelsEnv):
            def step(self, call):
                host.steps += 1
                if host.die_after_steps and host.steps > host.die_after_steps:
                    os._exit(3)  # simulate a crash: the client must see ENV_UNREACHABLE
                time.sleep(host.delay_s)
                return super().step(call)

        return Env(task, safety)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Example remote EnvService: count the vowels of a word.")
    parser.add_argument("--listen", default="127.0.0.1:50071", help="host:port (port 0 picks a free one)")
    parser.add_argument("--delay-s", type=float, default=0.0, help="sleep this long in every Step")
    parser.add_argument("--die-after-steps", type=int, default=0, help="exit abruptly after this many steps")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    server, port, _ = serve_env(VowelsHost(args.delay_s, args.die_after_steps), args.listen)
    print(f"listening on port {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
