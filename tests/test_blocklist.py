"""Math ES dangerous-command screen, whole-token rule (docs/protocol.md#math-blocklist, #derived-cases)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_envs.protocol.blocklist import BLOCKED_WORDS, is_blocked

SEPARATORS = [" ", "\t", "\n", ";", "&", "|", "(", ")", "$", "<", ">", "`"]


@pytest.mark.parametrize(
    "command",
    [
        "echo su",
        "kill -9 123",
        "ls;sudo rm",
        "ray status",
        "python3 -c \"print('a kill b')\"",
        "cat file|xdg-open",
        "ls > firefox",
        "KILLALL python",
        "google-chrome-stable",
        "x && `tmux ls`",
        "halt\n",
    ],
)
def test_blocked(command):
    assert is_blocked(command)


@pytest.mark.parametrize(
    "command",
    [
        'python -c "import os; os.kill(1,9)"',
        "echo $(reboot)",
        "echo killing",
        "echo sudo-rs",
        "ls ./firefox",
        "cat screenshot.png",
        "python -c 'print(1)'",
        "",
        "rays",
        "echo 'su'",
        "x && `tmux`",
    ],
)
def test_not_blocked(command):
    assert not is_blocked(command)


def test_word_list_is_the_protocol_list():
    assert len(BLOCKED_WORDS) == 33 and len(set(BLOCKED_WORDS)) == 33
    assert {"sudo", "notify-send", "google-chrome-stable", "chromium-browser", "brave-browser"} <= set(BLOCKED_WORDS)


@pytest.mark.parametrize("word", BLOCKED_WORDS)
@pytest.mark.parametrize("sep", SEPARATORS)
def test_every_word_is_blocked_after_every_separator(word, sep):
    assert is_blocked(word)
    assert is_blocked(f"true{sep}{word} arg")
    assert is_blocked(f"true{sep}{word.upper()}")


@pytest.mark.parametrize("word", BLOCKED_WORDS)
def test_glued_words_are_not_tokens(word):
    assert not is_blocked(f"x{word}")
    assert not is_blocked(f"{word}x")
    assert not is_blocked(f"{word})")  # followed by ")" is not a token end
    assert not is_blocked(f"/usr/bin/{word}")


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_never_raises(command):
    assert isinstance(is_blocked(command), bool)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_./=", max_size=30), st.sampled_from(BLOCKED_WORDS))
def test_a_word_alone_between_spaces_is_always_blocked(prefix, word):
    assert is_blocked(f"{prefix} {word} {prefix}")
