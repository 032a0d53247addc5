"""The runner's progress on stderr: episodes done, turns taken, mean reward, generated tokens per second.

It moves with every turn, not only with every finished episode: a run's first episodes often end
only after several turns, and a bar that counts episodes alone sits at 0 until then.  On a terminal
it is a tqdm bar redrawn in place; anywhere else (a log file, a pipe) it writes whole lines, at most
one per ``every_s`` seconds and the last one always, so a log collects no carriage-return frames.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

#: seconds between two progress lines when stderr is not a terminal
LINE_EVERY_S = 15.0


class Progress:
    def __init__(
        self, total: int, enabled: bool, desc: str, stream: IO[str] | None = None, every_s: float = LINE_EVERY_S
    ):
        self.total = total
        self.desc = desc
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.started = time.perf_counter()
        self.count = 0
        self.turns = 0
        self.reward = 0.0
        self.tokens = 0
        self.bar: Any = None
        #: lines instead of a bar; the time of the last line written, and whether news came since
        self.lines = enabled and total > 0 and not _is_terminal(self.stream)
        self._line_at = -float("inf")
        self._news = False
        if enabled and total and not self.lines:
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=self.stream, desc=desc, unit="ep", dynamic_ncols=True)

    def turn(self, n: int = 1) -> None:
        """``n`` turns taken (a step of ``n`` episodes)."""
        self.turns += n
        self._show(advance=0)

    def update(self, score: float, generated_tokens: int) -> None:
        """One episode finished."""
        self.count += 1
        self.reward += max(0.0, score)
        self.tokens += generated_tokens
        self._show(advance=1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.lines and self._news:
            self._line()

    def _stats(self) -> dict[str, str]:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        mean = f"{self.reward / self.count:.3f}" if self.count else "-"
        return {"turns": str(self.turns), "mean_reward": mean, "tok_s": f"{self.tokens / elapsed:.0f}"}

    def _show(self, advance: int) -> None:
        if self.bar is not None:
            self.bar.set_postfix(self._stats(), refresh=False)
            self.bar.update(advance)  # redraws at most every tqdm mininterval, also for 0
        elif self.lines:
            self._news = True
            if self.count == self.total or time.perf_counter() - self._line_at >= self.every_s:
                self._line()

    def _line(self) -> None:
        stats = self._stats()
        elapsed = time.perf_counter() - self.started
        self.stream.write(
            f"[agent-envs] {self.desc}: {self.count}/{self.total} episodes, {stats['turns']} turns, "
            f"mean reward {stats['mean_reward']}, {stats['tok_s']} tok/s, {elapsed:.0f} s\n"
        )
        self.stream.flush()
        self._line_at = time.perf_counter()
        self._news = False


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
