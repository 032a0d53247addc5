"""Command-line flags for a step scorer, shared by ``agent-envs eval`` and ``agent-envs es``
(docs/protocol.md#process-rewards)."""

from __future__ import annotations

import argparse
from typing import Any

from .judge import DEFAULT_TEMPLATE
from agent_envs.core.steps import StepScorer

SCORERS = ("judge", "vlm-prm")
#: the judge's deadline per HTTP attempt and its extra attempts: a stuck judge holds a step for at
#: most (retries + 1) x timeout plus backoff, about 3 minutes (the policy client's defaults: 40)
JUDGE_TIMEOUT_S = 60.0
JUDGE_RETRIES = 2


def add_scorer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--step-scorer",
        default=None,
        choices=SCORERS,
        help="score every step: an LLM judge behind an OpenAI-compatible server, or a "
        "vision-language reward model with a LoRA adapter (docs/protocol.md#process-rewards)",
    )
    parser.add_argument("--judge-url", default=None, help="the judge's API root, e.g. http://127.0.0.1:8001/v1")
    parser.add_argument("--judge-model", default=None, help="the judge's model name on that server")
    parser.add_argument("--judge-prompt", default=DEFAULT_TEMPLATE, help="judge prompt template (shipped name or path)")
    parser.add_argument(
        "--judge-timeout",
        type=float,
        default=JUDGE_TIMEOUT_S,
        metavar="SECONDS",
        help=f"total deadline of one judge request attempt (default {JUDGE_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--judge-retries",
        type=int,
        default=JUDGE_RETRIES,
        metavar="N",
        help=f"extra attempts after a 5xx, transport error or deadline (default {JUDGE_RETRIES})",
    )
    parser.add_argument("--prm-base", default=None, help="base vision-language model folder (--step-scorer vlm-prm)")
    parser.add_argument("--prm-adapter", default=None, help="LoRA adapter folder for --prm-base (peft)")


def scorer_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """The flags as a record for a run's config (None without a scorer)."""
    if args.step_scorer is None:
        return None
    keys = ("judge_url", "judge_model", "judge_prompt") if args.step_scorer == "judge" else ("prm_base", "prm_adapter")
    return {"step_scorer": args.step_scorer, **{k: getattr(args, k) for k in keys}}


def scorer_from_args(args: argparse.Namespace) -> StepScorer | None:
    """The scorer the flags ask for; a missing companion flag is a ``ValueError`` naming it."""
    if args.step_scorer is None:
        return None
    if args.step_scorer == "judge":
        if not (args.judge_url and args.judge_model):
            raise ValueError("--step-scorer judge needs --judge-url and --judge-model")
        from agent_envs.policy.openai import OpenAIPolicy, check_request_limits

        check_request_limits(args.judge_timeout, args.judge_retries, ("--judge-timeout", "--judge-retries"))

        from .judge import LLMJudgeScorer

        judge = OpenAIPolicy(
            args.judge_url, args.judge_model, timeout_s=args.judge_timeout, max_retries=args.judge_retries
        )
        return LLMJudgeScorer(judge, args.judge_prompt)
    if not args.prm_base:
        raise ValueError("--step-scorer vlm-prm needs --prm-base (and usually --prm-adapter)")
    from .vlm_prm import VLMRewardScorer

    return VLMRewardScorer(args.prm_base, args.prm_adapter)
