"""DocVQA-VL-v0 (docs/protocol.md#view-tool) on the real DocVQA sample pages, real bubblewrap and
tesseract: the view tool's images are the requested pixels of the page, bad arguments are
warnings, and an episode scores exactly as the same answer does in DocVQA-CLI-v0."""
from __future__ import annotations

import base64
import hashlib
import json

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image

import agent_envs  # noqa: F401
from agent_envs.core.content import decode_image_url, images_of
from agent_envs.envs.docvqa.data import load_docvqa_tasks

OCR = 'Action: {"name": "bash", "arguments": {"command": "tesseract /workspace/document.png stdout"}}'


def view(**arguments) -> str:
    return "Action: " + json.dumps({"name": "view", "arguments": arguments})


@pytest.fixture(scope="module")
def real_tasks(docvqa_dir):
    return load_docvqa_tasks(str(docvqa_dir / "val_v1.0.json"))


@pytest.fixture
def env(real_tasks):
    env = gym.make("DocVQA-VL-v0", dataset=real_tasks)
    yield env
    env.close()


def page_of(task) -> Image.Image:
    with Image.open(task.image) as img:
        img.load()
        return img if img.mode in ("L", "RGB") else img.convert("RGB")


def shown(messages) -> Image.Image:
    """The one image of the last message, checking its shape: the text part, then the image part."""
    content = messages[-1]["content"]
    assert [p["type"] for p in content] == ["text", "image_url"]
    assert content[0]["text"].startswith("Observation from view:\nRegion ")
    return decode_image_url(content[1]["image_url"]["url"])


def same_pixels(a: Image.Image, b: Image.Image) -> bool:
    return a.size == b.size and a.mode == b.mode and np.array_equal(np.asarray(a), np.asarray(b))


def test_view_box_shows_exactly_that_region_of_the_page(env, real_tasks):
    task = real_tasks[0]
    page = page_of(task)
    env.reset(options={"task": task.model_dump()})
    box = [120, 340, 901, 517]
    messages, reward, terminated, truncated, info = env.step(view(box=box))
    assert (reward, terminated, truncated) == (0.0, False, False)
    image = shown(messages)
    assert same_pixels(image, page.crop(tuple(box)))
    assert messages[-1]["content"][0]["text"] == (
        f"Observation from view:\nRegion {box} of the {page.width}x{page.height} image at zoom 1, "
        f"shown as 781x177 pixels.")
    assert info["used_bash"]  # a view is tool use


def test_whole_page_view_is_scaled_to_the_pixel_cap_and_says_so(env, real_tasks):
    task = real_tasks[0]
    page = page_of(task)
    assert page.width * page.height > 1 << 20  # the real pages are larger than the cap
    env.reset(options={"task": task.model_dump()})
    messages, *_ = env.step(view())
    image = shown(messages)
    assert image.width * image.height <= 1 << 20 and abs(image.width / image.height - page.width / page.height) < 0.01
    assert same_pixels(image, page.resize(image.size, Image.Resampling.LANCZOS))
    assert f"(scaled down from {page.width}x{page.height} to stay within 1048576 pixels)" in \
        messages[-1]["content"][0]["text"]


def test_zoom_enlarges_the_region(env, real_tasks):
    task = real_tasks[1]
    page = page_of(task)
    env.reset(options={"task": task.model_dump()})
    box = (50, 60, 250, 160)
    messages, *_ = env.step(view(box=list(box), zoom=2.5))
    image = shown(messages)
    assert image.size == (500, 250)
    assert same_pixels(image, page.crop(box).resize((500, 250), Image.Resampling.LANCZOS))
    step = env.unwrapped._ep.steps[-1]
    assert step["images"][0]["zoom"] == 2.5 and step["images"][0]["box"] == list(box)


BAD = [
    ({"box": "all"}, "box must be a list of 4 numbers"),
    ({"box": [0, 0, 10]}, "box must be a list of 4 numbers"),
    ({"box": ["0", 0, 10, 10]}, "box[0] must be a whole number of pixels, got \"0\""),
    ({"box": [0, 0, 10.5, 10]}, "box[2] must be a whole number of pixels, got 10.5"),
    ({"box": [True, 0, 10, 10]}, "box[0] must be a whole number of pixels, got true"),
    ({"box": [0, 0, 10 ** 9, 10]}, "is outside the"),
    ({"box": [-1, 0, 10, 10]}, "is outside the"),
    ({"box": [10, 10, 10, 50]}, "has no area"),
    ({"box": [0, 50, 10, 20]}, "has no area"),
    ({"zoom": 1000}, "zoom must be a number above 0 and at most 4, got 1000"),
    ({"zoom": 0}, "zoom must be a number above 0 and at most 4, got 0"),
    ({"zoom": "2"}, "zoom must be a number above 0 and at most 4, got \"2\""),
    ({"zoom": None}, "zoom must be a number"),
    ({"box": [0, 0, 10, 10], "page": 2}, "unknown argument(s) 'page'"),
]


