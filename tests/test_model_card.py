"""The model card: the template filled with the job's facts, the held-out decoding as the run recorded it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from daemon_support import tiny_job

from appliance.config.job_file import parse_job
from appliance.export.card import CardInput, render_card
from appliance.export.facts import job_facts


def write_run(job_dir: Path, evals: dict[int, dict]) -> None:
    job_dir.mkdir()
    lines = [
        {"step": step, "reward_mean": 0.1 * step, **({"eval": evals[step]} if step in evals else {})}
        for step in range(1, 5)
    ]
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def card_of(job_dir: Path, kind: str = "adapter") -> str:
    parsed = parse_job(tiny_job("card-job"), "job.yaml")
    assert parsed.spec is not None, parsed.errors
    spec = parsed.spec
    return render_card(
        CardInput(
            spec=spec,
            facts=job_facts(job_dir, 4),
            kind=kind,
            base_model="smollm2-135m-instruct",
            base_sha256="ab" * 32,
            checkpoint="step-4",
            step=4,
            metric_name="eval.accuracy",
            metric_value=0.75,
            dtype="bfloat16" if kind == "merged" else None,
        )
    )


@pytest.mark.parametrize(
    ("recorded", "said"),
    [
        ({"temperature": 1.0, "samples": 4}, "on 8 held-out problems, 4 sampled completions each at temperature 1"),
        ({"temperature": 0.7, "samples": 1}, "on 8 held-out problems, 1 sampled completion each at temperature 0.7"),
        ({"temperature": 0.0, "samples": 1}, "on 8 held-out problems, greedy decoding"),
        ({}, "on 8 held-out problems, greedy decoding"),  # records from before sampling existed were greedy
    ],
)
def test_the_card_says_how_evaluation_decoded(tmp_path: Path, recorded: dict, said: str):
    write_run(tmp_path / "job", {4: {"accuracy": 0.75, "problems": 8, **recorded}})
    card = card_of(tmp_path / "job")
    assert said in card
    assert card.count("decoding") + card.count("sampled") == 1


def test_the_card_is_the_template_filled_with_every_fact(tmp_path: Path):
    write_run(tmp_path / "job", {2: {"accuracy": 0.5, "problems": 8}})
    card = card_of(tmp_path / "job", kind="merged")
    assert "$" not in card  # every placeholder filled
    assert card.startswith("---\nbase_model: smollm2-135m-instruct\nlibrary_name: transformers\n")
    assert "# card-job: merged model (bfloat16) trained with GRPO" in card
    assert "checkpoint `step-4` (step 4 of 3 planned, 4 recorded)" in card
    assert "Selected by `eval.accuracy` = 0.75." in card
    assert "| correctness | 1 |\n| answer_format | 0.5 |\n" in card
    assert "- training reward (mean): 0.100 at step 1, 0.400 at step 4" in card
    assert "- after training: 50.0% (step 2)" in card and "- before training (base model): not measured" in card
    assert "saved as bfloat16" in card and "vllm serve THIS_FOLDER" in card


def test_a_run_without_evaluation_claims_no_decoding(tmp_path: Path):
    write_run(tmp_path / "job", {})
    card = card_of(tmp_path / "job")
    assert "- after training: not measured\n" in card
    assert "decoding" not in card and "held-out problems," not in card
