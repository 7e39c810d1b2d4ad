"""`appliance jobs samples ID`: samples.jsonl as plain text for a terminal or a pager.

Single-turn groups: the question and reference, then each completion with its
reward per function and advantage. Agent trajectories: scenario, reward and
advantage, each turn with its role, tool calls (name and arguments) and tool
results, then the trained mask: the rendered text cut into segments, each
line marked TRAIN (sampled assistant tokens, trained) or ctx (context).
Parsing is appliance.service.samples's, shared with the TUI.
"""

from __future__ import annotations

from appliance.service.samples import Trajectory, elide, group_records, is_trajectory, parse_trajectory

# A turn shown cut to this many characters (its start and end); context segments shorter still, since the trained
# segments, shown whole, are what the mask is read for.
TURN_CHARS = 400
CONTEXT_CHARS = 160
MASK_MARKS = {True: "TRAIN |", False: "ctx   |"}


def samples_text(records: list[dict]) -> str:
    lines: list[str] = []
    for step, groups in group_records(records).items():
        for number, group in enumerate(groups, start=1):
            if is_trajectory(group[0]):
                trajectories = [parse_trajectory(record) for record in group]
                lines.append(
                    f"== step {step} · group {number} · {trajectories[0].environment} · scenario "
                    f"{trajectories[0].scenario} · {len(group)} "
                    f"{'trajectory' if len(group) == 1 else 'trajectories'}"
                )
                for index, trajectory in enumerate(trajectories, start=1):
                    lines += trajectory_lines(trajectory, index)
            else:
                lines += completion_lines(step, number, group)
            lines.append("")
    return "\n".join(lines)


def completion_lines(step: int, number: int, group: list[dict]) -> list[str]:
    first = group[0]
    lines = [f"== step {step} · prompt {number}: {first.get('question', '')}  (answer {first.get('reference', '')})"]
    for index, sample in enumerate(group, start=1):
        rewards = "  ".join(f"{name} {_number(value)}" for name, value in sorted((sample.get("rewards") or {}).items()))
        lines.append(
            f"  {index}. reward {_number(sample.get('reward'))}  {rewards}  advantage "
            f"{_signed(sample.get('advantage'))}"
        )
        lines += [f"     {line}" for line in str(sample.get("completion", "")).strip().splitlines() or [""]]
    return lines


def trajectory_lines(trajectory: Trajectory, index: int) -> list[str]:
    rewards = "  ".join(f"{name} {_number(value)}" for name, value in sorted(trajectory.rewards.items()))
    lines = [
        f"-- trajectory {index}: reward {_number(trajectory.reward)}  {rewards}  advantage "
        f"{_signed(trajectory.advantage)}  tokens: {_count(trajectory.trained_tokens)} trained, "
        f"{_count(trajectory.context_tokens)} context"
        + (" (cut at the job's token bound)" if trajectory.truncated else "")
    ]
    if trajectory.metrics:
        lines.append(
            "   metrics: " + "  ".join(f"{name} {_metric(value)}" for name, value in sorted(trajectory.metrics.items()))
        )
    for turn in trajectory.turns:
        label = f"{turn.role} ({trajectory.tool_name(turn)})" if turn.role == "tool" else turn.role
        body = elide(turn.text.strip(), TURN_CHARS).splitlines() + [f"call {call.label}" for call in turn.tool_calls]
        lines += _indented(f"   {label:<14} ", body or [""])
    if trajectory.segments:
        lines.append("   trained mask (TRAIN = sampled assistant tokens the step trains on; ctx = context):")
        for segment in trajectory.segments:
            text = segment.text if segment.trained else elide(segment.text, CONTEXT_CHARS)
            pieces = text.split("\n")
            # The newlines at a segment's ends are line breaks of the rendering, not lines of their own.
            while len(pieces) > 1 and pieces[0] == "":
                pieces.pop(0)
            while len(pieces) > 1 and pieces[-1] == "":
                pieces.pop()
            lines += [f"   {MASK_MARKS[segment.trained]} {line}" for line in pieces]
    else:
        lines.append("   (no trained mask recorded)")
    return lines


def _indented(head: str, body: list[str]) -> list[str]:
    if not body:
        return []
    return [head + body[0]] + [" " * len(head) + line for line in body[1:]]


def _number(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _metric(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.2f}"


def _signed(value) -> str:
    return f"{value:+.2f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _count(value) -> str:
    return str(value) if isinstance(value, int) else "-"
