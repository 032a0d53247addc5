"""A policy backend is its row of ``agent_envs.policy.factory``: one registered from outside the
package is treated by ``agent-envs eval`` and the report as its row says (a stand-in, not a real
model; its own defaults, flags, pool support and words), with no name of it anywhere else (issue 31)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent_envs import cli
from agent_envs.envs.registry import spec
from agent_envs.policy.factory import BACKENDS, Backend, PolicySettings, default_policy, register
from agent_envs.policy.scripted import ScriptedPolicy

ENV = "MATH-ReAct-v0"
#: a stand-in backend as a user would add one: the environment's baseline under another name
ECHO = Backend(
    lambda s: ScriptedPolicy(spec(ENV).baseline, sampled=False),
    description="the echo stand-in",
    real_model=False,
    label="echo stand-in (no model)",
    words="replies from a script under another name, to check that the row of a backend reaches the report.",
    run_defaults={"limit": 2, "max_turns": 4},
)


@pytest.fixture
def echo():
    register("echo", ECHO)
    yield "echo"
    BACKENDS.pop("echo")


def _args(*argv: str):
    return cli.build_parser().parse_args(["eval", *argv])


def test_eval_and_the_report_treat_a_registered_backend_by_its_row(echo, tmp_path, capsys):
    out = tmp_path / "run"
    rc = cli.main(["eval", "--env", ENV, "--policy", echo, "--out", str(out), "--no-progress", "--sandbox", "bwrap"])
    err = capsys.readouterr().err
    assert rc == 0, err
    config = json.loads((out / "config.json").read_text())
    # the row's run defaults, not the CPU model's (3 tasks, 3 turns, 192 tokens)
    assert (config["policy"], config["limit"], config["max_turns"], config["max_tokens_per_turn"]) == (
        echo,
        2,
        4,
        None,
    )
    assert len((out / "records.jsonl").read_text().splitlines()) == 2
    assert "[agent-envs] echo defaults: 2 task(s) of 'builtin' with the echo stand-in" in err
    about = (out / "report.html").read_text().split('<section id="about">', 1)[1].split("</section>", 1)[0]
    assert ECHO.label in about and ECHO.words in about  # named and explained by its row
    assert "To evaluate a real model" in about  # not presented as a real model


def test_flags_and_pools_follow_the_row(echo):
    with pytest.raises(cli.UsageError, match="--api-key and --tool-choice apply to --policy openai only"):
        cli._check_request_flags(echo, _args("--policy", echo, "--api-key", "k"))
    with pytest.raises(cli.UsageError, match="--engines runs --policy vllm or scripted, not echo"):
        cli.make_pool(echo, _args("--policy", echo, "--engines", "2"))
    register(echo, Backend(ECHO.build, http=True, pooled=True))
    cli._check_request_flags(echo, _args("--policy", echo, "--request-timeout", "5"))
    with pytest.raises(cli.UsageError, match="apply to --policy openai or --policy echo only"):
        cli._check_request_flags("cpu", _args("--api-key", "k"))
    from agent_envs.scale.engines import POOL_SPECS, pool_spec, register_pool_spec, scripted_pool_spec

    with pytest.raises(ValueError, match="register_pool_spec\\('echo'"):
        pool_spec(echo, PolicySettings(), ENV)
    register_pool_spec(echo, scripted_pool_spec)  # the pool's layer says how its engines are built
    try:
        pooled = pool_spec(echo, PolicySettings(), ENV)
    finally:
        POOL_SPECS.pop(echo)
    assert (pooled.factory, pooled.kwargs) == ("agent_envs.scale.engines:scripted_engine", {"env_id": ENV})


def test_every_backend_that_runs_in_a_pool_resolves_to_an_engine_spec():
    from agent_envs.scale.engines import EngineSpec, pool_spec

    rows = [name for name, row in BACKENDS.items() if row.pooled]
    assert rows  # vllm and scripted today
    for name in rows:
        settings = PolicySettings(model="m" if BACKENDS[name].needs_model else None)
        assert isinstance(pool_spec(name, settings, ENV), EngineSpec), name
    for name in set(BACKENDS) - set(rows):
        with pytest.raises(ValueError, match="does not run in an engine pool"):
            pool_spec(name, PolicySettings(model="m"), ENV)


def test_the_policy_layer_names_no_layer_above_it_not_even_in_a_string():
    """import-linter sees imports only; an import path in a string (an upward dependency resolved at
    run time) is caught here: no module of agent_envs/policy names agent_envs.scale in any form."""
    package = Path(cli.__file__).resolve().parent
    policy, modules = package / "policy", "|".join(p.stem for p in (package / "scale").glob("[!_]*.py"))
    upward = re.compile(rf"agent_envs\s*[./:]\s*scale\b|(?<![\w.])\.\.\s*scale\b|\bscale\.({modules})\b")
    named = {
        str(path.relative_to(policy)): [m.group(0) for m in upward.finditer(path.read_text(encoding="utf-8"))]
        for path in sorted(policy.rglob("*.py"))
    }
    assert len(named) > 5 and {path: found for path, found in named.items() if found} == {}


def test_the_default_backend_is_chosen_by_the_rows():
    assert [default_policy(m, u) for m, u in ((None, []), ("m", []), (None, ["u"]), ("m", ["u"]))] == [
        "cpu",
        "transformers",
        "openai",
        "openai",
    ]


def test_real_models_are_named_by_their_model_in_the_report(tmp_path):
    from agent_envs.report.load import Run
    from agent_envs.report.views import about

    config = {"policy": "vllm", "model": "Qwen/Qwen3-4B"}
    run = Run("r", Path(tmp_path), [], config, saved_summary=None, unreadable_lines=0, samples=1)
    page = about([run])
    assert page["runs"][0]["policy"] == "Qwen/Qwen3-4B" and page["policies"] == {} and page["hint"] is False


def test_serve_offers_and_serves_a_registered_backend_by_its_row(echo, monkeypatch, capsys):
    """``agent-envs serve`` takes its policies from the rows too: a registered backend is a choice
    and answers over HTTP; a row that needs a model is refused without one, naming the flag."""
    import threading

    import httpx

    from agent_envs.policy import server
    from agent_envs.policy.server import PolicyServer

    choices = server.build_parser()._option_string_actions["--policy"].choices
    assert echo in choices and "openai" not in choices  # an HTTP client is not served again
    replies: list[httpx.Response] = []

    def one_request(self: PolicyServer) -> None:
        body = {"model": "agent-envs", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 64}
        asking = threading.Thread(target=lambda: replies.append(httpx.post(self.url + "/chat/completions", json=body)))
        asking.start()
        self.handle_request()
        asking.join(timeout=60)

    monkeypatch.setattr(PolicyServer, "serve_forever", one_request)
    assert server.main(["--policy", echo, "--port", "0"]) == 0
    assert replies and replies[0].status_code == 200
    assert isinstance(replies[0].json()["choices"][0]["message"]["content"], str)
    register("echo-needs-model", Backend(ECHO.build, needs_model=True, description="needs a model"))
    try:
        with pytest.raises(SystemExit):
            server.main(["--policy", "echo-needs-model", "--port", "0"])
        assert "--policy echo-needs-model needs --model" in capsys.readouterr().err
    finally:
        BACKENDS.pop("echo-needs-model")
