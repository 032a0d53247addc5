"""``agent-envs es`` (issue 31 item 1): the ES run is a command of the package, its options all
documented with their real defaults, the population written once, one spelling of the per-turn
token limit, and the old example's command lines still working."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from agent_envs.cli import main as cli_main
from agent_envs.envs import registry
from agent_envs.esrun.export import export_parser
from agent_envs.esrun.run import make_config, make_engine_kwargs, make_env_kwargs, make_output_folders
from agent_envs.es.history import ESConfig
from agent_envs.es.lowrank import DEFAULT_TARGETS
from agent_envs.esrun.settings import CONFIG_FIELDS, ESSettings, build_parser, parse_settings
from agent_envs.rollout.options import env_kwargs

REPO = Path(__file__).resolve().parent.parent
BASE = ["--model", "m", "--history", "h", "--train", "builtin"]


@pytest.mark.parametrize("parser", [build_parser(), build_parser(eval_only=True), export_parser()])
def test_every_es_option_has_help(parser: argparse.ArgumentParser) -> None:
    missing = [a.option_strings for a in parser._actions if not a.help]
    assert missing == []


def test_es_help_states_the_real_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli_main(["es", "train", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "4096 / 512" not in text and "Undefined" not in text
    for env_id in registry.ENV_IDS:  # each environment's per-turn limit, as its spec says (Countdown: 2048)
        assert f"{env_id} {registry.spec(env_id).max_tokens_per_turn}" in text
    assert "Countdown-ReAct-v0 2048" in text
    assert "--population POPULATION members per generation" in text and "(default: 16)" in text
    for flag in ("--sigma-start", "--alpha", "--exact-revert", "--eval", "--step-scorer", "--engines"):
        assert flag in text


def test_every_setting_the_history_records_has_the_history_configs_default() -> None:
    """One home for the reference defaults: ESConfig's.  Every ESConfig field a run sets from its
    settings and that has a default is mapped, and the setting's default is that field's."""
    config = make_config(parse_settings(BASE), None)
    from_settings = {f for f, info in ESConfig.model_fields.items() if not info.is_required()} - {
        "model",  # required settings: no default to share
        "history_file",
        "eval_seed",  # = seed
        "train_samples",  # not settings of a run (the history's own bookkeeping)
        "tp_size",
        "start_fingerprint",
        "backend",
    }
    assert set(CONFIG_FIELDS.values()) == from_settings
    for setting, field in CONFIG_FIELDS.items():
        default = ESConfig.model_fields[field].get_default(call_default_factory=True)
        assert ESSettings.model_fields[setting].get_default(call_default_factory=True) == default, setting
        assert getattr(config, field) == default, field


def test_a_changed_history_default_changes_the_settings_the_run_and_the_help() -> None:
    """Plant other defaults in ESConfig before the settings are imported: they follow everywhere."""
    code = (
        "from agent_envs.es.history import ESConfig\n"
        "fields = ESConfig.model_fields\n"
        "fields['population'].default, fields['alpha'].default = 24, 0.0625\n"
        "ESConfig.model_rebuild(force=True)\n"
        "from agent_envs.esrun.run import make_config\n"
        "from agent_envs.esrun.settings import build_parser, parse_settings\n"
        f"config = make_config(parse_settings({BASE!r}), None)\n"
        "print(config.population, config.alpha)\n"
        "build_parser().print_help()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    first, text = done.stdout.split("\n", 1)
    assert first == "24 0.0625"
    text = " ".join(text.split())
    assert "members per generation (low-rank: also the engine's LoRA slots) (default: 24)" in text
    assert "sum w_i eps_i (default: 0.0625)" in text


def test_the_token_limit_has_one_name_and_the_old_one_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    new = parse_settings([*BASE, "--max-tokens-per-turn", "7"])
    assert capsys.readouterr().err == ""
    old = parse_settings([*BASE, "--max-tokens", "7"])
    assert "--max-tokens is deprecated; use --max-tokens-per-turn" in capsys.readouterr().err
    assert new == old and old.max_tokens_per_turn == 7
    assert make_config(old, None).max_tokens == 7  # the history's field keeps its name
    assert make_env_kwargs(old)["max_tokens_per_turn"] == 7


def test_the_population_is_written_once() -> None:
    """The config, vLLM's max_loras/max_cpu_loras (and through them the LoRA-kernel chooser) all
    come from --population."""
    settings = parse_settings([*BASE, "--perturbation", "lowrank", "--population", "6", "--rank", "4"])
    engine = make_engine_kwargs(settings)
    assert make_config(settings, None).population == engine["max_loras"] == engine["max_cpu_loras"] == 6
    assert engine["enable_lora"] and engine["max_lora_rank"] == settings.lora_slots["max_lora_rank"]
    # vLLM wraps only the layers the members perturb (tests/test_es_lowrank_vllm.py checks it in an engine)
    assert engine["lora_target_modules"] == list(DEFAULT_TARGETS)
    assert "max_loras" not in make_engine_kwargs(parse_settings(BASE))


def test_a_population_larger_than_vllms_graphs_is_decoded_in_graphs() -> None:
    """vLLM captures CUDA graphs up to 512 tokens unless told; a low-rank generation decodes all P x B
    sequences at once, so larger populations get graphs up to P x B (at most the sequences a step holds)."""

    def graphs(*flags: str) -> object:
        settings = parse_settings([*BASE, "--perturbation", "lowrank", *flags])
        return make_engine_kwargs(settings).get("compilation_config")

    assert graphs("--population", "16", "--case-batch", "16") is None  # 256: inside vLLM's default
    assert graphs("--population", "256", "--case-batch", "4") == {"max_cudagraph_capture_size": 1024}
    assert graphs("--population", "48", "--case-batch", "16") == {"max_cudagraph_capture_size": 768}
    assert graphs("--population", "256", "--case-batch", "16") == {"max_cudagraph_capture_size": 1024}
    assert graphs("--population", "256", "--case-batch", "16", "--engine-arg", "max_num_seqs=2048") == {
        "max_cudagraph_capture_size": 2048
    }
    assert graphs("--population", "256", "--case-batch", "4", "--enforce-eager") is None
    own = '{"cudagraph_mode": "NONE"}'
    assert graphs("--population", "256", "--case-batch", "4", "--engine-arg", f"compilation_config={own}") == {
        "cudagraph_mode": "NONE"
    }  # the user's own compilation settings stay as given
    assert "compilation_config" not in make_engine_kwargs(parse_settings([*BASE, "--population", "256"]))


def test_settings_are_one_validated_model(capsys: pytest.CaptureFixture[str]) -> None:
    settings = parse_settings(BASE)
    assert isinstance(settings, ESSettings) and settings.mode == "lockstep" and settings.population == 16
    with pytest.raises(SystemExit):
        parse_settings([*BASE, "--perturbation", "lowrank", "--mode", "lockstep"])
    assert "use --mode async" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_settings([*BASE, "--population", "x"])
    with pytest.raises(Exception, match="extra"):
        ESSettings.model_validate({**settings.model_dump(), "populaton": 4})


def test_eval_and_es_build_the_same_environment_keywords() -> None:
    settings = parse_settings(
        [*BASE, "--max-turns", "3", "--max-tokens-per-turn", "9", "--env-arg", "single_turn=true"]
    )
    assert make_env_kwargs(settings, "skill text") == env_kwargs(
        sandbox="bwrap", max_turns=3, max_tokens_per_turn=9, skill="skill text", env_args=[("single_turn", True)]
    )
    assert make_env_kwargs(settings) == {
        "sandbox": "bwrap",
        "single_turn": True,
        "max_turns": 3,
        "max_tokens_per_turn": 9,
    }


def test_agent_envs_es_names_its_modes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["es", "--help"]) == 0
    assert "train" in capsys.readouterr().out
    assert cli_main(["es", "fit"]) == 2
    assert "one of train, evaluate-only, export" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="give --train to train"):
        cli_main(["es", "train", "--model", "m", "--history", "h"])


def test_the_example_keeps_its_command_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = importlib.util.spec_from_file_location("es_train_example", REPO / "examples" / "es_train.py")
    assert loaded is not None and loaded.loader is not None
    example = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(example)
    seen: list[list[str]] = []
    monkeypatch.setattr(example, "es", lambda argv: seen.append(argv) or 0)
    assert example.main(["--model", "m", "--eval-only", "--history", "h"]) == 0
    assert example.main(["--model", "m", "--train", "t", "--max-tokens", "5"]) == 0
    assert seen == [
        ["evaluate-only", "--model", "m", "--eval-only", "--history", "h"],
        ["train", "--model", "m", "--train", "t", "--max-tokens", "5"],
    ]
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "es_train.py"), "--model", "m", "--history", "h"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "agent-envs es train" in done.stderr and "give --train" in done.stderr


def test_sampling_flags_are_spelled_as_eval_spells_them() -> None:
    """``es --temperature 0.7 --top-p 0.9`` is ``--sampling temperature=0.7 --sampling top_p=0.9``
    (recorded the same in the history's config), and both commands take the same flags."""
    from agent_envs import cli
    from agent_envs.rollout.options import SAMPLING_FLAGS

    flags = parse_settings([*BASE, "--temperature", "0.7", "--top-p", "0.9"])
    keyed = parse_settings([*BASE, "--sampling", "temperature=0.7", "--sampling", "top_p=0.9"])
    assert flags.sampling == keyed.sampling and make_config(flags, None) == make_config(keyed, None)
    eval_flags = {a.dest for a in cli.build_parser()._subparsers._group_actions[0].choices["eval"]._actions}
    es_flags = {a.dest for a in build_parser("agent-envs es train", False)._actions}
    assert set(SAMPLING_FLAGS) <= eval_flags & es_flags


def test_the_runs_output_folders_are_made_before_any_engine_starts(tmp_path: Path) -> None:
    history = tmp_path / "runs" / "a" / "history.json"
    adapters = tmp_path / "adapters" / "lowrank"
    settings = parse_settings(
        [*BASE, "--history", str(history), "--perturbation", "lowrank", "--adapter-dir", str(adapters)]
    )
    make_output_folders(settings)
    assert history.parent.is_dir() and adapters.is_dir()
    (tmp_path / "taken").write_text("a file where the adapters' folder would go")
    with pytest.raises(SystemExit, match="cannot create the folder .*taken"):
        make_output_folders(parse_settings([*BASE, "--adapter-dir", str(tmp_path / "taken")]))
