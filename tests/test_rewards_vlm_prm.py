"""The vision-language PRM adapter, plumbing only: the tiny random VLM (built from a config) plus a
randomly initialised LoRA made with peft and saved to a folder, scoring real DocVQA steps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from agent_envs.policy.scripted import ScriptedPolicy
from agent_envs.core.steps import StepContext
from agent_envs.rollout.runner import run_episodes

peft = pytest.importorskip("peft", reason="peft is installed by the 'rewards' extra (scripts/install.sh --test)")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """(base VLM folder, LoRA adapter folder)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from agent_envs.policy.tiny_vlm import build_tiny_vlm

    folder = tmp_path_factory.mktemp("prm")
    base = build_tiny_vlm(folder / "base", seed=0)
    torch.manual_seed(1)
    # init_lora_weights=False: random A and B (peft's default B = 0 would leave the model unchanged)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft.get_peft_model(AutoModelForImageTextToText.from_pretrained(str(base)), config).save_pretrained(folder / "lora")
    return base, folder / "lora"


@pytest.fixture(scope="module")
def scorer(models):
    from agent_envs.rewards.vlm_prm import VLMRewardScorer

    return VLMRewardScorer(*models)


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp("pages")
    paths = []
    for i, colour in enumerate(("white", "black")):
        img = Image.new("RGB", (180, 240), colour)
        ImageDraw.Draw(img).rectangle([20, 30, 150, 60], fill=(200, 30, 30) if i else (30, 30, 200))
        img.save(folder / f"page{i}.png")
        paths.append(str(folder / f"page{i}.png"))
    return paths[0], paths[1]


def step(
    page: str, command: str = "tesseract /workspace/document.png stdout", observation: str = "TOTAL 42"
) -> StepContext:
    assistant = 'Action: {"name": "bash", "arguments": {"command": "' + command + '"}}'
    return StepContext(
        env_id="DocVQA-CLI-v0",
        key="d:sample00",
        turn=1,
        question="What is the total?",
        task={},
        messages=[
            {"role": "system", "content": "s"},
            {"role": "user", "content": "What is the total?"},
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": observation},
        ],
        assistant=assistant,
        action={"name": "bash"},
        observation=observation,
        images=(page,),
    )


def test_scores_are_probabilities_deterministic_and_batch_independent(scorer, models, pages):
    from agent_envs.rewards.vlm_prm import VLMRewardScorer

    contexts = [step(pages[0]), step(pages[1], "ls", "document.png"), step(pages[0], observation="TOTAL 41")]
    scores = [s.score for s in scorer.score_sync(contexts)]
    assert all(0 < s < 1 for s in scores) and len(set(scores)) == 3
    assert [s.score for s in scorer.score_sync(contexts)] == scores
    assert [s.score for s in VLMRewardScorer(*models).score_sync(contexts)] == scores  # a fresh load too
    alone = [scorer.score_sync([c])[0].score for c in contexts]
    assert alone == pytest.approx(scores, abs=1e-5)  # left padding leaves each row's last position intact


def test_lora_changes_the_scores(scorer, models, pages):
    from agent_envs.rewards.vlm_prm import VLMRewardScorer

    contexts = [step(pages[0]), step(pages[1])]
    base = [s.score for s in VLMRewardScorer(models[0]).score_sync(contexts)]
    tuned = [s.score for s in scorer.score_sync(contexts)]
    assert all(abs(b - t) > 1e-4 for b, t in zip(base, tuned))


def test_the_image_is_part_of_the_input(scorer, models, pages):
    from agent_envs.rewards.vlm_prm import VLMRewardScorer

    with_page = scorer.inputs([step(pages[0])])
    image_token = scorer.processor.tokenizer.convert_tokens_to_ids("<image>")
    assert with_page["pixel_values"].numel() > 0 and (with_page["input_ids"] == image_token).sum() > 0
    other = scorer.inputs([step(pages[1])])
    assert not with_page["pixel_values"].equal(other["pixel_values"])
    a, b = scorer.score_sync([step(pages[0]), step(pages[1])])
    assert a.score != b.score  # same text, different page
    blind = VLMRewardScorer(*models, show_images=False)
    assert "pixel_values" not in blind.inputs([step(pages[0])])
    assert blind.score_sync([step(pages[0])])[0].score != a.score


def test_labels_must_be_single_tokens(models):
    from agent_envs.rewards.vlm_prm import VLMRewardScorer

    with pytest.raises(ValueError, match="reward label 'definitely correct' is .* tokens"):
        VLMRewardScorer(models[0], positive="definitely correct")


def test_docvqa_episodes_scored_by_product(scorer, docvqa_dir):
    """Real DocVQA episodes (bwrap, tesseract) with the page shown to the PRM; product aggregation."""
    from agent_envs.envs.docvqa.data import load_docvqa_tasks

    tasks = load_docvqa_tasks(str(docvqa_dir / "val_v1.0.json"), limit=2)
    policy = ScriptedPolicy(
        [
            'Action: {"name": "bash", "arguments": {"command": "ls /workspace"}}',
            'Action: {"name": "bash", "arguments": {"command": "echo checked"}}',
            "Final answer: unknown",
        ]
    )
    records = run_episodes(
        "DocVQA-CLI-v0",
        tasks,
        policy,
        mode="lockstep",
        env_kwargs={"sandbox": "bwrap"},
        progress=False,
        step_scorer=scorer,
    )
    for record in records:
        assert record.termination_reason == "final_answer" and len(record.step_scores) == 2
        assert all(0 < s < 1 for s in record.step_scores) and record.step_score_errors == [None, None]
        assert record.process_aggregation == "product"
        assert record.process_score == pytest.approx(math.prod(record.step_scores))
    assert records[0].step_scores != records[1].step_scores  # different pages, different questions
