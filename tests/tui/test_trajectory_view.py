"""Agent trajectories in samples.jsonl as the operator sees them: parsed once (appliance.service.samples),
drawn in the TUI's Samples tab (tui.widgets.trajectory_view) and printed by `appliance jobs samples`."""

from __future__ import annotations

from rich.console import Console

from appliance.cli.samples_text import samples_text
from appliance.service.samples import group_records, parse_trajectory
from tui.screens.job import render_samples
from tui.widgets.trajectory_view import TRAINED_STYLE, mask_text, render_trajectory
from tui_fixed import SAMPLES, TRAJECTORIES


def plain(renderable, width: int = 100) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_a_trajectory_parses_into_turns_tool_calls_and_segments():
    trajectory = parse_trajectory(TRAJECTORIES[0])
    assert [turn.role for turn in trajectory.turns] == ["system", "user", "assistant", "tool", "assistant"]
    assert [call.label for call in trajectory.turns[2].tool_calls] == ['search({"query": "offsite venue"})']
    assert trajectory.tool_name(trajectory.turns[3]) == "search"
    assert trajectory.turns[4].text == "It is the second result."
    assert [segment.trained for segment in trajectory.segments] == [False, True, False, True]
    assert (trajectory.trained_tokens, trajectory.context_tokens, trajectory.advantage) == (41, 96, 0.71)


def test_the_mask_highlights_exactly_the_trained_segments():
    trajectory = parse_trajectory(TRAJECTORIES[0])
    text = mask_text(trajectory)
    highlighted = [text.plain[span.start : span.end] for span in text.spans if span.style == TRAINED_STYLE]
    assert highlighted == [segment.text for segment in trajectory.segments if segment.trained]
    # Context is shown too (its long start elided), never highlighted.
    assert "<|im_start|>tool" in text.plain and "Offsite logistics" in text.plain


def test_the_tui_block_shows_scenario_reward_turns_calls_results_and_the_legend():
    shown = plain(render_trajectory(parse_trajectory(TRAJECTORIES[1]), 2))
    for expected in (
        "#2",
        "email_search",
        "march-offsite-venue (seed 7)",
        "0.10",
        "advantage -0.71",
        "41 trained  96 context",
        'assistant call search({"query": "offsite venue"})',
        'search → [{"id": "m-0412"',
        'call answer({"message_id": "m-0412"})',
        " trained  assistant tokens",
        " context  the rest, not trained",
    ):
        assert expected in shown, f"{expected!r} not in:\n{shown}"


def test_single_turn_samples_render_as_before_and_mixed_steps_show_both():
    assert "What is 7 * 8?" in plain(render_samples(SAMPLES)) and "#1" not in plain(render_samples(SAMPLES))
    mixed = plain(render_samples(TRAJECTORIES + SAMPLES))
    assert "step 12 · group 1 · email_search · 2 trajectories" in mixed and "What is 11 * 3?" in mixed
    grouped = group_records(TRAJECTORIES + SAMPLES)
    assert [len(group) for group in grouped[12]] == [2] and [len(group) for group in grouped[37]] == [2, 2]


def test_a_trajectory_cut_at_the_token_bound_says_so():
    cut = {**TRAJECTORIES[0], "truncated": True}
    assert "41 trained  96 context  cut at the job's token bound" in plain(render_trajectory(parse_trajectory(cut), 1))
    assert "tokens: 41 trained, 96 context (cut at the job's token bound)" in samples_text([cut])
    assert "token bound" not in plain(render_samples(TRAJECTORIES)) + samples_text(TRAJECTORIES)


def test_a_malformed_trajectory_line_shows_what_it_has():
    broken = {
        "step": 3,
        "kind": "trajectory",
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "hi"}],
                "tool_calls": [{"function": {"name": "move", "arguments": {"dir": 1}}}],
            },
            "junk",
        ],
        "segments": "not a list",
        "reward": "high",
    }
    shown = plain(render_samples([broken]))
    assert 'call move({"dir": 1})' in shown and "no trained mask recorded" in shown and "hi" in shown


def test_jobs_samples_prints_trajectories_with_the_mask_marked_per_line():
    text = samples_text(TRAJECTORIES)
    lines = text.splitlines()
    assert lines[0] == "== step 12 · group 1 · email_search · scenario march-offsite-venue (seed 7) · 2 trajectories"
    assert lines[1].startswith(
        "-- trajectory 1: reward 0.90  correct 1.00  steps 0.80  advantage +0.71  tokens: 41 trained, 96 context"
    )
    assert '   tool (search)  [{"id": "m-0412"' in text
    assert '   assistant      call search({"query": "offsite venue"})' in text
    assert '                  call answer({"message_id": "m-0419"})' in text
    assert "   metrics: tool_calls 2  turns 2" in text
    trained = [line.split("| ", 1)[1] for line in lines if line.startswith("   TRAIN |")]
    assert trained[:2] == [
        '<tool_call>{"name": "search", "arguments": {"query": "offsite venue"}}</tool_call><|im_end|>',
        'It is the second result.<tool_call>{"name": "answer", "arguments": {"message_id": '
        '"m-0419"}}</tool_call><|im_end|>',
    ]
    assert any(line.startswith("   ctx   | <|im_start|>tool") for line in lines)
    single = samples_text(SAMPLES)
    assert single.splitlines()[0] == "== step 37 · prompt 1: What is 7 * 8?  (answer 56)"
    assert "  2. reward 0.50  correctness 0.00  strict_format 1.00  advantage -0.71" in single
