"""Sandbox latency/throughput benchmark; prints a markdown table.

Measures, for persistent bwrap, fresh bwrap (and docker exec when DOCKER_HOST reaches a daemon
with the configured image): ``echo hi`` and 1 MB-output latency (median, p99), sessions/s
(spawn + first command + close), RSS per idle session, 64 concurrent episodes x 20
``python3 -c`` steps (steps/s), tesseract seconds per page with OMP_THREAD_LIMIT=1 vs unset, and
the persistent python tool's ``print(6*7)`` beside the bash tool's ``python3 -c 'print(6*7)'``
(64 concurrent episodes x 20 steps: steps/s and median step latency).

    python benchmarks/bench_sandbox.py [--quick] [--tools-only]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from agent_envs.core.spec import Mount
from agent_envs.envs.docvqa.spec import DOCUMENT_PATH
from agent_envs.sandbox.base import SandboxConfig
from agent_envs.sandbox.factory import make_sandbox
from agent_envs.tools.python import PythonTool

DOCS = Path(__file__).resolve().parents[2] / "shared" / "data" / "docvqa_sample" / "documents"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def latency(cfg: SandboxConfig, cmd: str, n: int) -> tuple[float, float]:
    sb = make_sandbox(cfg)
    try:
        sb.run("true")
        times = []
        for _ in range(n):
            t = time.perf_counter()
            res = sb.run(cmd)
            times.append(time.perf_counter() - t)
            assert res.returncode == 0, res
        return statistics.median(times) * 1e3, pct(times, 0.99) * 1e3
    finally:
        sb.close()


def sessions_per_s(cfg: SandboxConfig, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        sb = make_sandbox(cfg)
        sb.run("true")
        sb.close()
    return n / (time.perf_counter() - t)


def idle_rss_mib(cfg: SandboxConfig) -> float:
    sb = make_sandbox(cfg)
    try:
        sb.run("true")
        total = 0
        for pid in sb.processes():  # type: ignore[attr-defined]
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        return total / 1024
    finally:
        sb.close()


def concurrent_steps(cfg: SandboxConfig, episodes: int, steps: int, tool: str = "bash") -> tuple[float, float]:
    """Steps/s and median step latency (ms) of ``episodes`` concurrent episodes of ``steps``
    python steps each: ``python3 -c 'print(i*s)'`` through the bash tool, or ``print(i*s)``
    through the persistent python tool (``tool="python"``)."""
    latencies: list[float] = []

    def episode(i: int) -> None:
        sb = make_sandbox(cfg) if tool == "bash" else PythonTool(cfg)
        try:
            for s in range(steps):
                t = time.perf_counter()
                res = sb.run(f"python3 -c 'print({i}*{s})'" if tool == "bash" else f"print({i}*{s})")
                latencies.append(time.perf_counter() - t)
                assert res.stdout == f"{i * s}\n".encode(), res
        finally:
            sb.close()

    t = time.perf_counter()
    with ThreadPoolExecutor(episodes) as pool:
        list(pool.map(episode, range(episodes)))
    return episodes * steps / (time.perf_counter() - t), statistics.median(latencies) * 1e3


def tool_comparison(episodes: int = 64, steps: int = 20) -> None:
    """The python tool beside the bash tool's ``python3 -c`` (persistent bwrap, one run)."""
    cfg = SandboxConfig(mode="persistent")
    rows = {
        "bash tool: python3 -c 'print(6*7)'": concurrent_steps(cfg, episodes, steps, "bash"),
        "python tool: print(6*7)": concurrent_steps(cfg, episodes, steps, "python"),
    }
    print(f"\n| {episodes} concurrent episodes x {steps} steps (bwrap) | steps/s | median step latency (ms) |")
    print("|---|---|---|")
    for name, (sps, med) in rows.items():
        print(f"| {name} | {sps:.1f} | {med:.2f} |")
    (bash, bash_med), (py, py_med) = rows.values()
    print(f"\npython tool vs bash tool: {py / bash:.1f}x steps/s, {bash_med / py_med:.1f}x lower median latency")


