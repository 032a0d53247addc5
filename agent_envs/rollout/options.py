"""The episode options every command shares (``agent-envs eval``, ``agent-envs es``, the GRPO example):
one parser for ``KEY=VALUE`` flags, one spelling of the per-turn token limit, one builder of the
environment's keyword arguments.  Three commands built them three ways before, and the same limit
was spelled three ways."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Iterable, Sequence

#: the per-turn token limit's one spelling; the others still work and say so
MAX_TOKENS_PER_TURN = "--max-tokens-per-turn"


def key_value(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with VALUE parsed as JSON when it is JSON (else kept as a string)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


class _DeprecatedAlias(argparse.Action):
    """Stores the value as the option's one name does; an old spelling also prints its replacement."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None and option_string != self.option_strings[0]:
            print(f"{parser.prog}: {option_string} is deprecated; use {self.option_strings[0]}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_max_tokens_per_turn(
    parser: argparse.ArgumentParser, help: str, aliases: Sequence[str] = ("--max-tokens",), **kwargs: Any
) -> None:
    """``--max-tokens-per-turn N`` (dest ``max_tokens_per_turn``); ``aliases`` are old spellings kept
    working with a deprecation line."""
    parser.add_argument(
        MAX_TOKENS_PER_TURN,
        *aliases,
        dest="max_tokens_per_turn",
        type=int,
        action=_DeprecatedAlias,
        help=help,
        **kwargs,
    )


def max_tokens_help(defaults: Iterable[tuple[str, int]]) -> str:
    """The help line that states each environment's own default, from its spec (not from memory)."""
    listed = ", ".join(f"{env_id} {tokens}" for env_id, tokens in defaults)
    return f"tokens per generation (default: the environment's: {listed})"


def env_kwargs(
    *,
    sandbox: str,
    max_turns: int | None = None,
    max_tokens_per_turn: int | None = None,
    skill: str | None = None,
    prompts: str | None = None,
    token_trajectories: bool = False,
    env_args: Iterable[tuple[str, Any]] = (),
) -> dict[str, Any]:
    """The keyword arguments of ``gym.make`` for one run: ``--env-arg`` pairs first, then each option
    that has its own flag and was given (a flag is the more specific request); ``None`` leaves the
    environment's default."""
    kwargs: dict[str, Any] = {"sandbox": sandbox, **dict(env_args)}
    given = {
        "skill": skill,
        "prompts": None if prompts is None else str(prompts),
        "token_trajectories": token_trajectories or None,
        "max_turns": max_turns,
        "max_tokens_per_turn": max_tokens_per_turn,
    }
    kwargs.update({key: value for key, value in given.items() if value is not None})
    return kwargs


#: the sampling settings every command takes as flags of their own (``--temperature``, ``--top-p``, ...)
SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "repetition_penalty")


def add_sampling_flags(
    parser: argparse.ArgumentParser, default: str = "the protocol's", *, protocol_values: bool = True
) -> None:
    """``--temperature``, ``--top-p``, ``--top-k``, ``--min-p``, ``--presence-penalty`` and
    ``--repetition-penalty``, each ``None`` unless given (``default`` says what then applies, with
    the protocol's value unless ``protocol_values`` is false: a trainer's own defaults differ)."""
    from ..policy.sampling import SamplingConfig

    for flag in SAMPLING_FLAGS:
        value = f"{SamplingConfig.model_fields[flag].default}, " if protocol_values else ""
        parser.add_argument(
            "--" + flag.replace("_", "-"),
            type=int if flag == "top_k" else float,
            default=None,
            help=f"sampling {flag.replace('_', ' ')} (default {value}{default}; docs/protocol.md#sampling-and-seeds)",
        )


def sampling_flags(values: Any) -> dict[str, Any]:
    """The sampling flags given on the command line (an ``argparse.Namespace`` or a dict of its values)."""
    found = values if isinstance(values, dict) else vars(values)
    return {flag: found[flag] for flag in SAMPLING_FLAGS if found.get(flag) is not None}
