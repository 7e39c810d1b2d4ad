"""Which engines are awake in each phase of a step: the budget plan's time-sharing choice, applied.

The plan (budget/phase_memory.py) counts an engine's weights and cache out of the
phases it does not serve only when it chose `time_share`. Then, before each
phase, the engines of the other phases sleep (vLLM sleep level 1 on CUDA; a
transformers engine that owns its weights moves them to host RAM) and the
phase's own engine wakes. Without time-sharing every engine stays awake: the
plan counted them all in every phase, and sleeping and waking cost seconds per
step.
"""

from __future__ import annotations

from appliance.engines.engine import GenerationEngine

PHASES = ("generate", "judge", "train")


def enter_phase(phase: str, rollout: GenerationEngine, judge: GenerationEngine | None, time_share: bool) -> None:
    """Put the engines in the state the plan assumed for `phase` (one of PHASES)."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {PHASES}")
    if not time_share:
        return
    awake = {"generate": rollout, "judge": judge, "train": None}[phase]
    for engine in (rollout, judge):
        if engine is not None and engine is not awake:
            engine.sleep()
    if awake is not None:
        awake.wake()