def tesseract_s(page: Path, limit_threads: bool) -> float:
    env = {} if limit_threads else {"OMP_THREAD_LIMIT": "64"}
    cfg = SandboxConfig(mounts=[Mount(str(page), DOCUMENT_PATH)], env=env)
    sb = make_sandbox(cfg)
    try:
        cmd = (
            "tesseract /workspace/document.png stdout >/dev/null 2>&1"
            if limit_threads
            else "unset OMP_THREAD_LIMIT; tesseract /workspace/document.png stdout >/dev/null 2>&1"
        )
        t = time.perf_counter()
        res = sb.run(cmd, timeout=300)
        assert res.returncode == 0, res
        return time.perf_counter() - t
    finally:
        sb.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--docker", action="store_true", help="also measure the docker backend")
    ap.add_argument(
        "--tools-only",
        action="store_true",
        help="only the python tool vs bash tool comparison (64 episodes x 20 steps)",
    )
    args = ap.parse_args()
    if args.tools_only:
        tool_comparison()
        return
    configs = {"bwrap persistent": SandboxConfig(mode="persistent"), "bwrap fresh": SandboxConfig(mode="fresh")}
    daemon = None
    if args.docker:
        daemon, image = private_docker()
        configs["docker exec"] = SandboxConfig(backend="docker", docker_image=image)
    try:
        run_all(configs, args.quick)
    finally:
        if daemon is not None:
            from docker_daemon import _stop

            _stop(daemon)


def private_docker():
    """A private dockerd and the locally imported image, as the tests build them (nothing pulled)."""
    import os
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from docker_daemon import REPO, TEST_IMAGE, _start

    daemon = _start()
    os.environ["DOCKER_HOST"] = daemon.host
    subprocess.run(
        [str(REPO / "docker" / "build_local_image.sh"), TEST_IMAGE],
        env=daemon.env(),
        check=True,
        capture_output=True,
        timeout=600,
    )
    return daemon, TEST_IMAGE


def run_all(configs: dict[str, SandboxConfig], quick: bool) -> None:
    n = 50 if quick else 300
    rows: dict[str, dict[str, str]] = {}
    raw: dict[str, dict[str, float]] = {}
    for name, cfg in configs.items():
        e_med, e_p99 = latency(cfg, "echo hi", n)
        m_med, m_p99 = latency(cfg, "head -c 1000000 /dev/zero | tr '\\0' x", max(10, n // 10))
        sps = sessions_per_s(cfg, 10 if quick else 40)
        rss = idle_rss_mib(cfg) if name.startswith("bwrap") else float("nan")
        steps = concurrent_steps(cfg, 64, 20 if not quick else 5)[0]
        raw[name] = {"echo": e_med, "steps": steps}
        rows[name] = {
            "echo hi median / p99 (ms)": f"{e_med:.2f} / {e_p99:.2f}",
            "1 MB output median / p99 (ms)": f"{m_med:.1f} / {m_p99:.1f}",
            "sessions/s": f"{sps:.1f}",
            "idle RSS (MiB)": f"{rss:.1f}",
            "64x20 python3 steps/s": f"{steps:.1f}",
        }
    cols = list(next(iter(rows.values())))
    print("| backend | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(row[c] for c in cols) + " |")
    p, f = raw["bwrap persistent"], raw["bwrap fresh"]
    print(
        f"\npersistent vs fresh: echo hi {f['echo'] / p['echo']:.1f}x faster, "
        f"64-concurrent steps/s {p['steps'] / f['steps']:.2f}x"
    )
    pages = sorted(DOCS.glob("*.png"))
    if pages:
        one, unset = tesseract_s(pages[0], True), tesseract_s(pages[0], False)
        print(
            f"\ntesseract on {pages[0].name}: {one:.2f} s/page with OMP_THREAD_LIMIT=1, "
            f"{unset:.2f} s/page unset ({unset / one:.2f}x)"
        )
    else:
        print(f"\n(no DocVQA pages under {DOCS}; tesseract skipped)", file=sys.stderr)
    tool_comparison(64, 20 if not quick else 5)


if __name__ == "__main__":
    main()
