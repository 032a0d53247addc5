"""Native tool calls (docs/protocol.md#native-tool-calls): the parser variant, its decisions, and the
MATH-Tools-v0 / Countdown-Tools-v0 episodes it drives with real bubblewrap sandboxes.

What happens with several calls in one turn: each is run in order and answered by its own ``tool``
message, up to ``ParserSpec.max_calls`` (8); later ones are answered without running.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.envs import registry
from agent_envs.policy.base import Completion, GenerationRequest
from agent_envs.policy.hf import smollm2_tokenizer
from agent_envs.policy.scripted import RecordingPolicy, ScriptedPolicy
from agent_envs.protocol.decision import decide_turn, with_tools
from agent_envs.protocol.tracelog import rounds
from agent_envs.protocol.native import MALFORMED_CALL, call_text, parse_server_calls, parse_text_calls, visible_text
from agent_envs.rollout.runner import run_episodes
from agent_envs.core.tokens import TokenCounter
from chat_templates import STABLE, THINK_STRIPPING, with_template

SPEC = registry.spec("MATH-Tools-v0")
RULES = with_tools(SPEC.rules["es"], SPEC.tools)  # as the environment sees them
BASH = call_text("bash", {"command": "echo hi"})


def kinds(text: str, used_bash: bool = True, tool_calls=None) -> list[str]:
    return [d.act_kind or d.kind for d in decide_turn(text, used_bash=used_bash, flavour=RULES, tool_calls=tool_calls)]


# ----------------------------------------------------------------------------------- parsing and decisions
def test_a_call_outside_thinking_runs_one_inside_never():
    assert kinds(f"Let me check.\n{BASH}") == ["run"]
    assert kinds(f"<think>{BASH}</think>") == ["warn"]
    assert kinds(f"<think>maybe {BASH}") == ["warn"]  # never closed: all of it is thinking
    assert kinds(f"planning {BASH}</think>\nno call now") == ["warn"]  # opened by the generation prompt
    assert kinds(f"<THINK>x</THINK>{BASH}") == ["run"]
    assert visible_text("a<think>b</think>c<think>d") == "ac"


def test_malformed_calls_are_answered_not_run():
    for text in (
        "<tool_call>{not json}</tool_call>",
        "<tool_call>[1, 2]</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "bash", "arguments": {"command": "ec',
    ):  # cut off by the token limit
        decisions = decide_turn(text, used_bash=False, flavour=RULES)
        assert [d.act_kind for d in decisions] == ["malformed_call"] and decisions[0].observation == MALFORMED_CALL
        assert decisions[0].command is None


def test_unknown_tools_and_empty_commands():
    (unknown,) = decide_turn(call_text("python", {"code": "1"}), used_bash=False, flavour=RULES)
    assert (
        unknown.act_kind == "unknown_action"
        and unknown.observation == "Unknown action 'python'. Available action is bash."
    )
    assert kinds(call_text("bash", {"command": "  "})) == ["empty_command"]
    assert kinds(call_text("bash", {})) == ["empty_command"]


def test_several_calls_run_in_order_up_to_the_cap():
    calls = [call_text("bash", {"command": f"echo {i}"}) for i in range(10)]
    decisions = decide_turn("".join(calls), used_bash=False, flavour=RULES)
    assert [d.act_kind for d in decisions] == ["run"] * 8 + ["skipped_call"]  # one answer for all past the cap
    assert [d.command for d in decisions[:8]] == [f"echo {i}" for i in range(8)]
    assert decisions[8].observation == "Not executed: 2 more tool calls; at most 8 tool calls are run per turn."


def test_final_answers_and_format_warnings():
    assert kinds("Final answer: \\boxed{4}") == ["final"]
    assert kinds("Final answer: \\boxed{4}", used_bash=False) == ["warn"]  # a tool call must come first
    assert decide_turn("Final answer: 4", used_bash=False, flavour=RULES)[0].observation == RULES.tool_required
    assert kinds(f"{BASH}\nFinal answer: 4") == ["run"]  # a call wins over an answer in the same turn
    assert kinds('Action:\n{"name": "bash", "arguments": {"command": "ls"}}') == ["warn"]  # ReAct is not native
    assert kinds("<think>Final answer: 4</think>") == ["warn"]


def test_server_tool_calls_in_the_openai_shape():
    entry = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    (call,) = parse_server_calls([entry], "Let me look.")
    assert (call.name, call.arguments, call.id, call.error) == ("bash", {"command": "ls"}, "call_1", None)
    assert parse_server_calls([entry], "<think>I should run") == []  # the server cut them out of a thought
    bad = {"id": "c2", "function": {"name": "bash", "arguments": "{oops"}}
    assert (
        parse_server_calls([bad, "junk"], "")[0].error == MALFORMED_CALL
        and parse_server_calls([bad, "junk"], "")[1].error
    )
    assert kinds("", tool_calls=[entry]) == ["run"] and kinds("<think>run it", tool_calls=[entry]) == ["warn"]
    assert parse_text_calls("") == []


# ----------------------------------------------------------------------------------- episodes
def test_several_calls_in_one_turn_each_get_a_tool_message():
    env = gym.make("MATH-Tools-v0", dataset="builtin", sandbox="bwrap", max_turns=3)
    try:
        env.reset(seed=0)
        text = (
            f"<think>{call_text('bash', {'command': 'echo never'})}</think>"
            + call_text("bash", {"command": "echo one"})
            + call_text("nope", {})
            + "<tool_call>{broken</tool_call>"
            + call_text("bash", {"command": "echo two"})
        )
        messages, reward, terminated, truncated, info = env.step(text)
        assert not (terminated or truncated) and info["used_bash"]
        tools = messages[3:]
        assert [m["role"] for m in tools] == ["tool"] * 4
        assert [m.get("name") for m in tools] == ["bash", "nope", None, "bash"]
        assert tools[0]["content"] == "one\n\n[exit_code] 0" and tools[3]["content"] == "two\n\n[exit_code] 0"
        assert "never" not in json.dumps(messages[3:])
        messages, reward, terminated, truncated, info = env.step("Final answer: \\boxed{0}")
        record = info["record"]
        assert terminated and record["tool_calls"] == 2 and len(record["react_steps"]) == 4 and record["turns"] == 2
        assert record["turn_log"][0]["decision"] == "run,unknown_action,malformed_call,run"
    finally:
        env.close()


def test_server_calls_keep_their_ids_in_the_chat():
    env = gym.make("MATH-Tools-v0", dataset="builtin", sandbox="bwrap", max_turns=3)
    try:
        env.reset(seed=0)
        entry = {"id": "call_7", "type": "function", "function": {"name": "bash", "arguments": '{"command": "echo 5"}'}}
        messages, *_ = env.step(Completion(text="", tool_calls=[entry], finish_reason="tool_calls"))
        assert messages[2] == {"role": "assistant", "content": "", "tool_calls": [entry]}
        assert messages[3] == {
            "role": "tool",
            "content": "5\n\n[exit_code] 0",
            "name": "bash",
            "tool_call_id": "call_7",
        }
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["MATH-Tools-v0", "Countdown-Tools-v0"])
def test_the_tool_schemas_reach_the_chat_template(env_id):
    tokenizer = with_template(smollm2_tokenizer(), STABLE)
    policy = RecordingPolicy(ScriptedPolicy(registry.spec(env_id).baseline, tokenizer=tokenizer))
    env = gym.make(env_id, dataset="builtin")
    tasks = env.unwrapped.tasks[:1]
    env.close()
    (record,) = run_episodes(env_id, tasks, policy, mode="lockstep", progress=False, env_kwargs={"max_turns": 3})
    assert record.termination_reason == "final_answer" and record.used_bash
    schemas = [dict(s) for s in registry.spec(env_id).rules["es"].tool_schemas]
    request = policy.calls[0][0]
    assert request.tools == schemas
    prompt = TokenCounter(tokenizer, tools=request.tools).render(request.messages)
    assert all(json.dumps(s) in prompt for s in schemas) and "Tools you can call" in prompt
    assert "Tools you can call" not in TokenCounter(tokenizer).render(request.messages)


def test_engine_policies_render_the_request_tools():
    """An engine policy renders each request's tools through the chat template (prompt ids are
    the template's with the schemas), and the environment counts the same ids."""
    from agent_envs.policy.batching import EnginePolicy

    class Ids(EnginePolicy):
        name = "ids"

        def generate(self, requests):
            return [Completion(text="", token_ids=[], prompt_tokens=len(self.prepare(r).prompt_ids)) for r in requests]

    tokenizer = with_template(smollm2_tokenizer(), THINK_STRIPPING)
    env = gym.make("MATH-Tools-v0", dataset="builtin", tokenizer=tokenizer)
    env.reset(seed=0)
    request = env.unwrapped.generation_request()
    policy = Ids(tokenizer, None, None)
    counted = env.unwrapped._ep.tally.prompt_tokens()
    assert policy.prepare(request).prompt_ids == TokenCounter(tokenizer, tools=request.tools).prompt_ids(
        request.messages
    )
    assert (
        len(policy.prepare(request).prompt_ids)
        == counted
        > len(policy.prepare(GenerationRequest(messages=request.messages)).prompt_ids)
    )
    env.close()


