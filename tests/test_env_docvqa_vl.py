"""DocVQA-VL-v0 (docs/protocol.md#view-tool) on the real DocVQA sample pages, real bubblewrap and
tesseract: the view tool's images are the requested pixels of the page, bad arguments are
warnings, and an episode scores exactly as the same answer does in DocVQA-CLI-v0."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from PIL import Image

import agent_envs  # noqa: F401
from agent_envs.core.content import decode_image_url, images_of
from agent_envs.envs.docvqa.data import load_docvqa_tasks

REPO = Path(__file__).resolve().parent.parent
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
        f"shown as 781x177 pixels."
    )
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
    assert (
        f"(scaled down from {page.width}x{page.height} to stay within 1048576 pixels)"
        in messages[-1]["content"][0]["text"]
    )


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
    ({"box": ["0", 0, 10, 10]}, 'box[0] must be a whole number of pixels, got "0"'),
    ({"box": [0, 0, 10.5, 10]}, "box[2] must be a whole number of pixels, got 10.5"),
    ({"box": [True, 0, 10, 10]}, "box[0] must be a whole number of pixels, got true"),
    ({"box": [0, 0, 10**9, 10]}, "is outside the"),
    ({"box": [0, 0, 10**400, 10]}, "box [0, 0, 1000000000000"),  # once OverflowError (int -> float)
    ({"box": [0, 0, 1e300, 10]}, "is outside the"),
    ({"box": [0, 0, float("inf"), 10]}, "box[2] must be a whole number of pixels, got Infinity"),
    ({"zoom": 10**400}, "zoom must be a number above 0 and at most 4, got 1000000000"),
    ({"box": [-1, 0, 10, 10]}, "is outside the"),
    ({"box": [10, 10, 10, 50]}, "has no area"),
    ({"box": [0, 50, 10, 20]}, "has no area"),
    ({"zoom": 1000}, "zoom must be a number above 0 and at most 4, got 1000"),
    ({"zoom": 0}, "zoom must be a number above 0 and at most 4, got 0"),
    ({"zoom": "2"}, 'zoom must be a number above 0 and at most 4, got "2"'),
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
        assert content.endswith(
            f"No image is shown. Use {{}} for the whole {page.width}x{page.height} image, "
            'or {"box": [x0, y0, x1, y1]} in its pixels, optionally with "zoom": z (0 < z <= 4).'
        )
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
        records[env_id] = info["record"]
    fields = (
        "score",
        "score_method",
        "score_status",
        "answer_status",
        "prediction",
        "anls",
        "acc",
        "answers",
        "image",
        "tool_image",
        "used_bash",
        "termination_reason",
    )
    cli, vl = ({f: records[e][f] for f in fields} for e in ("DocVQA-CLI-v0", "DocVQA-VL-v0"))
    assert vl == cli
    assert (cli["score"] == 1.0) == (answer_index is not None) and 0 < cli["anls"]


def test_record_keeps_facts_not_pixels(env, real_tasks):
    task = real_tasks[0]
    env.reset(options={"task": task.model_dump()})
    messages, *_ = env.step(view(box=[0, 0, 600, 400], zoom=1.5))
    url = messages[-1]["content"][1]["image_url"]["url"]
    *_, info = env.step("Final answer: x")
    record = info["record"]
    facts = record["react_steps"][0]["images"]
    assert facts == [
        {
            "box": [0, 0, 600, 400],
            "zoom": 1.5,
            "source": task.image,
            "target": "/workspace/document.png",
            "source_sha256": hashlib.sha256(open(task.image, "rb").read()).hexdigest(),
            "size": [900, 600],
            "sha256": hashlib.sha256(base64.b64decode(url.split(",", 1)[1])).hexdigest(),
        }
    ]
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
        [facts] = info["record"]["prompt_images"]
        assert facts["box"] == [0, 0, page.width, page.height] and facts["size"] == list(image.size)
        assert env.unwrapped.config_hash != plain.unwrapped.config_hash
    finally:
        env.close()
        plain.close()
    with pytest.raises(
        ValueError, match="invalid DocVQA-VL-v0 argument: page_in_prompt='yes': Input should be a valid boolean"
    ):
        gym.make("DocVQA-VL-v0", page_in_prompt="yes")
    with pytest.raises(ValueError, match="max_view_pixels=2.5: must be an integer"):
        gym.make("DocVQA-VL-v0", max_view_pixels=2.5)


def test_max_view_pixels_sets_the_cap_of_views_and_of_the_page_in_the_prompt(real_tasks):
    task = real_tasks[0]
    page = page_of(task)
    env = gym.make("DocVQA-VL-v0", dataset=real_tasks, page_in_prompt=True, max_view_pixels=200_000)
    try:
        messages, _ = env.reset(options={"task": task.model_dump()})
        [prompt_page] = images_of(messages)
        messages, *_ = env.step(view(box=[0, 0, 1000, 1000]))
        region = shown(messages)
        for image in (prompt_page, region):
            assert 190_000 < image.width * image.height <= 200_000
        assert same_pixels(region, page.crop((0, 0, 1000, 1000)).resize(region.size, Image.Resampling.LANCZOS))
        assert "to stay within 200000 pixels" in messages[-1]["content"][0]["text"]
        assert gym.make("DocVQA-VL-v0").unwrapped.env_spec.tool("view") != env.unwrapped.env_spec.tool("view")
    finally:
        env.close()


def test_without_a_processor_image_counts_are_estimates(real_tasks):
    """With only a tokenizer the text is exact, each image costs ceil(w/28)*ceil(h/28) tokens, and the
    record says the counts are estimates (docs/protocol.md#image-token-counts)."""
    from agent_envs.policy.hf import smollm2_tokenizer
    from agent_envs.core.tokens import TokenCounter

    tokenizer = smollm2_tokenizer()
    env = gym.make("DocVQA-VL-v0", dataset=real_tasks, tokenizer=tokenizer)
    try:
        env.reset(options={"task": real_tasks[0].model_dump()})
        messages, *_ = env.step(view(box=[0, 0, 280, 56]))
        observation = messages[-1]
        text_cost = TokenCounter(tokenizer).prompt_tokens(
            [{"role": "user", "content": observation["content"][0]["text"]}]
        )
        ep = env.unwrapped._ep
        assert ep.trajectory_tokens - ep.generated_tokens == text_cost + 10 * 2
        *_, info = env.step("Final answer: x")
        assert info["record"]["token_counts_exact"] is False
    finally:
        env.close()


def test_cli_scripted_eval_records_and_reports_the_viewed_regions(tmp_path, docvqa_dir):
    """``agent-envs eval --env DocVQA-VL-v0 --policy scripted`` on the real pages: the baseline
    views each page, OCRs it and answers; the report shows every viewed region, re-rendered from
    the page and the record's facts to exactly the PNG the model received."""
    from agent_envs.core.content import image_part
    from agent_envs.report.media import rerender
    from agent_envs.rollout.records import read_jsonl

    out = tmp_path / "vl"
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_envs.cli",
            "eval",
            "--env",
            "DocVQA-VL-v0",
            "--policy",
            "scripted",
            "--data",
            str(docvqa_dir / "val_v1.0.json"),
            "--limit",
            "2",
            "--out",
            str(out),
            "--no-progress",
            "--env-arg",
            "page_in_prompt=true",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    rows, bad = read_jsonl(out / "records.jsonl")
    assert bad == 0 and len(rows) == 2
    html = (out / "report.html").read_text()
    for row in rows:
        assert row["termination_reason"] == "final_answer" and row["turns"] == 3 and row["token_counts_exact"] is False
        view_step = row["react_steps"][0]
        assert view_step["action"] == {"name": "view", "arguments": {}}
        for facts in view_step["images"] + row["prompt_images"]:
            image, problem = rerender(facts)
            assert problem is None
            png = base64.b64decode(image_part(image)["image_url"]["url"].split(",", 1)[1])
            assert hashlib.sha256(png).hexdigest() == facts["sha256"]
            assert f'data-image="shown:{facts["sha256"]}"' in html
        [log] = (out / "trace_logs").glob(f"docvqa_vl_agent_{row['task_id']}_sample00_*.md")
        facts = view_step["images"][0]
        assert (
            f"### Images shown\n\n- box {facts['box']} of {facts['source']}, zoom 1.0, "
            f"{facts['size'][0]}x{facts['size'][1]} pixels, sha256 {facts['sha256']}\n"
        ) in log.read_text()
    assert "image shown to the model: box [0, 0, " in html and "changed since the run" not in html


def env_on_a_copied_page(tmp_path, task) -> tuple[gym.Env, Path]:
    """DocVQA-VL on a copy of ``task``'s page, which the test may then change or remove."""
    page = tmp_path / "page.png"
    page.write_bytes(Path(task.image).read_bytes())
    return gym.make("DocVQA-VL-v0", tasks=[{**task.model_dump(), "image": str(page)}]), page


def test_report_flags_a_page_that_changed_after_the_run(tmp_path, real_tasks):
    from agent_envs.report.media import rerender

    env, page = env_on_a_copied_page(tmp_path, real_tasks[0])
    try:
        env.reset(options={"row_index": 0})
        env.step(view(box=[0, 0, 64, 64]))
        *_, info = env.step("Final answer: x")
    finally:
        env.close()
    [facts] = info["record"]["react_steps"][0]["images"]
    assert rerender(facts)[1] is None
    Image.new("L", (800, 800), 255).save(page)  # a different size too: the cache sees the change
    image, problem = rerender(facts)
    assert image is not None and problem == f"{page} changed since the run: this is the region of the current file"
    page.unlink()
    image, problem = rerender(facts)
    assert image is None and problem.startswith(f"cannot re-render it from {page}")


def test_view_without_arguments_follows_each_harness_parser(real_tasks):
    """Under the ES parser a missing ``arguments`` is ``{}`` (the whole page); the HTTP evaluator's
    parser requires the key, so there it is a format warning (docs/protocol.md#action-parsers)."""
    task = real_tasks[0]
    for compat, first in (
        ("es", "Observation from view:\nRegion [0, 0, "),
        ("http_eval", "Observation from format_check:\nNo valid action was parsed."),
    ):
        env = gym.make("DocVQA-VL-v0", dataset=real_tasks, compat=compat, render_mode="ansi")
        try:
            env.reset(options={"task": task.model_dump()})
            messages, *_ = env.step('Action: {"name": "view"}')
            content = messages[-1]["content"]
            assert (content if isinstance(content, str) else content[0]["text"]).startswith(first), compat
            if compat == "es":
                assert env.render().endswith(" pixels).\n[image]")  # ansi shows where the image is
            messages, *_ = env.step('Action: {"name": "crop", "arguments": {}}')
            assert messages[-1]["content"] == (
                "Observation from crop:\nUnknown action 'crop'. Available actions are bash and view."
            )
        finally:
            env.close()


def test_a_page_removed_mid_episode_is_an_error_observation(tmp_path, real_tasks):
    env, page = env_on_a_copied_page(tmp_path, real_tasks[0])
    try:
        env.reset(options={"row_index": 0})
        page.unlink()
        messages, reward, terminated, truncated, _ = env.step(view())
        assert (reward, terminated, truncated) == (0.0, False, False)
        assert messages[-1]["content"].startswith(
            "Observation from view:\n[ERROR] The image cannot be read: FileNotFoundError: "
        )
    finally:
        env.close()
