"""examples/grpo_trl.py takes its sampling options from the builder ``agent-envs eval`` and ``es`` use
(agent_envs.rollout.options), and docs/rl.md's commands still parse as written.  Parser-level only:
tests/test_trl_grpo.py trains."""

from __future__ import annotations

import argparse
import runpy

import pytest

from agent_envs import cli
from rl_docs import EXAMPLE, documented_commands

EXAMPLE_NS = runpy.run_path(str(EXAMPLE), run_name="example")


def _eval_parser() -> argparse.ArgumentParser:
    subparsers = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = subparsers.choices["eval"]
    return parser


def _sampling_actions(parser: argparse.ArgumentParser) -> dict[str, tuple[str, ...]]:
    """dest -> option strings of the parser's sampling flags (the options eval builds with
    ``add_sampling_flags``: those named like the sampling settings)."""
    from agent_envs.policy.sampling import SamplingConfig

    return {
        a.dest: tuple(a.option_strings)
        for a in parser._actions
        if a.dest in SamplingConfig.model_fields and a.option_strings
    }


def test_the_example_takes_evals_sampling_flags():
    evals = _sampling_actions(_eval_parser())
    assert "temperature" in evals and "top_p" in evals
    assert _sampling_actions(EXAMPLE_NS["build_parser"]()) == evals
    for dest, (flag, *_) in evals.items():
        value = 0 if dest == "presence_penalty" else 3 if dest == "top_k" else 0.5
        args = EXAMPLE_NS["parse_args"]([flag, str(value)])
        assert getattr(args, dest) == value
        if dest != "presence_penalty":  # GRPOConfig has none: GRPO samples from the policy as it stands
            assert EXAMPLE_NS["config_kwargs"](args)[dest] == value


def test_the_example_refuses_a_presence_penalty(capsys):
    with pytest.raises(SystemExit):
        EXAMPLE_NS["parse_args"](["--presence-penalty", "2"])
    assert "--presence-penalty: GRPO samples without one" in capsys.readouterr().err


@pytest.mark.parametrize("argv", documented_commands(), ids=lambda argv: " ".join(argv[:2]))
def test_docs_rl_commands_parse_to_the_values_they_write(argv, capsys):
    args = EXAMPLE_NS["parse_args"](argv)
    assert capsys.readouterr().err == ""  # no deprecated spelling in the docs
    actions = {o: a for a in EXAMPLE_NS["build_parser"]()._actions for o in a.option_strings}
    for flag, value in zip(argv, [*argv[1:], None]):  # each "--flag VALUE" as written, typed by its option
        if flag.startswith("--") and value is not None and not value.startswith("--"):
            action = actions[flag]
            assert getattr(args, action.dest) == (action.type(value) if callable(action.type) else value), flag
    kwargs = EXAMPLE_NS["config_kwargs"](args)
    assert kwargs["temperature"] == float(argv[argv.index("--temperature") + 1])
    assert args.max_tokens_per_turn == int(argv[argv.index("--max-tokens-per-turn") + 1])