def test_native_episodes_as_token_trajectories_do_not_drift_on_a_stable_template():
    tokenizer = with_template(smollm2_tokenizer(), STABLE)
    env_id = "Countdown-Tools-v0"
    env = gym.make(env_id, dataset="builtin")
    tasks = env.unwrapped.tasks[:2]
    env.close()
    records = run_episodes(
        env_id,
        tasks,
        ScriptedPolicy(registry.spec(env_id).baseline, tokenizer=tokenizer),
        mode="lockstep",
        progress=False,
        env_kwargs={"max_turns": 3, "token_trajectories": True},
    )
    for record in records:
        trajectory = record.row()["token_trajectory"]
        assert record.score == 1.0 and trajectory["exact"] and trajectory["drift"] is None
        observation = tokenizer.decode(trajectory["turns"][0]["observation_ids"])
        assert observation.startswith("<|im_end|>\n<|im_start|>tool\n") and record.prediction in observation


def test_openai_policy_sends_the_schemas_and_reads_server_calls():
    """Against a real HTTP server on 127.0.0.1: the tools go along (tool_choice "none" unless told
    otherwise: vLLM refuses "auto" without a tool parser), a plain request carries neither."""
    from agent_envs.policy.openai import OpenAIPolicy
    from agent_envs.policy.server import PolicyServer

    entry = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
    server = PolicyServer(ScriptedPolicy(lambda r: Completion(text="ok", token_ids=[1])), model="m", record=3).start()
    try:
        schemas = [dict(s) for s in RULES.tool_schemas]
        request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], seed=1, max_tokens=4, tools=schemas)
        for one in (request, request.model_copy(update={"tools": None})):  # one at a time: arrival order
            OpenAIPolicy(server.url, "m").generate([one])
        OpenAIPolicy(server.url, "m", tool_choice="auto").generate([request])
        sent, plain, auto = server.received
        assert sent["tools"] == schemas and sent["tool_choice"] == "none" and auto["tool_choice"] == "auto"
        assert "tools" not in plain and "tool_choice" not in plain and "logprobs" not in plain
    finally:
        server.close()
    response = httpx_response(
        {"choices": [{"message": {"content": "", "tool_calls": [entry]}, "finish_reason": "tool_calls"}]}
    )
    parsed = OpenAIPolicy("http://127.0.0.1:9/v1", "m")._parse(response, "e", request)
    assert parsed.tool_calls == [entry] and kinds(parsed.text, tool_calls=parsed.tool_calls) == ["run"]


