"""An episode as one token sequence: the ids the engine saw and sampled, turn by turn (docs/rl.md#token-trajectories).

With ``token_trajectories=True`` an environment keeps its conversation as token ids as well as
messages, and every request carries the ids (``GenerationRequest.prompt_token_ids``): the engine
is given exactly ``prompt + completion_1 + observation_1 + completion_2 + ...``, so the sequence a
trainer scores is, token for token, the one the engine sampled from, with nothing re-tokenised.

* the prompt is the chat template's rendering of the opening messages (with the generation prompt);
* a completion adds the ids the engine sampled, less the tokens past a stop string (the text was cut
  there; dropping the last few sampled ids keeps every kept token's log-probability exact).  A
  completion that comes without ids (a scripted turn) adds its text's tokens and is marked
  ``sampled: false``: the engine sees them, a trainer must not learn from them;
* the messages the environment appends add the ids the template puts after an assistant reply's
  content: the reply's closing markup, the messages, the next generation prompt.  An end-of-turn
  token the completion already ends with is not repeated.

A Qwen3-style template renders earlier turns differently once a conversation moves on (it drops
earlier ``<think>`` blocks), so a re-rendered chat no longer equals the sequence the engine saw;
:func:`first_drift` finds where, which is what a trainer that re-tokenises chats would get wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from agent_envs.core.content import Message, has_images
from agent_envs.core.types import Completion
from agent_envs.core.tokens import TokenCounter

#: the assistant content whose rendering marks where a reply's closing markup starts
REPLY_MARKER = "agentenvsreplymarker"


def continuation_ids(counter: TokenCounter, head: Sequence[Message], observations: Sequence[Message]) -> list[int]:
    """What the chat template puts after an assistant reply's content when ``observations`` follow
    it: the reply's closing markup, the messages and the generation prompt, as token ids.

    ``head`` (the opening messages) stands in for the history, as in :class:`~agent_envs.core.tokens.PromptTally`;
    the text after the marker starts at a special token in every chat template we know, so it is
    tokenised on its own."""
    if has_images(observations):
        raise ValueError("an observation with images has no token ids without its processor")
    text = counter.render([*head, {"role": "assistant", "content": REPLY_MARKER}, *observations])
    at = text.rfind(REPLY_MARKER)
    if at < 0:
        raise ValueError("the chat template does not render an assistant reply's content as written")
    return counter.text_ids(text[at + len(REPLY_MARKER) :])


def kept_ids(counter: TokenCounter, ids: list[int], text: str) -> list[int]:
    """The sampled ids less those past the point where a stop string cut the text: when the ids
    decode to ``text`` and more, the longest prefix that decodes to a prefix of ``text``; otherwise
    (nothing was cut) all of them."""
    decode = _tokenizer(counter).decode
    full = decode(ids, skip_special_tokens=True)
    if full == text or not full.startswith(text):
        return list(ids)
    for keep in range(len(ids) - 1, -1, -1):
        if text.startswith(decode(ids[:keep], skip_special_tokens=True)):
            return list(ids[:keep])
    return []


def _tokenizer(counter: TokenCounter) -> Any:
    """The counter's tokenizer (a trajectory is only started with one)."""
    if counter.tokenizer is None:
        raise ValueError("token trajectories need a tokenizer")
    return counter.tokenizer


def _finite_or_none(values: Sequence[float] | None) -> list[float | None] | None:
    """Log-probabilities as JSON can hold them: a value the engine could not give is None."""
    if values is None:
        return None
    return [v if math.isfinite(v) else None for v in values]


