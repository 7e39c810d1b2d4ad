"""The judge's load-time probe: does it put its probability on the score tokens at all?

Probability scoring reads the next token after the answer's opening (`{"score": `).
A judge that puts little mass there scores every response neutral, silently:
a model that does not follow the format, or a remote server whose chat template
trims the opening's trailing space (Llama 3's `| trim`), so that the next token
is a space and not a digit. Before training starts the judge scores a small
calibration prompt (a correct and a wrong answer to an easy question) with the
job's own rubric and mode; if the mass on the scale is below
`judge.min_score_mass` it refuses to start, saying how much mass there was and,
where the engine can list them (remote engines), which tokens got it instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from appliance.engines.engine import UnansweredLogprobs
from appliance.errors import ApplianceError
from appliance.judge.escape import TokenEscaper
from appliance.judge.grouping import reference_anchor
from appliance.judge.probs import read_score
from appliance.judge.prompts import (
    POINTWISE_PREFILL,
    PROBABILITY_MAX,
    PROBABILITY_SCALE,
    group_messages,
    score_openings,
    pointwise_messages,
)

# An easy question with one right and one wrong answer: any judge that follows the format puts its mass on the
# scale for both, whatever it thinks of them.
CALIBRATION_QUESTION = "What is 12 + 30? Give the answer as <answer>N</answer>."
CALIBRATION_REFERENCE = "42"
CALIBRATION_RESPONSES = ("12 + 30 = 42, so the answer is <answer>42</answer>.", "<answer>17</answer>")


class JudgeProbeError(ApplianceError):
    """The judge puts too little probability on the score tokens to be read; the message says why and the fix."""


@dataclass(frozen=True)
class ProbeResult:
    masses: list[float]
    scores: list[float | None]


def calibration_prompts(
    engine, mode: str, rubric: str | None, escaper: TokenEscaper, anchored: bool = True
) -> list[str]:
    """The texts whose next token the probe reads: one per calibration response."""
    if mode == "group":
        messages = group_messages(
            CALIBRATION_QUESTION, CALIBRATION_REFERENCE, list(CALIBRATION_RESPONSES), rubric, "probabilities", escaper
        )
        prefix = engine.render_chat(messages)
        # read as the job's groups are: a numeric reference, anchored unless judge.group_anchor is off
        anchor = reference_anchor(CALIBRATION_REFERENCE, CALIBRATION_RESPONSES) if anchored else None
        return [prefix + opening for opening in score_openings(mode, len(CALIBRATION_RESPONSES), anchor=anchor)]
    return [
        engine.render_chat(
            pointwise_messages(CALIBRATION_QUESTION, CALIBRATION_REFERENCE, text, rubric, "probabilities", escaper)
        )
        + score_openings(mode, 1)[0]
        for text in CALIBRATION_RESPONSES
    ]


def probe_score_mass(
    engine, mode: str, rubric: str | None, min_mass: float, escaper: TokenEscaper, anchored: bool = True
) -> ProbeResult:
    """Read the calibration prompts; JudgeProbeError when a reading is unanswered or below `min_mass`."""
    prompts = calibration_prompts(engine, mode, rubric, escaper, anchored)
    readings = engine.next_token_logprobs(prompts, list(PROBABILITY_SCALE))
    for reading in readings:
        if isinstance(reading, UnansweredLogprobs):
            raise JudgeProbeError(
                f"judge probe: the judge did not answer the calibration prompt ({reading.error}); "
                "check judge.endpoint and that its server is up"
            )
    results = [read_score(reading, PROBABILITY_MAX, min_mass) for reading in readings]
    masses = [result.mass for result in results]
    if min(masses) < min_mass:  # the weakest reading decides: every response must be readable
        raise JudgeProbeError(_refusal(engine, prompts[masses.index(min(masses))], min(masses), min_mass))
    return ProbeResult(masses, [result.score for result in results])


def _refusal(engine, prompt: str, mass: float, min_mass: float) -> str:
    message = (
        f"judge probe: on a calibration prompt the judge puts {mass:.3f} of its next-token probability on the "
        f"score tokens 0-{PROBABILITY_MAX} after the answer's opening {POINTWISE_PREFILL!r}, below "
        f"judge.min_score_mass {min_mass:g}, so every score would be a neutral fallback"
    )
    top_tokens = getattr(engine, "top_next_tokens", None)
    top = top_tokens(prompt, 5) if callable(top_tokens) else None
    if top:
        shown = ", ".join(f"{token!r} {probability:.2f}" for token, probability in top)
        message += f"; its most likely next tokens are {shown}"
        if top[0][0].isspace():
            message += (
                ". A space first means the server's chat template trims the answer's opening (Llama 3 templates "
                "do): serve the judge with a template that keeps trailing whitespace in the final assistant message"
            )
    return message + "; or set judge.scoring: generate, or lower judge.min_score_mass if the judge is known good"
