"""The sandbox hides the host Python's executable start-up hooks (.pth files) but keeps path ones."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from agent_envs.sandbox._bwrap_layout import _startup_hook_args
from agent_envs.sandbox.base import SandboxConfig
from agent_envs.sandbox.factory import make_sandbox


@pytest.fixture
def outside_tmp():
    """A folder outside /tmp (the sandbox mounts its own /tmp over the host's)."""
    path = Path(tempfile.mkdtemp(prefix="agent-envs-layout-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path)


def _prefix(tmp_path):
    site = tmp_path / "prefix" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "hook.pth").write_text("import os; os.environ['HOOKED'] = '1'\n")
    (site / "paths.pth").write_text("/opt/extra\n")
    (site / "legacy-nspkg.pth").write_text("import sys, types, os\n")
    return tmp_path / "prefix", site


def test_only_executable_hooks_are_shadowed(tmp_path):
    prefix, site = _prefix(tmp_path)
    args = _startup_hook_args((str(prefix),))
    assert args == ("--ro-bind", "/dev/null", str(site / "hook.pth"))


def test_shadowed_hook_does_not_run_inside_the_sandbox(outside_tmp):
    prefix, site = _prefix(outside_tmp)
    sb = make_sandbox(SandboxConfig(runtime_prefixes=[str(prefix)]))
    try:
        res = sb.run(f"cat {site / 'paths.pth'}; cat {site / 'hook.pth'} 2>/dev/null | grep -c import")
        assert res.stdout == b"/opt/extra\n0\n", res
        # what site.py does with a .pth file at start-up: the shadowed hook runs nothing
        code = f"import os, site; site.addpackage({str(site)!r}, 'hook.pth', set()); print(os.environ.get('HOOKED'))"
        res = sb.run(f'python3 -c "{code}"')
        assert res.stdout == b"None\n", res
    finally:
        sb.close()
