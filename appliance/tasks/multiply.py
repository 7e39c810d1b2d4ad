"""builtin:multiply, the demo task: "What is a * b?" for every ordered pair in the operand range.

Small enough that a 135M model learns it on a CPU, and the held-out pairs are
never trained on, so eval accuracy measures generalisation, not recall.
"""

from __future__ import annotations

from appliance.tasks.task import Problem, TaskError, split_held_out


def multiply_problems(operand_min: int, operand_max: int) -> list[Problem]:
    """All ordered pairs (a, b) with operand_min <= a, b <= operand_max, in a fixed order."""
    return [
        Problem(id=f"multiply-{a}x{b}", question=f"What is {a} * {b}?", answer=str(a * b), metadata={"a": a, "b": b})
        for a in range(operand_min, operand_max + 1)
        for b in range(operand_min, operand_max + 1)
    ]


def load_multiply(operand_min: int, operand_max: int, held_out: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, held_out) problems; raises TaskError naming task.held_out when it leaves nothing to train on."""
    problems = multiply_problems(operand_min, operand_max)
    if held_out >= len(problems):
        raise TaskError(
            f"task.held_out ({held_out}) must be smaller than the {len(problems)} multiply problems"
            f" (operands {operand_min}..{operand_max}, {operand_max - operand_min + 1}^2 ordered pairs);"
            f" lower task.held_out or widen task.operand_min/task.operand_max"
        )
    return split_held_out(problems, held_out, seed, source="builtin:multiply")