@dataclass
class TokenTrajectory:
    """The running token sequence of one episode and what each turn added to it."""

    counter: TokenCounter
    prompt_ids: list[int]
    turns: list[dict[str, Any]] = field(default_factory=list)
    #: the sequence so far: what the next request sends as its prompt
    ids: list[int] = field(default_factory=list)
    #: why the sequence stopped following the conversation (None while it does)
    broken: str | None = None

    @classmethod
    def start(cls, counter: TokenCounter, messages: Sequence[Message]) -> "TokenTrajectory":
        if not counter.exact:
            raise ValueError("token_trajectories=True needs a tokenizer (the policy's, or tokenizer=...)")
        if has_images(messages):
            raise ValueError("token_trajectories=True covers text chats only; this task's prompt has images")
        prompt = counter.prompt_ids(messages)
        return cls(counter, list(prompt), ids=list(prompt))

    @property
    def active(self) -> bool:
        return self.broken is None

    def add_completion(self, completion: Completion) -> None:
        """Append the sampled ids of one turn; the prompt ids the engine reports (if it does) are
        checked against the sequence the request carried."""
        if not self.active:
            return
        sent = list(self.ids)
        ids = completion.token_ids
        sampled = ids is not None
        if ids is None:  # not sampled here (a scripted turn): its text's tokens, which the engine then sees
            ids = self.counter.text_ids(completion.text)
        kept = kept_ids(self.counter, ids, completion.text)
        logprobs = completion.logprobs[: len(kept)] if completion.logprobs is not None else None
        if logprobs is not None and len(logprobs) != len(kept):
            logprobs = None  # a count that does not match the ids is no alignment at all
        seen = completion.prompt_token_ids
        self.turns.append(
            {
                "completion_ids": kept,
                "logprobs": _finite_or_none(logprobs),
                "finish_reason": completion.finish_reason,
                "dropped": len(ids) - len(kept),
                "sampled": sampled,
                "prompt_verified": None if seen is None else list(seen) == sent,
                "observation_ids": [],
            }
        )
        self.ids += kept

    def add_observations(self, head: Sequence[Message], messages: Sequence[Message]) -> None:
        """Append what the environment said after the last completion (and the next generation prompt)."""
        if not self.active or not self.turns:
            return
        try:
            added = continuation_ids(self.counter, head, messages)
        except ValueError as exc:
            self.broken = f"turn {len(self.turns)}: {exc}"
            return
        last = self.turns[-1]["completion_ids"]
        if last and added and last[-1] == added[0] and added[0] in set(_tokenizer(self.counter).all_special_ids):
            added = added[1:]  # the completion already ended its turn with this token
        self.turns[-1]["observation_ids"] = added
        self.ids += added

    def as_record(self, drift: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "prompt_ids": list(self.prompt_ids),
            "turns": [dict(t) for t in self.turns],
            "exact": self.active and all(t["prompt_verified"] is not False for t in self.turns),
            "broken": self.broken,
            "drift": drift,
        }


def segments(trajectory: dict[str, Any]) -> list[tuple[int, int, int]]:
    """Per turn ``(completion_start, completion_end, observation_end)`` positions in the sequence."""
    out, at = [], len(trajectory["prompt_ids"])
    for turn in trajectory["turns"]:
        end = at + len(turn["completion_ids"])
        out.append((at, end, end + len(turn["observation_ids"])))
        at = end + len(turn["observation_ids"])
    return out


def sequence(trajectory: dict[str, Any]) -> list[int]:
    """The whole episode as the engine saw it: prompt, then each turn's completion and observation."""
    ids = list(trajectory["prompt_ids"])
    for turn in trajectory["turns"]:
        ids += turn["completion_ids"] + turn["observation_ids"]
    return ids


def first_drift(
    counter: TokenCounter, messages: Sequence[Message], trajectory: dict[str, Any]
) -> dict[str, Any] | None:
    """Where the chat template's rendering of ``messages`` first differs from the recorded sequence,
    or None when it does not: ``{"position", "turn", "segment"}`` (``segment`` is ``prompt``,
    ``completion`` or ``observation``; ``turn`` counts from 1, 0 for the prompt).

    The rendering of a chat that ends with a reply has no generation prompt; closing markup the
    rendering adds after the recorded sequence's end is no drift."""
    ended_on_reply = bool(messages) and messages[-1]["role"] == "assistant"
    rendered = counter.text_ids(counter.render(messages, generation_prompt=not ended_on_reply))
    recorded = sequence(trajectory)
    common = min(len(rendered), len(recorded))
    position = next((i for i in range(common) if rendered[i] != recorded[i]), None)
    if position is None:
        if len(recorded) <= len(rendered):
            return None
        position = common
    return {"position": position, **_locate(trajectory, position)}


def _locate(trajectory: dict[str, Any], position: int) -> dict[str, Any]:
    for turn, (start, end, stop) in enumerate(segments(trajectory), 1):
        if position < start:
            break
        if position < end:
            return {"turn": turn, "segment": "completion"}
        if position < stop:
            return {"turn": turn, "segment": "observation"}
    return (
        {"turn": 0, "segment": "prompt"}
        if position < len(trajectory["prompt_ids"])
        else {"turn": len(trajectory["turns"]), "segment": "end"}
    )
