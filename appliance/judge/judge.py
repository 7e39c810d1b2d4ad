"""The local judge: scores completions with an LLM on the box, as the reward named "judge".

`Judge(spec, engine, log_path)` is a BatchReward: `judge(samples)` returns one
score in 0..1 per sample. In `pointwise` mode every response gets its own
rubric prompt; in `group` mode (RULER-style) each group of completions of the
same prompt is judged in one prompt. A score is read from the next-token
distribution (`probabilities`, probs.py), from it after a short rationale the
judge writes first (`reasoned`, G-Eval with reasoning), or from a JSON answer
the judge writes (`generate`); what still fails gets a neutral score (`neutral_fill`).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from appliance.config.schema import JudgeSpec
from appliance.engines.engine import Completion, EngineCounters, GenerationEngine, Sampling, UnansweredLogprobs
from appliance.engines.scoring import NotSingleTokenError
from appliance.judge.cache import VerdictCache, cache_key
from appliance.judge.log import JudgeLog
from appliance.errors import ApplianceError
from appliance.judge.differential import Item, combine, judged_items
from appliance.judge.grouping import distinct, orders, reference_anchor
from appliance.judge.parse import parse_group, parse_pointwise
from appliance.judge.request import NEUTRAL_SCORE, JudgeRequest, failure_fill, neutral_fill
from appliance.judge.escape import TokenEscaper, tokenizer_tokens
from appliance.judge.guard import injection_signals
from appliance.judge.probe import ProbeResult, probe_score_mass
from appliance.judge.probs import read_score
from appliance.judge.prompts import (
    GROUP_PREFILL,
    POINTWISE_PREFILL,
    PROBABILITY_MAX,
    PROBABILITY_SCALE,
    group_answer_regex,
    group_ids,
    group_messages,
    group_stop_strings,
    pointwise_answer_regex,
    REASON_PREFILL,
    REASON_REGEX,
    RETRY_ECHO_CHARS,
    ReferenceAnchor,
    pointwise_messages,
    rationale_from,
    score_openings,
)
from appliance.judge.rubric import check_rubric_scale
from appliance.judge.window import PREFILL_TOKENS, WindowCut, engine_window, fit_responses, token_counter
from appliance.rewards.extract import extract_value
from appliance.rewards.fold import normalised

if TYPE_CHECKING:
    from appliance.rewards.registry import RewardSample

OUTCOMES = ("ok", "parse_error", "timeout")
# The scorings whose score is read from the next-token distribution over the 0-9 scale.
READS_PROBABILITIES = ("probabilities", "reasoned")
__all__ = ["Judge", "JudgeScoringError", "NEUTRAL_SCORE", "failure_fill", "neutral_fill", "resolve_scoring"]


class JudgeScoringError(ApplianceError):
    """The judge cannot score the way the job asks (no logprobs from its engine, a scale that is not one token)."""


def resolve_scoring(requested: str, engine: GenerationEngine) -> str:
    """The scoring used with this engine; 'auto' is probabilities when the engine gives logprobs."""
    has_logprobs = callable(getattr(engine, "next_token_logprobs", None))
    if requested == "auto":
        return "probabilities" if has_logprobs else "generate"
    if requested in READS_PROBABILITIES and not has_logprobs:
        raise JudgeScoringError(
            f"judge.scoring: {requested} needs an engine with next_token_logprobs; "
            f"{type(engine).__name__} has none (set judge.scoring: generate)"
        )
    return requested


def _group_key(sample: "RewardSample") -> tuple:
    # Completions of one prompt form a GRPO group; the prompt is part of the key so
    # samples without a group id still only share a judge prompt with their own question.
    return (sample.group, sample.prompt, sample.reference)


class TemplateKwargsEngine:
    """A local judge engine that renders with the job's judge.chat_template_kwargs (Qwen3's enable_thinking)."""

    def __init__(self, engine: GenerationEngine, kwargs: dict):
        self._engine, self._kwargs = engine, kwargs

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return self._engine.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self._kwargs
        )


class Judge:
    """The reward "judge": an LLM judge over any GenerationEngine, scores in 0..1.

    Engine errors (out of memory, a bad model) are not judge failures: they propagate.
    """

    name = "judge"

    def __init__(
        self,
        spec: JudgeSpec,
        engine: GenerationEngine,
        log_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed: int = 0,
    ):
        self.spec = spec
        # A remote engine passes the kwargs to its server; a local one renders with them here.
        local_template = getattr(engine, "tokenizer", None) is not None and not hasattr(engine, "chat_template_kwargs")
        if spec.chat_template_kwargs and local_template:
            engine = TemplateKwargsEngine(engine, spec.chat_template_kwargs)
        self.engine = engine
        self.log = JudgeLog(log_path, spec.log_max_bytes, spec.log_backups) if log_path is not None else None
        self.cache: VerdictCache[list[float]] = VerdictCache(enabled=spec.cache)
        self.clock = clock
        self.seed = seed
        self.step = 0
        self.outcomes: dict[str, int] = {outcome: 0 for outcome in OUTCOMES}
        # Judge-only token and time totals (the engine's own counters may be shared with the student).
        self.counters = EngineCounters()
        self.retries = 0
        self.seconds = 0.0
        self.failed_samples = 0
        self.prompts_cut = 0
        self.prompts_too_long = 0
        # Per sample of the last call: whether its reading failed (it got the judge.on_failure score).
        self.last_failed: list[bool] = []
        # Per sample of the last call: the grader-directed signals that got it the lowest score unjudged.
        self.last_injections: list[list[str]] = []
        self.injections = 0
        # The differential check (differential.py): readings of cores, and rewards capped at the core's score.
        self.last_capped: list[bool] = []
        self.core_readings = 0
        self.capped = 0
        # Group mode: per response read in several orders, its highest reading less its lowest (the position bias
        # the mean removes).
        self.order_gaps: list[float] = []
        self.scoring = resolve_scoring(spec.scoring, engine)
        check_rubric_scale(spec.rubric, self.scoring, spec.rubric_numbers)
        self.escaper = TokenEscaper(tokenizer_tokens(getattr(engine, "tokenizer", None)))
        self.window = engine_window(engine, spec.max_prompt_tokens)
        self.count_tokens = token_counter(engine)
        self.probe: ProbeResult | None = None
        # Checked when the judge is built, not at the first step: a scale it cannot read fails the job at start.
        if self.scoring in READS_PROBABILITIES:
            # Reasoned scoring is probed on the plain opening: the same score tokens after `"score": `.
            self._check_scale()
            self.probe = probe_score_mass(
                engine, spec.mode, spec.rubric, spec.min_score_mass, self.escaper, spec.group_anchor
            )

    def _check_scale(self) -> None:
        """Every score value must be one token after the answer's opening (else it cannot be read in one pass)."""
        probe = self.engine.render_chat([{"role": "user", "content": "Score this."}]) + POINTWISE_PREFILL
        try:
            self.engine.next_token_logprobs([probe], list(PROBABILITY_SCALE))
        except NotSingleTokenError as error:
            raise JudgeScoringError(
                f"judge.scoring: probabilities is not possible with this judge's tokenizer: "
                f"{error}; set judge.scoring: generate"
            ) from None

    def set_step(self, step: int) -> None:
        self.step = step

    def __call__(self, samples: list["RewardSample"]) -> list[float]:
        if not samples:
            return []
        started = self.clock()
        # Samples the guard stopped are never shown to the judge; they rejoin with the lowest score at the end.
        all_samples, samples = samples, self._guarded(samples)
        group_keys = [_group_key(sample) for sample in samples]
        threshold = self.spec.differential_threshold
        items = judged_items(samples, group_keys, self.spec.mode, threshold)
        readings: list[list[float]] = [[] for _ in items]
        if self.spec.mode == "group":
            requests = self._group_requests(samples, items, group_keys, readings)
        else:
            requests = self._pointwise_requests(samples, items, readings)
        self._read(requests)
        for request in requests:
            for shared, score in zip(request.members, request.scores or []):
                for item in shared:
                    if score is not None:
                        readings[item].append(score)
        item_scores = [statistics.fmean(scores) if scores else None for scores in readings]
        for scores in readings:  # a group read in several orders: how far the orders put one response apart
            if len(scores) > 1:
                self.order_gaps.append(max(scores) - min(scores))
        scores, capped = combine(items, item_scores, len(samples), threshold)
        self.last_failed = [score is None for score in scores]
        self.failed_samples += sum(self.last_failed)
        self.core_readings += sum(item.view == "core" for item in items)
        self.capped += sum(capped)
        final = failure_fill(scores, group_keys, self.spec.on_failure)
        for request in requests:
            self._log(request, [final[items[i].sample] for i in request.item_indices])
        final = self._with_guarded(all_samples, final, capped)
        self.seconds += self.clock() - started
        return final

    def _read(self, requests: list[JudgeRequest]) -> None:
        """Run every request (its rationale first when reasoned), count the outcomes, cache what was read."""
        runnable = [request for request in requests if request.outcome != "too_long"]
        if self.scoring == "reasoned":
            self._write_rationales(runnable)
        if self.scoring in READS_PROBABILITIES:
            self._run_probabilities(runnable)
        else:
            self._run(runnable)
        for request in requests:
            if request.outcome == "too_long":  # logged as such; a failed reading in the outcome counts
                self.outcomes["parse_error"] += 1
                self.prompts_too_long += 1
            if request.scores is not None and request.outcome == "ok":
                self.cache.put(request.key, request.scores)

    def _guarded(self, samples: list["RewardSample"]) -> list["RewardSample"]:
        """The samples to judge: those without a grader-directed signal (judge.injection_guard)."""
        self.last_injections = [
            injection_signals(
                sample.completion, self.escaper, sample.prompt, extract_value(sample.reference) is not None
            )
            if self.spec.injection_guard == "minimum"
            else []
            for sample in samples
        ]
        for sample, signals in zip(samples, self.last_injections):
            if signals:
                self.injections += 1
                self._log_injection(sample, signals)
        return [sample for sample, signals in zip(samples, self.last_injections) if not signals]

    def _with_guarded(self, samples: list["RewardSample"], judged: list[float], capped: list[bool]) -> list[float]:
        """Scores for all samples: the judged ones in order, 0 for each one the guard stopped."""
        scores, failed, core = iter(judged), iter(self.last_failed), iter(capped)
        self.last_failed = [False if signals else next(failed) for signals in self.last_injections]
        self.last_capped = [False if signals else next(core) for signals in self.last_injections]
        return [0.0 if signals else next(scores) for signals in self.last_injections]

    def _log_injection(self, sample: "RewardSample", signals: list[str]) -> None:
        if self.log is not None:
            self.log.write(
                {
                    "time": time.time(),
                    "step": self.step,
                    "mode": self.spec.mode,
                    "outcome": "injection",
                    "injections": signals,
                    "response": sample.completion[:300],
                    "assigned": [0.0],
                }
            )

    def _fitted(
        self, build: Callable[[list[str]], list[dict[str, str]]], responses: list[str], reserve: int
    ) -> tuple[list[dict[str, str]], WindowCut | None]:
        """The messages for `responses`, cut to fit the judge's window (reserve: tokens kept for the answer)."""
        if self.window is None:
            return build(responses), None
        budget = self.window - reserve - PREFILL_TOKENS
        # A retry's prompt is longer than the first (it echoes the answer): fit the longest the request can send.
        if self.scoring == "generate" and self.spec.retries:
            budget -= RETRY_ECHO_CHARS // 2 + 64  # a retry adds the echoed answer and a request
        fitted, cut = fit_responses(
            lambda texts: self.engine.render_chat(build(texts)), responses, budget, self.count_tokens
        )
        if cut is not None:
            self.prompts_cut += 1
        return build(fitted), cut

    def _reserve(self, count: int) -> int:
        """Tokens the answer needs in the judge's window: the score, a rationale and the score, or the answers."""
        if self.scoring == "probabilities":
            return 1  # one score token
        if self.scoring == "reasoned":
            return self.spec.max_new_tokens + PREFILL_TOKENS
        return self.spec.max_new_tokens * count

    def _pointwise_requests(
        self, samples: list["RewardSample"], items: list[Item], readings: list[list[float]]
    ) -> list[JudgeRequest]:
        """One request per distinct text of one question (cores included); cached readings go to `readings`."""
        requests: dict[str, JudgeRequest] = {}
        for index, item in enumerate(items):
            sample = samples[item.sample]
            text = normalised(item.text)
            key = cache_key("pointwise", self.scoring, self.spec.rubric, sample.prompt, sample.reference, text)
            cached = self.cache.get(key)
            if cached is not None:
                readings[index].append(cached[0])
            elif self.spec.cache and key in requests:
                requests[key].members[0].append(index)
            else:
                messages, cut = self._fitted(
                    lambda texts, s=sample: pointwise_messages(
                        s.prompt, s.reference, texts[0], self.spec.rubric, self.scoring, self.escaper
                    ),
                    [item.text],
                    self._reserve(1),
                )
                requests[key if self.spec.cache else f"{key}:{index}"] = JudgeRequest(
                    key=key,
                    messages=messages,
                    parse=lambda text: [parse_pointwise(text).score],
                    max_new_tokens=self.spec.max_new_tokens,
                    members=[[index]],
                    prefill=POINTWISE_PREFILL,
                    stop=("}",),  # the pointwise answer is one flat object: its first brace closes it
                    regex=pointwise_answer_regex(),
                    cut=cut,
                    outcome="too_long" if cut is not None and not cut.fits else "ok",
                    view=item.view,
                )
        return list(requests.values())

    def _group_requests(
        self, samples: list["RewardSample"], items: list[Item], group_keys: list[tuple], readings: list[list[float]]
    ) -> list[JudgeRequest]:
        """Per group and view (differential.py), one request per order (grouping.py); cached ones go to `readings`."""
        groups: dict[tuple, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault((group_keys[item.sample], item.view), []).append(index)
        requests = []
        for (_, view), indices in groups.items():
            first = samples[items[indices[0]].sample]
            texts = [item.text for item in items]
            members = distinct(texts, indices)
            read_in = orders(members, self.seed, first.prompt, first.reference, self.spec.group_orders)
            for order, ordered in enumerate(read_in):
                completions = [texts[shared[0]] for shared in ordered]
                key = cache_key(
                    "group",
                    self.scoring,
                    self.spec.rubric,
                    first.prompt,
                    first.reference,
                    [normalised(t) for t in completions],
                )
                cached = self.cache.get(key)
                if cached is not None:
                    for shared, score in zip(ordered, cached):
                        for index in shared:
                            readings[index].append(score)
                    continue
                requests.append(self._group_request(first, key, ordered, completions, view, order))
        return requests

    def _group_request(
        self, first: "RewardSample", key: str, members: list[list[int]], completions: list[str], view: str, order: int
    ) -> JudgeRequest:
        ids = group_ids(len(members))
        anchor = self._anchor(first.reference, completions)
        # The anchor's lines follow the chat inside the judge's window too (answers run to MAX_DIGITS digits).
        openings = score_openings("group", len(members), None, anchor) if anchor is not None else []
        messages, cut = self._fitted(
            lambda texts: group_messages(
                first.prompt, first.reference, texts, self.spec.rubric, self.scoring, self.escaper
            ),
            completions,
            self._reserve(len(members)) + max(map(self.count_tokens, openings), default=0),
        )
        return JudgeRequest(
            key=key,
            messages=messages,
            parse=lambda text, ids=ids: [verdict.score for verdict in parse_group(text, ids).values()],
            # max_new_tokens is the budget per judged response.
            max_new_tokens=self.spec.max_new_tokens * len(members),
            members=members,
            prefill=GROUP_PREFILL,
            stop=group_stop_strings(len(members)),
            regex=group_answer_regex(len(members)),
            cut=cut,
            outcome="too_long" if cut is not None and not cut.fits else "ok",
            view=view,
            order=order,
            anchor=anchor,
        )

    def _anchor(self, reference: str | None, completions: list[str]) -> ReferenceAnchor | None:
        # Generate scoring writes its own JSON, so only a read score has an anchored opening.
        if not self.spec.group_anchor or self.scoring not in READS_PROBABILITIES:
            return None
        return reference_anchor(reference, completions)

    def _write_rationales(self, requests: list[JudgeRequest]) -> None:
        """Reasoned scoring: every request's rationale, in one generate call; a failed one fails its request."""
        if not requests:
            return
        prompts = [self.engine.render_chat(request.messages) + REASON_PREFILL for request in requests]
        sampling = Sampling(
            max_new_tokens=self.spec.max_new_tokens,
            temperature=self.spec.temperature,
            stop=('"',),  # the rationale is a JSON string: its closing quote ends it
            regex=REASON_REGEX,
        )
        outputs, elapsed = self._generate(prompts, sampling)
        for request, completions in zip(requests, outputs):
            completion = completions[0]
            if not request.answered(completion, elapsed):
                continue
            request.rationale = rationale_from(completion.text)
            request.rationale_cut = completion.finish_reason == "length"
            request.outputs.append(REASON_PREFILL + completion.text)
            request.tokens_in += len(completion.prompt_token_ids)
            request.tokens_out += len(completion.token_ids)
            self.counters.prompt_tokens += len(completion.prompt_token_ids)
            self.counters.generated_tokens += len(completion.token_ids)

    def _run_probabilities(self, requests: list[JudgeRequest]) -> None:
        """Read every request's scores from next-token distributions: one engine call per batch of prompts.

        The prompt ends with the answer's opening; the score is the expected value over the scale's tokens. In
        group mode each response id's score is read after the prompt plus `{"id": "k", "score": `, the n readings
        in one call that shares the prefix. Nothing is sampled, so nothing is retried: too little mass on the
        score tokens is a counted parse_error with the neutral fallback.
        """
        readable = [request for request in requests if request.outcome == "ok"]
        for request in readable:
            prefix = self.engine.render_chat(request.messages)
            openings = score_openings(self.spec.mode, len(request.members), request.rationale, request.anchor)
            request.score_prompts = [prefix + opening for opening in openings]
            request.prompt_text = request.score_prompts[0]
        # Pointwise: the whole step in one call. Group: one call per group, whose prompts share the group's prefix.
        batches = [readable] if self.spec.mode == "pointwise" else [[request] for request in readable]
        for batch in batches:
            if not batch:
                continue
            prompts = [prompt for request in batch for prompt in request.score_prompts]
            # Read from the engine's own counters: next_token_logprobs returns no token counts.
            tokens_before = self.engine.counters.prompt_tokens
            started = self.clock()
            logprobs = self.engine.next_token_logprobs(prompts, list(PROBABILITY_SCALE))
            elapsed = self.clock() - started
            prompt_tokens = self.engine.counters.prompt_tokens - tokens_before
            self.counters.calls += 1
            self.counters.generate_seconds += elapsed
            self.counters.prompt_tokens += prompt_tokens
            position = 0
            for request in batch:
                count = len(request.score_prompts)
                mine = logprobs[position : position + count]
                position += count
                # Latency: the wall time the request waited (as in generate mode); prompt tokens: its share.
                request.latency_seconds += elapsed
                request.tokens_in += round(prompt_tokens * count / len(prompts))
                unanswered = [lp for lp in mine if isinstance(lp, UnansweredLogprobs)]
                if unanswered:  # a remote engine's request failed after its retries: counted, never fatal
                    request.errors = [lp.error for lp in unanswered]
                    request.outcome = (
                        "timeout" if any(lp.finish_reason == "timeout" for lp in unanswered) else "parse_error"
                    )
                    continue
                request.readings = [read_score(lp, PROBABILITY_MAX, self.spec.min_score_mass) for lp in mine]
                request.errors = [reading.error for reading in request.readings if reading.error]
                request.scores = [reading.score for reading in request.readings]
                if request.errors:
                    request.outcome = "parse_error"
                    # Some ids read in a group keep their scores; none read is the same as no answer.
                    if all(score is None for score in request.scores):
                        request.scores = None
        for request in requests:
            self.outcomes[request.outcome] += 1

    def _generate(self, prompts: list[str], sampling: Sampling) -> tuple[list[list[Completion]], float]:
        """One generate call of the judge's, counted and timed (its seconds are every request's wait)."""
        started = self.clock()
        outputs = self.engine.generate(prompts, sampling)
        elapsed = self.clock() - started
        self.counters.calls += 1
        self.counters.generate_seconds += elapsed
        return outputs, elapsed

    def _temperature(self, attempt: int) -> float:
        # Halved at each retry: a judge that wandered off the format is pushed toward its likeliest answer.
        return self.spec.temperature * 0.5**attempt

    def _run(self, requests: list[JudgeRequest]) -> None:
        """Generate, parse and retry until every request is ok or out of retries or time.

        The judge's JSON answer is constrained where the engine can (vLLM: a regular expression; transformers:
        generation stops at the closing brace, or in a group when it names an id past the group's size). A retry
        runs at half the previous temperature with the problem fed back, so it helps even when greedy. The
        deadline is checked between generate calls (a call in flight cannot be cancelled): one slow call can
        overrun it once, but no retry starts after it.
        """
        deadline = self.clock() + self.spec.timeout_seconds
        pending = list(requests)
        attempt = 0
        while pending:
            prompts = [self.engine.render_chat(request.next_messages()) + request.prefill for request in pending]
            for request, prompt in zip(pending, prompts):
                request.prompt_text = request.prompt_text or prompt
            # Requests of one call share stop strings and shape: one mode, and in group mode one size (else none).
            shapes = {(request.stop, request.regex) for request in pending}
            stop, regex = shapes.pop() if len(shapes) == 1 else ((), None)
            sampling = Sampling(
                max_new_tokens=max(r.max_new_tokens for r in pending),
                n=1,
                temperature=self._temperature(attempt),
                stop=stop,
                regex=regex,
            )
            outputs, elapsed = self._generate(prompts, sampling)
            for request, completions in zip(pending, outputs):
                request.record(completions[0], elapsed)
                self.counters.prompt_tokens += len(completions[0].prompt_token_ids)
                self.counters.generated_tokens += len(completions[0].token_ids)
            pending = [request for request in pending if request.scores is None and request.outcome == "ok"]
            attempt += 1
            if pending and attempt > self.spec.retries:
                for request in pending:
                    request.outcome = "parse_error"
                break
            if pending and self.clock() >= deadline:
                for request in pending:
                    request.outcome = "timeout"
                break
            self.retries += len(pending)
        for request in requests:
            self.outcomes[request.outcome] += 1

    def _log(self, request: JudgeRequest, assigned: list[float]) -> None:
        if self.log is None:
            return
        self.log.write(
            {
                "time": time.time(),
                "step": self.step,
                "mode": self.spec.mode,
                "scoring": self.scoring,
                # What was read: the responses as written or their cores (differential.py), and the group's order.
                "view": request.view,
                "order": request.order,
                "prompt": request.prompt_text,
                # The answer as parsed: the prefill the prompt ended with, then the generated text.
                "raw_output": request.outputs[-1] if request.outputs else "",
                "earlier_outputs": request.outputs[:-1],
                "errors": request.errors,
                "scores": request.scores,
                "assigned": assigned,
                # Per judged response: its reading failed (its samples got the judge.on_failure score),
                # and how many samples share its text (a group's identical completions are judged once).
                "failed": request.failed,
                "copies": [len(shared) for shared in request.members],
                "cut": request.cut.to_dict() if request.cut is not None else None,
                # Reasoned scoring: the rationale the score was read after, and whether max_new_tokens cut it.
                "rationale": request.rationale,
                "rationale_cut": request.rationale_cut,
                "outcome": request.outcome,
                "retries": max(len(request.outputs) - 1, 0),
                "latency_seconds": round(request.latency_seconds, 6),
                "tokens_in": request.tokens_in,
                "tokens_out": request.tokens_out,
                # Probability scoring: per judged response, the mass on the score tokens and the
                # distribution over the scale (values with p >= 0.001, largest first).
                "distributions": [
                    {"mass": round(reading.mass, 4), "probabilities": reading.distribution}
                    for reading in request.readings
                ]
                or None,
            }
        )

    def stats(self) -> dict:
        """Totals for metrics: calls, requests, failures, retries, tokens, seconds, tokens/s, cache hits."""
        requests = sum(self.outcomes.values())
        failures = requests - self.outcomes["ok"]
        return {
            "scoring": self.scoring,
            "calls": self.counters.calls,
            "requests": requests,
            "failures": failures,
            "failure_rate": failures / requests if requests else 0.0,
            "retries": self.retries,
            "outcomes": dict(self.outcomes),
            "prompt_tokens": self.counters.prompt_tokens,
            "generated_tokens": self.counters.generated_tokens,
            "generate_seconds": self.counters.generate_seconds,
            "seconds": self.seconds,
            "tokens_per_second": self.counters.tokens_per_second(),
            "cache_hits": self.cache.hits,
            "failed_samples": self.failed_samples,
            "injections": self.injections,
            "core_readings": self.core_readings,
            "position_bias": statistics.fmean(self.order_gaps) if self.order_gaps else None,
            "capped": self.capped,
            "prompts_cut": self.prompts_cut,
            "prompts_too_long": self.prompts_too_long,
            "cache_entries": len(self.cache),
        }

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
