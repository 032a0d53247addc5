"""Dangerous-command screen of the reference ES bash runner (docs/protocol.md#math-blocklist).

The runner refuses, without executing, commands that name privilege, process-control,
multiplexer or desktop-launcher programs. The rule is lexical, not a security boundary: it keeps
unattended rollouts from opening browsers or killing processes, and its quirks (``echo su`` is
blocked, ``os.kill(1,9)`` is not) are part of the protocol.
"""

from __future__ import annotations

import re

BLOCKED_WORDS: tuple[str, ...] = (
    "sudo",
    "su",
    "pkexec",
    "gksu",
    "gksudo",
    "kdesu",
    "kill",
    "pkill",
    "killall",
    "reboot",
    "shutdown",
    "halt",
    "poweroff",
    "screen",
    "tmux",
    "ray",
    "xdg-open",
    "gio",
    "sensible-browser",
    "x-www-browser",
    "firefox",
    "google-chrome",
    "google-chrome-stable",
    "chromium",
    "chromium-browser",
    "brave",
    "brave-browser",
    "opera",
    "epiphany",
    "zenity",
    "kdialog",
    "xmessage",
    "notify-send",
)

# A whole token: after the start, whitespace, ; & | ( ) $ < > or a backtick; before whitespace or
# the end. Longest words first so a prefix never shadows its longer sibling.
_BLOCKED = re.compile(
    r"(?:^|[\s;&|()$<>`])(?:"
    + "|".join(re.escape(w) for w in sorted(BLOCKED_WORDS, key=len, reverse=True))
    + r")(?=\s|$)",
    re.IGNORECASE,
)


def is_blocked(command: str) -> bool:
    """True when the reference runner would answer with the blocked-command observation."""
    return _BLOCKED.search(command) is not None
