"""Token trajectories (docs/rl.md#token-trajectories): logprobs from the transformers policy, the
token-in/token-out episode sequence, its export, the loss mask and the drift check.

Real parts throughout: the SmolLM2 tokenizer and model, bubblewrap sandboxes, the runner and the
CLI.  The two chat templates of the drift check are fixtures on the SmolLM2 tokenizer
(tests/chat_templates.py): a prefix-stable one and a Qwen3-style one that drops earlier thinking.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import gymnasium as gym
import pytest

import agent_envs  # noqa: F401  (registers the environments)
from agent_envs.cli import main
from agent_envs.policy.base import Completion, GenerationRequest
from agent_envs.policy.hf import default_cpu_policy, smollm2_hf_dir, smollm2_tokenizer
from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.rollout.runner import run_episodes
from agent_envs.rollout.trajectories import episode_tokens, export_tokens, load_token_export
from agent_envs.core.tokens import TokenCounter
from agent_envs.core.trajectory import kept_ids, sequence
from chat_templates import STABLE, THINK_STRIPPING, with_template

TASKS = [
    {"id": "sum", "question": "What is 2+2?", "answer": "4"},
    {"id": "prod", "question": "What is 3*3?", "answer": "9"},
]
CALL = 'Action:\n{"name": "bash", "arguments": {"command": "echo %s"}}'
SCRIPT = {
    "sum:sample00": ["<think>add them</think>\n" + CALL % 4, "<think>it printed 4</think>\nFinal answer: \\boxed{4}"],
    "prod:sample00": [CALL % 9, "Final answer: \\boxed{8}"],
}


@pytest.fixture(scope="module")
def tokenizer():
    return smollm2_tokenizer()


def _run(tokenizer, template=None, script=SCRIPT, **env):
    tok = tokenizer if template is None else with_template(tokenizer, template)
    return run_episodes(
        "MATH-ReAct-v0",
        TASKS,
        ScriptedPolicy(script, tokenizer=tok),
        mode="lockstep",
        progress=False,
        env_kwargs={"token_trajectories": True, "max_turns": 3, "sandbox": "bwrap", **env},
    )


# ----------------------------------------------------------------------------------- transformers logprobs
@pytest.fixture(scope="module")
def cpu_policy():
    try:
        policy = default_cpu_policy(num_threads=1)
    except FileNotFoundError as exc:
        pytest.skip(f"default CPU model unavailable: {exc}")
    yield policy
    policy.close()


def test_transformers_logprobs_are_the_models_and_only_on_request(cpu_policy):
    import torch

    chat = [{"role": "user", "content": "Name a colour."}]
    asked, plain = cpu_policy.generate(
        [
            GenerationRequest(messages=chat, seed=3, max_tokens=10, logprobs=True),
            GenerationRequest(messages=chat, seed=3, max_tokens=10),
        ]
    )
    assert plain.logprobs is None and plain.prompt_token_ids is None
    assert asked.token_ids == plain.token_ids and len(asked.logprobs) == len(asked.token_ids) > 0
    assert all(math.isfinite(v) and v <= 0 for v in asked.logprobs)
    prompt = cpu_policy.counter.prompt_ids(chat)
    assert asked.prompt_token_ids == prompt
    with torch.no_grad():  # the same numbers from one forward pass over prompt + completion
        logits = cpu_policy.model(input_ids=torch.tensor([prompt + asked.token_ids])).logits[0, len(prompt) - 1 : -1]
    expected = logits.float().log_softmax(-1).gather(-1, torch.tensor(asked.token_ids).unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(torch.tensor(asked.logprobs), expected, atol=1e-4)


def test_a_request_with_prompt_ids_is_sent_as_they_are(cpu_policy):
    chat = [{"role": "user", "content": "Name a colour."}]
    ids = cpu_policy.counter.prompt_ids([{"role": "user", "content": "Name an animal."}])
    out = cpu_policy.generate(
        [GenerationRequest(messages=chat, seed=3, max_tokens=4, prompt_token_ids=ids, logprobs=True)]
    )[0]
    assert out.prompt_token_ids == ids and out.prompt_tokens == len(ids)


# ----------------------------------------------------------------------------------- the episode sequence
def test_the_engine_is_sent_the_recorded_sequence_turn_by_turn(tokenizer):
    from agent_envs.policy.scripted import RecordingPolicy

    policy = RecordingPolicy(ScriptedPolicy(SCRIPT, tokenizer=tokenizer))
    records = run_episodes(
        "MATH-ReAct-v0",
        TASKS,
        policy,
        mode="lockstep",
        progress=False,
        env_kwargs={"token_trajectories": True, "max_turns": 3},
    )
    for record in records:
        trajectory = record.row()["token_trajectory"]
        full = sequence(trajectory)
        sent = [r.prompt_token_ids for r, _ in policy.calls if r.key == record.key]
        assert all(r.logprobs for r, _ in policy.calls)
        assert (
            sent[0]
            == trajectory["prompt_ids"]
            == TokenCounter(tokenizer).prompt_ids(
                [{"role": "system", "content": _system()}, {"role": "user", "content": _user(record.task_id)}]
            )
        )
        for earlier, later in zip(sent, sent[1:]):  # each prompt extends the last one: nothing re-rendered
            assert later[: len(earlier)] == earlier and full[: len(later)] == later


def _system() -> str:
    return gym.make("MATH-ReAct-v0", dataset=TASKS).unwrapped.system_prompt


def _user(task_id: str) -> str:
    env = gym.make("MATH-ReAct-v0", dataset=TASKS)
    return env.reset(options={"task": next(t for t in TASKS if t["id"] == task_id)})[0][1]["content"]


def test_loss_mask_covers_exactly_the_sampled_tokens(tokenizer):
    for record in _run(tokenizer):
        episode = episode_tokens(record)
        turns = record.row()["token_trajectory"]["turns"]
        assert episode.model_tokens == [t for turn in turns for t in turn["completion_ids"]]
        for turn, bounds in zip(turns, episode.turns):
            start, end = bounds["completion"]
            assert episode.tokens[start:end] == turn["completion_ids"] and set(episode.loss_mask[start:end]) == {1}
            obs_start, obs_end = bounds["observation"]
            assert set(episode.loss_mask[obs_start:obs_end]) <= {0}
        assert set(episode.loss_mask[: episode.prompt_length]) == {0}
        texts = [step["assistant"] for step in record.react_steps] + [record.completion]
        assert [tokenizer.decode(episode.tokens[slice(*b["completion"])]) for b in episode.turns] == texts
        assert episode.logprobs is None  # a scripted policy gives none: no zeros stand in for them


def test_a_scripted_turn_is_context_not_a_sample(tokenizer):
    """A completion without token ids (not sampled here) is in the sequence the engine sees, with mask 0."""
    opening = Completion(text=CALL % 4, finish_reason="stop")
    script = {"sum:sample00": [opening, "Final answer: \\boxed{4}"], "prod:sample00": [opening, "Final answer: 9"]}
    for record in _run(tokenizer, script=script):
        episode = episode_tokens(record)
        first, second = episode.turns
        assert not first["sampled"] and set(episode.loss_mask[slice(*first["completion"])]) == {0}
        assert second["sampled"] and episode.model_tokens == episode.tokens[slice(*second["completion"])]
        assert tokenizer.decode(episode.tokens[slice(*first["completion"])]) == opening.text


def test_stop_string_tokens_are_dropped_and_an_end_token_is_not_repeated(tokenizer):
    counter = TokenCounter(tokenizer)
    ids = counter.text_ids("echo 4\nObservation: 4")
    assert tokenizer.decode(kept_ids(counter, ids, "echo 4\n")) in ("echo 4\n", "echo 4")
    assert kept_ids(counter, ids, "echo 4\nObservation: 4") == ids
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    text = CALL % 4
    script = {
        "sum:sample00": [
            Completion(text=text, token_ids=counter.text_ids(text) + [end], finish_reason="stop"),
            "Final answer: \\boxed{4}",
        ],
        "prod:sample00": [
            Completion(text=text, token_ids=counter.text_ids(text + "\nObservation: 5"), finish_reason="stop"),
            "Final answer: 9",
        ],
    }
    by_key = {r.key: r for r in _run(tokenizer, script=script)}
    with_end = by_key["sum:sample00"].row()["token_trajectory"]["turns"][0]
    assert with_end["completion_ids"][-1] == end and with_end["observation_ids"][0] != end
    cut = by_key["prod:sample00"].row()["token_trajectory"]["turns"][0]
    assert cut["dropped"] > 0 and "Observation" not in tokenizer.decode(cut["completion_ids"])
    assert by_key["sum:sample00"].row()["token_trajectory"]["drift"] is None


def test_export_round_trip_and_cli(tokenizer, tmp_path):
    records = _run(tokenizer)
    summary = export_tokens(records, tmp_path / "tokens.jsonl")
    assert summary.exported == 2 and summary.skipped == {}
    assert load_token_export(tmp_path / "tokens.jsonl") == [episode_tokens(r) for r in records]
    assert [e.reward for e in load_token_export(tmp_path / "tokens.jsonl")] == [1.0, 0.0]
    (tmp_path / "bad.jsonl").write_text('{"format": "other"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_token_export(tmp_path / "bad.jsonl")


def test_logprobs_that_do_not_match_the_sampled_tokens_are_refused_not_shifted(tokenizer, tmp_path):
    """A turn with fewer log-probabilities than tokens was exported with the rest shifted, silently."""
    row = _run(tokenizer)[0].row()
    turn = row["token_trajectory"]["turns"][0]
    assert turn["sampled"] and len(turn["completion_ids"]) > 1
    turn["logprobs"] = [-0.5] * (len(turn["completion_ids"]) - 1)
    with pytest.raises(ValueError, match="log-probabilities do not match the sampled tokens"):
        episode_tokens(row)
    with pytest.raises(ValueError, match=r"no episode .*\(skipped: 1 log-probabilities do not match the sampled"):
        export_tokens([row], tmp_path / "tokens.jsonl")
    assert not (tmp_path / "tokens.jsonl").exists()


def scripted_eval(out: Path, limit: int = 1) -> list[str]:
    """``agent-envs eval`` of the scripted policy on MATH-ReAct-v0, 3 turns, no report."""
    return [
        "eval",
        "--env",
        "MATH-ReAct-v0",
        "--policy",
        "scripted",
        "--limit",
        str(limit),
        "--max-turns",
        "3",
        "--out",
        str(out),
        "--no-progress",
        "--no-report",
    ]


def test_cli_eval_with_token_trajectories_then_export(tmp_path, capsys):
    out = tmp_path / "run"
    code = main([*scripted_eval(out, limit=2), "--model", str(smollm2_hf_dir()), "--token-trajectories"])
    assert code == 0 and json.loads((out / "config.json").read_text())["token_trajectories"] is True
    assert main(["export", str(out), "--format", "tokens"]) == 0
    assert "2 episode(s)" in capsys.readouterr().out
    episodes = load_token_export(out / "tokens.jsonl")
    assert len(episodes) == 2 and len(episodes[0].turns) > 1
    # the baseline's text is context, not the policy's sample (docs/rl.md): sampled false, mask 0
    assert all(sum(e.loss_mask) == 0 and not any(t["sampled"] for t in e.turns) for e in episodes)
    plain = tmp_path / "plain"
    assert main(scripted_eval(plain)) == 0
    assert "token_trajectories" not in json.loads((plain / "config.json").read_text())
    assert main(["export", str(plain), "--format", "tokens"]) == 2
    assert "no episode" in capsys.readouterr().err


def test_resume_keeps_the_token_trajectories_setting(tmp_path, capsys):
    """A run with trajectories does not resume without them (records would mix two formats)."""
    args = scripted_eval(tmp_path / "run")
    assert main([*args, "--token-trajectories"]) == 2  # no tokenizer to render ids with: said at once
    assert "pass --model with the model's folder" in capsys.readouterr().err
    args += ["--model", str(smollm2_hf_dir())]
    assert main([*args, "--token-trajectories"]) == 0
    assert main([*args, "--resume"]) == 2
    assert "token_trajectories: True -> None" in capsys.readouterr().err
    assert main([*args, "--resume", "--token-trajectories"]) == 0


def test_off_by_default_the_requests_and_records_are_unchanged(tokenizer):
    env = gym.make("MATH-ReAct-v0", dataset=TASKS, tokenizer=tokenizer)
    on = gym.make("MATH-ReAct-v0", dataset=TASKS, tokenizer=tokenizer, token_trajectories=True)
    env.reset(options={"row_index": 0})
    request = env.unwrapped.generation_request()
    assert request.prompt_token_ids is None and not request.logprobs and request.tools is None
    assert env.unwrapped.config_hash != on.unwrapped.config_hash
    records = run_episodes(
        "MATH-ReAct-v0",
        TASKS,
        ScriptedPolicy(SCRIPT, tokenizer=tokenizer),
        mode="lockstep",
        progress=False,
        env_kwargs={"max_turns": 3},
    )
    assert all("token_trajectory" not in r.row() for r in records)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        gym.make("MATH-ReAct-v0", dataset=TASKS, token_trajectories=True).reset(options={"row_index": 0})
    with pytest.raises(ValueError, match="token_trajectories"):
        gym.make("MATH-ReAct-v0", dataset=TASKS, token_trajectories="yes")


def test_an_engine_that_saw_another_prompt_makes_the_trajectory_inexact(tokenizer, tmp_path):
    def reply(request):
        return Completion(
            text="Final answer: 4",
            token_ids=tokenizer.encode("Final answer: 4"),
            logprobs=[-1.0] * 5,
            prompt_token_ids=(request.prompt_token_ids or [])[:-1],
            finish_reason="stop",
        )

    records = run_episodes(
        "MATH-ReAct-v0",
        TASKS[:1],
        ScriptedPolicy(reply),
        mode="lockstep",
        progress=False,
        env_kwargs={"token_trajectories": True, "tokenizer": tokenizer, "max_turns": 1},
    )
    trajectory = records[0].row()["token_trajectory"]
    assert trajectory["turns"][0]["prompt_verified"] is False and not trajectory["exact"]
    with pytest.raises(ValueError, match=r"\(skipped: 1 engine prompt differs from the trajectory\)"):
        export_tokens(records, tmp_path / "t.jsonl")


# ----------------------------------------------------------------------------------- drift
def test_drift_check_passes_a_prefix_stable_template(tokenizer):
    for record in _run(tokenizer, STABLE):
        assert record.row()["token_trajectory"]["drift"] is None


def test_drift_check_flags_a_template_that_strips_earlier_thinking(tokenizer, tmp_path):
    by_key = {r.key: r for r in _run(tokenizer, THINK_STRIPPING)}
    trajectory = by_key["sum:sample00"].row()["token_trajectory"]
    drift = trajectory["drift"]
    assert drift == {"position": len(trajectory["prompt_ids"]), "turn": 1, "segment": "completion"}
    assert by_key["prod:sample00"].row()["token_trajectory"]["drift"] is None  # no thinking: nothing moves
    summary = export_tokens(by_key.values(), tmp_path / "t.jsonl")
    assert summary.drifting == 1 and "differs in 1 of 2" in summary.line()
