"""Malformed job files through the real CLI: each exits 2 and names the key (and line) to fix.

Every case is a whole small job file, so the expected line numbers can be read
off the text. The model store is the shared test data dir holding the bundled
model, so model-name checks run for real.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field

import pytest

from appliance.cli.main import EXIT_BAD_INPUT, main


@dataclass(frozen=True)
class Case:
    id: str
    job: str
    key: str  # the key the error must name ('(top)' for the whole file)
    line: int | None  # the line it must point at
    says: str  # a fragment of the message telling what to change
    files: dict[str, str] = field(default_factory=dict)  # extra files next to the job file


VALID_TAIL = """\
task:
  dataset: builtin:multiply
  held_out: 21
rewards:
  - name: correctness
    weight: 1.0
"""


def job(head: str, tail: str = VALID_TAIL) -> str:
    return textwrap.dedent(head) + tail


CASES = [
    Case(
        "typo-top-level",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        grop: {steps: 3}
        """),
        "grop",
        3,
        "did you mean 'grpo'?",
    ),
    Case(
        "typo-depth-2",
        job("""\
        name: t
        student:
          model: smollm2-135m-instruct
          quantisation: nf4
        """),
        "student.quantisation",
        4,
        "did you mean 'quantization'?",
    ),
    Case(
        "typo-depth-3",
        job("""\
        name: t
        student:
          model: smollm2-135m-instruct
          lora:
            rnak: 8
        """),
        "student.lora.rnak",
        5,
        "did you mean 'rank'?",
    ),
    Case(
        "typo-inside-list",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - name: correctness
            wieght: 2.0
        """),
        "rewards[0].wieght",
        6,
        "did you mean 'weight'?",
    ),
    Case(
        "group-size-1",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        grpo:
          group_size: 1
        """),
        "grpo.group_size",
        4,
        "greater than or equal to 2",
    ),
    Case(
        "epsilon-0",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        grpo:
          epsilon: 0
        """),
        "grpo.epsilon",
        4,
        "greater than 0",
    ),
    Case(
        "learning-rate-negative",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        grpo:
          learning_rate: -1
        """),
        "grpo.learning_rate",
        4,
        "greater than 0",
    ),
    Case(
        "steps-not-a-number",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        grpo:
          steps: many
        """),
        "grpo.steps",
        4,
        "valid integer",
    ),
    Case(
        "section-not-a-mapping",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        grpo: 5
        """),
        "grpo",
        3,
        "should be a mapping of keys",
    ),
    Case(
        "target-modules-not-a-list",
        job("""\
        name: t
        student:
          model: smollm2-135m-instruct
          lora: {target_modules: q_proj}
        """),
        "student.lora.target_modules",
        4,
        "valid list",
    ),
    Case(
        "nan-weight",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - {name: correctness, weight: .nan}
        """),
        "rewards[0].weight",
        5,
        "finite",
    ),
    Case(
        "memory-budget-parsecs",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        device:
          memory_budget: 90 parsecs
        """),
        "device.memory_budget",
        4,
        "70GiB",
    ),
    Case(
        "memory-budget-150-percent",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        device:
          memory_budget: 150%
        """),
        "device.memory_budget",
        4,
        "at most 100%",
    ),
    Case(
        "unknown-loss",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        grpo:
          loss: ppo
        """),
        "grpo.loss",
        4,
        "'dapo'",
    ),
    Case(
        "unknown-judge-mode",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        judge:
          model: smollm2-135m-instruct
          mode: ruler
        """),
        "judge.mode",
        5,
        "'group'",
    ),
    Case(
        "unknown-judge-scoring",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        judge:
          model: smollm2-135m-instruct
          scoring: logprobs
        """),
        "judge.scoring",
        5,
        "'probabilities'",
    ),
    Case(
        "judge-score-mass-above-1",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        judge:
          model: smollm2-135m-instruct
          min_score_mass: 1.5
        """),
        "judge.min_score_mass",
        5,
        "less than or equal to 1",
    ),
    Case(
        "bad-job-name",
        job("""\
        name: my job
        student: {model: smollm2-135m-instruct}
        """),
        "name",
        1,
        "letters, digits",
    ),
    Case(
        "operand-range-reversed",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task:
          dataset: builtin:multiply
          operand_min: 9
          operand_max: 3
        rewards: [{name: correctness}]
        """),
        "task",
        3,
        "operand_min (9) must not exceed operand_max (3)",
    ),
    Case(
        "missing-student",
        job("""\
        name: t
        """),
        "student",
        1,
        "required key is missing",
    ),
    Case(
        "missing-rewards",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        """),
        "rewards",
        1,
        "required key is missing",
    ),
    Case("empty-file", "", "(top)", 1, "empty"),
    Case("list-at-top-level", "- name: t\n- student: x\n", "(top)", 1, "mapping"),
    Case(
        "bad-indentation",
        textwrap.dedent("""\
        name: t
        student:
          model: smollm2-135m-instruct
         quantization: nf4
        """),
        "(top)",
        4,
        "YAML syntax error",
    ),
    Case("tab-indentation", "name: t\nstudent:\n\tmodel: smollm2-135m-instruct\n", "(top)", 3, "YAML syntax error"),
    Case(
        "key-given-twice",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        name: u
        """),
        "name",
        3,
        "also on line 1",
    ),
    Case(
        "unknown-reward",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - name: correctnes
        """),
        "rewards[0].name",
        5,
        "did you mean 'correctness'?",
    ),
    Case(
        "duplicate-reward",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - {name: correctness, weight: 1.0}
          - {name: correctness, weight: 2.0}
        """),
        "rewards[1].name",
        6,
        "already listed as rewards[0]",
    ),
    Case(
        "all-zero-weights",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - {name: correctness, weight: 0}
          - {name: answer_format, weight: 0.0}
        """),
        "rewards",
        4,
        "non-zero weight",
    ),
    Case(
        "judge-reward-without-judge",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - {name: correctness}
          - {name: judge, weight: 0.5}
        """),
        "rewards[1].name",
        6,
        "needs a 'judge' section",
    ),
    Case(
        "plugin-file-missing",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - {name: my_rewards.py:brevity}
        """),
        "rewards[0].name",
        5,
        "my_rewards.py does not exist",
    ),
    Case(
        "plugin-function-missing",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - {name: my_rewards.py:brevity}
        """),
        "rewards[0].name",
        5,
        "defines no top-level function 'brevity'; did you mean 'brevity_score'?",
        files={"my_rewards.py": "def brevity_score(prompt, completion, reference, metadata):\n    return 1.0\n"},
    ),
    Case(
        "plugin-syntax-error",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - {name: my_rewards.py:brevity}
        """),
        "rewards[0].name",
        5,
        "syntax error on line 1",
        files={"my_rewards.py": "def brevity(:\n"},
    ),
    Case(
        "plugin-badly-written",
        textwrap.dedent("""\
        name: t
        student: {model: smollm2-135m-instruct}
        task: {dataset: builtin:multiply, held_out: 21}
        rewards:
          - {name: "my_rewards:brevity"}
        """),
        "rewards[0].name",
        5,
        "path/to/file.py:function",
    ),
    Case(
        "dataset-file-missing",
        job(
            """\
        name: t
        student: {model: smollm2-135m-instruct}
        """,
            tail="task:\n  dataset: data/train.jsonl\nrewards: [{name: correctness}]\n",
        ),
        "task.dataset",
        4,
        "train.jsonl does not exist",
    ),
    Case(
        "dataset-bad-row",
        job(
            """\
        name: t
        student: {model: smollm2-135m-instruct}
        """,
            tail="task:\n  dataset: train.jsonl\n  held_out: 0\nrewards: [{name: correctness}]\n",
        ),
        "task.dataset",
        4,
        "did you mean 'question'?",
        files={
            "train.jsonl": '{"question": "What is 2 * 3?", "answer": "6"}\n{"questoin": "What is 2 * 4?", "answer": "8"}\n'
        },
    ),
    Case(
        "misspelt-builtin",
        job(
            """\
        name: t
        student: {model: smollm2-135m-instruct}
        """,
            tail="task:\n  dataset: builtin:gsm8\nrewards: [{name: correctness}]\n",
        ),
        "task.dataset",
        4,
        "did you mean 'builtin:gsm8k'?",
    ),
    Case(
        "builtin-without-prefix",
        job(
            """\
        name: t
        student: {model: smollm2-135m-instruct}
        """,
            tail="task:\n  dataset: gsm8k\nrewards: [{name: correctness}]\n",
        ),
        "task.dataset",
        4,
        "did you mean 'builtin:gsm8k'?",
    ),
    Case(
        "held-out-larger-than-dataset",
        job(
            """\
        name: t
        student: {model: smollm2-135m-instruct}
        """,
            tail="task:\n  dataset: builtin:multiply\n  held_out: 500\nrewards: [{name: correctness}]\n",
        ),
        "task.held_out",
        5,
        "must be smaller than the 361 multiply problems",
    ),
    Case(
        "model-not-in-store",
        job("""\
        name: t
        student:
          model: smollm2-135m
        """),
        "student.model",
        3,
        "did you mean 'smollm2-135m-instruct'?",
    ),
    Case(
        "judge-model-not-in-store",
        job("""\
        name: t
        student: {model: smollm2-135m-instruct}
        judge:
          model: qwen3-8b
        """),
        "judge.model",
        4,
        "stored models: smollm2-135m-instruct",
    ),
    Case(
        "model-folder-missing",
        job("""\
        name: t
        student:
          model: ./weights/my-model
        """),
        "student.model",
        3,
        "weights/my-model does not exist",
    ),
    Case(
        "model-folder-without-config",
        job("""\
        name: t
        student:
          model: ./weights
        """),
        "student.model",
        3,
        "has no config.json",
        files={"weights/model.safetensors": "not really"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_malformed_job_file_exits_2_naming_key_and_line(case: Case, tmp_path, store_data_dir, capsys):
    for name, text in case.files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    path = tmp_path / "job.yaml"
    path.write_text(case.job)

    code = main(["config", "check", str(path), "--data-dir", str(store_data_dir)])

    stderr = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT
    prefix = f"{path}:{case.line}:{case.key}: " if case.line else f"{path}:{case.key}: "
    matching = [line for line in stderr.splitlines() if line.startswith(prefix)]
    assert matching, f"no error line starts with {prefix!r}:\n{stderr}"
    assert any(case.says in line for line in matching), stderr