def test_bad_view_arguments_are_warnings_without_an_image(env, real_tasks):
    task = real_tasks[0]
    page = page_of(task)
    env.reset(options={"task": task.model_dump()})
    for arguments, problem in BAD:
        messages, reward, terminated, truncated, _ = env.step(view(**arguments))
        content = messages[-1]["content"]
        assert isinstance(content, str) and (reward, terminated, truncated) == (0.0, False, False)
        assert content.startswith("Observation from view:\nInvalid view arguments: ")
        assert problem in content, (arguments, content)
        assert content.endswith(f"No image is shown. Use {{}} for the whole {page.width}x{page.height} image, "
                                "or {\"box\": [x0, y0, x1, y1]} in its pixels, optionally with \"zoom\": z (0 < z <= 4).")
    assert "images" not in env.unwrapped._ep.steps[-1]
    # arguments that are not an object are no action at all: the format warning
    messages, *_ = env.step('Action: {"name": "view", "arguments": [0, 0, 10, 10]}')
    assert messages[-1]["content"].startswith("Observation from format_check:\nNo valid action was parsed.")


@pytest.mark.parametrize("answer_index", [0, None])
def test_scores_exactly_as_the_same_answer_in_docvqa_cli(real_tasks, answer_index):
    task = real_tasks[2]
    answer = task.answers[0] if answer_index is not None else task.answers[0][:-2] + "zz"
    records = {}
    for env_id, tool_call in (("DocVQA-CLI-v0", OCR), ("DocVQA-VL-v0", view(box=[0, 0, 400, 300]))):
        env = gym.make(env_id, dataset=real_tasks)
        try:
            env.reset(options={"task": task.model_dump()})
            env.step(tool_call)
            *_, reward, terminated, _, info = env.step(f"Final answer: {answer}")
        finally:
            env.close()
        assert terminated
        records[env_id] = info["episode"]
    fields = ("score", "score_method", "score_status", "answer_status", "prediction", "anls", "acc", "answers",
              "image", "tool_image", "used_bash", "termination_reason")
    cli, vl = ({f: records[e][f] for f in fields} for e in ("DocVQA-CLI-v0", "DocVQA-VL-v0"))
    assert vl == cli
    assert (cli["score"] == 1.0) == (answer_index is not None) and 0 < cli["anls"]


def test_record_keeps_facts_not_pixels(env, real_tasks):
    task = real_tasks[0]
    env.reset(options={"task": task.model_dump()})
    messages, *_ = env.step(view(box=[0, 0, 600, 400], zoom=1.5))
    url = messages[-1]["content"][1]["image_url"]["url"]
    *_, info = env.step("Final answer: x")
    record = info["episode"]
    facts = record["react_steps"][0]["images"]
    assert facts == [{"box": [0, 0, 600, 400], "zoom": 1.5, "source": task.image, "target": "/workspace/document.png",
                      "size": [900, 600],
                      "sha256": hashlib.sha256(base64.b64decode(url.split(",", 1)[1])).hexdigest()}]
    line = json.dumps(record)
    assert "base64" not in line and len(line) < 20_000
    assert record["react_steps"][0]["observation"].startswith("Region [0, 0, 600, 400]")


def test_page_in_prompt_puts_the_capped_page_after_the_task_text(real_tasks):
    task = real_tasks[0]
    page = page_of(task)
    env = gym.make("DocVQA-VL-v0", dataset=real_tasks, page_in_prompt=True)
    plain = gym.make("DocVQA-VL-v0", dataset=real_tasks)
    try:
        messages, _ = env.reset(options={"task": task.model_dump()})
        text_only, _ = plain.reset(options={"task": task.model_dump()})
        user = messages[1]["content"]
        assert [p["type"] for p in user] == ["text", "image_url"] and user[0]["text"] == text_only[1]["content"]
        assert f"Page size: {page.width}x{page.height} pixels" in user[0]["text"]
        [image] = images_of(messages)
        assert image.width * image.height <= 1 << 20
        assert same_pixels(image, page.resize(image.size, Image.Resampling.LANCZOS).convert("RGB"))
        env.step(OCR)
        *_, info = env.step("Final answer: x")
        [facts] = info["episode"]["prompt_images"]
        assert facts["box"] == [0, 0, page.width, page.height] and facts["size"] == list(image.size)
        assert env.unwrapped.config_hash != plain.unwrapped.config_hash
    finally:
        env.close()
        plain.close()
    with pytest.raises(ValueError, match="page_in_prompt must be True or False"):
        gym.make("DocVQA-VL-v0", page_in_prompt="yes")


def test_without_a_processor_image_counts_are_estimates(real_tasks):
    """With only a tokenizer the text is exact, each image costs ceil(w/28)*ceil(h/28) tokens, and the
    record says the counts are estimates (docs/protocol.md#image-token-counts)."""
    from agent_envs.policy.hf import smollm2_tokenizer
    from agent_envs.tokens import TokenCounter

    tokenizer = smollm2_tokenizer()
    env = gym.make("DocVQA-VL-v0", dataset=real_tasks, tokenizer=tokenizer)
    try:
        env.reset(options={"task": real_tasks[0].model_dump()})
        messages, *_ = env.step(view(box=[0, 0, 280, 56]))
        observation = messages[-1]
        text_cost = TokenCounter(tokenizer).prompt_tokens([{"role": "user", "content": observation["content"][0]["text"]}])
        ep = env.unwrapped._ep
        assert ep.trajectory_tokens - ep.generated_tokens == text_cost + 10 * 2
        *_, info = env.step("Final answer: x")
        assert info["episode"]["token_counts_exact"] is False
    finally:
        env.close()