def httpx_response(data: dict):
    import httpx

    return httpx.Response(200, json=data, request=httpx.Request("POST", "http://127.0.0.1/v1/chat/completions"))


def test_several_calls_in_one_turn_as_a_token_trajectory():
    """Two calls in one completion: one completion segment (in the loss), then one observation
    segment with both tool messages in call order (out of the loss); the sequence stays exact."""
    from agent_envs.rollout.trajectories import episode_tokens

    tokenizer = with_template(smollm2_tokenizer(), STABLE)
    texts = [
        call_text("bash", {"command": "echo one"}) + call_text("bash", {"command": "echo two"}),
        "Final answer: \\boxed{0}",
    ]

    def reply(request: GenerationRequest) -> Completion:
        ids = tokenizer.encode(texts[len(request.messages) > 2], add_special_tokens=False)
        return Completion(text=tokenizer.decode(ids), token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")

    env = gym.make("MATH-Tools-v0", dataset="builtin")
    tasks = env.unwrapped.tasks[:1]
    env.close()
    (record,) = run_episodes(
        "MATH-Tools-v0",
        tasks,
        ScriptedPolicy(reply, tokenizer=tokenizer),
        mode="lockstep",
        progress=False,
        env_kwargs={"max_turns": 3, "token_trajectories": True, "sandbox": "bwrap"},
    )
    row = record.row()
    trajectory = row["token_trajectory"]
    assert row["tool_calls"] == 2 and row["termination_reason"] == "final_answer" and trajectory["exact"]
    observation = tokenizer.decode(trajectory["turns"][0]["observation_ids"])
    assert observation.count("<|im_start|>tool\n") == 2
    assert observation.index("one\n\n[exit_code] 0") < observation.index("two\n\n[exit_code] 0")
    episode = episode_tokens(row)
    sampled = [t["completion_ids"] for t in trajectory["turns"]]
    assert episode.model_tokens == sampled[0] + sampled[1] and sum(episode.loss_mask) == len(episode.model_tokens)
    (start, end) = episode.turns[0]["observation"]
    assert (
        not any(episode.loss_mask[start:end]) and episode.tokens[start:end] == trajectory["turns"][0]["observation_ids"]
    )


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_server_tool_calls_reach_the_episode_through_either_openai_path(mode):
    """A real HTTP server on 127.0.0.1 answering with ``tool_calls``: OpenAIPolicy's sync path
    (lockstep runner) and async path (async runner) both hand them to the native parser, the call
    runs in the sandbox, and its answer is a ``tool`` message carrying the call's id."""
    from agent_envs.policy.openai import OpenAIPolicy
    from agent_envs.policy.server import PolicyServer

    entry = {"id": "call_9", "type": "function", "function": {"name": "bash", "arguments": '{"command": "echo 41"}'}}

    def reply(request: GenerationRequest) -> Completion:
        if any(m["role"] == "tool" for m in request.messages):
            return Completion(text="Final answer: \\boxed{41}", token_ids=[2])
        return Completion(text="", token_ids=[1], tool_calls=[entry], finish_reason="tool_calls")

    env = gym.make("MATH-Tools-v0", dataset="builtin")
    tasks = env.unwrapped.tasks[:1]
    env.close()
    with PolicyServer(ScriptedPolicy(reply), model="m", record=4) as server:
        policy = OpenAIPolicy(server.url, "m")
        (record,) = run_episodes(
            "MATH-Tools-v0", tasks, policy, mode=mode, progress=False, env_kwargs={"max_turns": 3, "sandbox": "bwrap"}
        )
        policy.close()
        second = server.received[1]
    row = record.row()
    assert row["termination_reason"] == "final_answer" and row["tool_calls"] == 1 and row["prediction"] == "41"
    assert row["react_steps"][0]["observation"].startswith("41")
    assert second["messages"][-1] == {
        "role": "tool",
        "content": "41\n\n[exit_code] 0",
        "name": "bash",
        "tool_call_id": "call_9",
    }


def test_thousands_of_calls_in_one_turn_give_a_record_linear_in_the_text():
    """2,000 calls in one completion: 8 run, the rest get one answer; the turn's text is stored once,
    and the chat stays inside the declared observation space (it once grew a record to 344 MB)."""
    env = gym.make("MATH-Tools-v0", dataset="builtin", sandbox="bwrap", max_turns=2)
    try:
        env.reset(seed=0)
        text = "".join(call_text("bash", {"command": f"echo {i}"}) for i in range(2000))
        messages, *_ = env.step(text)
        assert env.observation_space.contains(messages)
        assert [m["role"] for m in messages[3:]] == ["tool"] * 8 + ["user"]
        assert messages[-1]["content"].endswith(
            "Not executed: 1992 more tool calls; at most 8 tool calls are run per turn."
        )
        messages, reward, terminated, truncated, info = env.step("Final answer: \\boxed{0}")
        record = info["record"]
        assert env.observation_space.contains(messages)
        assert record["tool_calls"] == 8 and len(record["react_steps"]) == 9
        assert record["turn_log"][0]["decision"] == ",".join(["run"] * 8 + ["skipped_call"])
        assert record["react_steps"][0]["assistant"] == text
        assert not any("assistant" in s for s in record["react_steps"][1:])  # the turn's text, once
        assert len(json.dumps(record)) < 2 * len(text) + 20_000
        log = "\n".join(rounds(record["react_steps"]))  # the trace log names the round whose text it is
        assert log.count(text.strip()) == 1 and "(the completion of round 1)" in log
    finally:
        env.close()


def test_a_server_sending_thousands_of_calls_keeps_a_valid_chat():
    """Each call the chat keeps on the assistant message has its tool message (strict servers refuse
    a call without one); the calls past the cap are answered once."""
    env = gym.make("MATH-Tools-v0", dataset="builtin", sandbox="bwrap", max_turns=2)
    try:
        env.reset(seed=0)
        entries = [
            {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": '{"command": "echo 1"}'}}
            for i in range(2000)
        ]
        messages, *_ = env.step(Completion(text="", tool_calls=entries, finish_reason="tool_calls"))
        assert env.observation_space.contains(messages)
        assert messages[2]["tool_calls"] == entries[:8]
        assert [m.get("tool_call_id") for m in messages[3:]] == [f"c{i}" for i in range(8)] + [None]
    finally:
        env.close()
