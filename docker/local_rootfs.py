"""Write a minimal root filesystem, taken from this machine, as a tar stream on stdout.

Why: base images cannot be pulled on air-gapped machines, but ``docker import`` accepts any
tarball.  The tree holds exactly what the tool sandbox promises (bash and core utilities,
tesseract with its language data, python with numpy/sympy/Pillow/pytesseract, no pip) plus,
with ``--with-package``, this repository installed with its runtime dependencies.  Paths keep
their host locations so interpreters and shared libraries find each other unchanged.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

#: commands a model may reasonably use; missing ones are skipped
TOOLS = (
    "bash sh dash env cat ls cp mv rm mkdir rmdir ln chmod touch head tail wc sort uniq cut tr "
    "tee grep egrep fgrep sed awk mawk find xargs which timeout sleep echo printf test true "
    "false pwd date id whoami basename dirname readlink realpath stat du df ps kill nproc uname "
    "seq expr diff cmp comm paste join split fold nl tac md5sum sha256sum base64 od tar gzip "
    "gunzip zcat file mktemp hostname getent dd yes bc xxd strings iconv shuf cksum pgrep "
    "tesseract bwrap"
).split()
#: always installed in the sandbox's Python (docs/protocol.md#docvqa-tool: parity with the reference runtime)
SANDBOX_PACKAGES = ["numpy", "sympy", "pillow", "pytesseract"]
STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
#: repository parts that a package build does not need
BUILD_IGNORE = (
    ".git",
    "build",
    "dist",
    "runs",
    "tests",
    "benchmarks",
    "*.egg-info",
    "__pycache__",
    ".venv*",
    ".cache",
    ".pytest_cache",
    ".hypothesis",
)
PASSWD = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/tmp:/bin/bash\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


def _requirement_closure(roots: list[str], skip: set[str]) -> list[metadata.Distribution]:
    """Installed distributions needed by ``roots`` (markers evaluated, no extras)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in seen or name in skip:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            sys.exit(f"local_rootfs: {req.name} is not installed on this machine; pip install it first")
        seen[name] = dist
        for spec in dist.requires or []:
            dep = Requirement(spec)
            if dep.marker is None or dep.marker.evaluate({"extra": ""}):
                todo.append(dep)
    return list(seen.values())


def _dist_files(dist: metadata.Distribution, site: Path) -> list[tuple[Path, str]]:
    """(host file, absolute path in the image) for every file a distribution recorded."""
    if dist.files is None:
        sys.exit(f"local_rootfs: {dist.metadata['Name']} has no RECORD; reinstall it with pip")
    here = Path(dist.locate_file("")).resolve()
    out = []
    for rel in dist.files:
        host = Path(os.path.normpath(here / rel))
        if host.is_file():
            try:
                dest = site / host.relative_to(here)
            except ValueError:  # console scripts recorded as ../../../bin/x
                dest = host
            out.append((host, str(dest)))
    return out


def _is_elf(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(4) == b"\x7fELF"


def _is_shared_object(path: Path) -> bool:
    return path.suffix == ".so" or ".so." in path.name


def _elf_libraries(files: list[Path]) -> set[Path]:
    """Shared libraries (and the loader) the given ELF files load, via ``ldd``."""
    libs: set[Path] = set()
    elves = [str(f) for f in files if _is_elf(f)]
    for start in range(0, len(elves), 200):
        res = subprocess.run(["ldd", *elves[start : start + 200]], capture_output=True, text=True, check=False)
        for line in res.stdout.splitlines():
            if not line[:1].isspace():  # "file:" headers when several files are listed
                continue
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts else ""
            if path.startswith("/"):
                libs.add(Path(path))
    return libs


class RootfsWriter:
    """Tar stream with parent directories, symlink chains and world-readable modes."""

    def __init__(self, out) -> None:
        self.tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT)
        self.done: set[str] = set()

    @staticmethod
    def _info(info: tarfile.TarInfo) -> tarfile.TarInfo:
        """Root-owned and readable by the sandbox's unprivileged user."""
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mode |= 0o555 if info.isdir() or info.mode & 0o100 else 0o444
        return info

    def directory(self, name: str, mode: int = 0o755) -> None:
        name = name.rstrip("/") or "/"
        if name in self.done or name == "/":
            return
        self.directory(os.path.dirname(name))
        self.done.add(name)
        info = tarfile.TarInfo(name.lstrip("/"))
        info.type, info.mode = tarfile.DIRTYPE, mode
        self.tar.addfile(self._info(info))

    def path(self, host: Path, dest: str | None = None) -> None:
        """Add ``host`` at ``dest`` (default: its own location, symlink chain kept as links)."""
        host = Path(os.path.realpath(host.parent)) / host.name
        if dest is not None and dest != str(host) and host.is_symlink():
            host = Path(os.path.realpath(host))
        dest = dest or str(host)
        if dest in self.done:
            return
        self.directory(os.path.dirname(dest))
        self.done.add(dest)
        info = self.tar.gettarinfo(str(host), dest.lstrip("/"))
        if info.isreg():
            with open(host, "rb") as fh:
                self.tar.addfile(self._info(info), fh)
        else:
            self.tar.addfile(self._info(info))
        if host.is_symlink():
            self.path(Path(os.path.join(host.parent, os.readlink(host))))

    def tree(self, root: Path, skip: set[str] = frozenset()) -> list[Path]:
        added = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if d not in skip]
            self.directory(dirpath)
            for name in filenames:
                self.path(Path(dirpath, name))
                added.append(Path(dirpath, name))
        return added

    def text(self, dest: str, body: str, mode: int = 0o644) -> None:
        self.directory(os.path.dirname(dest))
        self.done.add(dest)
        data = body.encode()
        info = tarfile.TarInfo(dest.lstrip("/"))
        info.size, info.mode = len(data), mode
        self.tar.addfile(self._info(info), io.BytesIO(data))


def _install_package(repo: Path, staging: Path) -> None:
    """``pip install .`` (no dependencies, offline) into a staging folder.

    The build runs on a copy so that no ``build/`` or ``*.egg-info`` lands in the working tree.
    ``--target`` (not ``--root``): with ``--root`` pip also uninstalls the package from the
    running environment, which removed a developer's editable install.
    """
    src = staging / "src"
    shutil.copytree(repo, src, ignore=shutil.ignore_patterns(*BUILD_IGNORE))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--no-index",
        "--no-build-isolation",
        "--no-compile",
        "--no-warn-script-location",
        "--root-user-action=ignore",
        "--target",
        str(staging / "site"),
        str(src),
    ]
    subprocess.run(cmd, check=True, stdout=sys.stderr)


def write_rootfs(out, repo: Path | None) -> None:
    base = Path(sys.base_prefix)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(base)}))
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    w = RootfsWriter(out)
    for link in ("bin", "sbin", "lib", "lib64"):
        if Path("/", link).is_symlink():
            w.path(Path("/", link))
    elves: list[Path] = []
    for tool in TOOLS:
        found = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
        if found:
            w.path(Path(found))
            elves.append(Path(os.path.realpath(found)))
    for name in (ver, "python3", "python"):
        if (base / "bin" / name).exists():
            w.path(base / "bin" / name)
    elves.append(Path(os.path.realpath(base / "bin" / ver)))
    stdlib = w.tree(base / "lib" / ver, STDLIB_SKIP | {Path(sysconfig.get_config_var("LIBPL")).name})
    elves += [f for f in stdlib if _is_shared_object(f)]
    roots = list(SANDBOX_PACKAGES)
    project = None
    if repo is not None:
        meta = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
        project = canonicalize_name(meta["name"])
        roots += meta.get("dependencies", [])
    for dist in _requirement_closure(roots, skip={project} if project else set()):
        for host, dest in _dist_files(dist, site):
            w.path(host, dest)
            if _is_shared_object(host):
                elves.append(host)
    w.tree(Path("/usr/share/tesseract-ocr"))
    for lib in sorted(_elf_libraries(elves)):
        w.path(lib)
    for cfg in ("/etc/ld.so.conf", "/etc/nsswitch.conf"):
        if Path(cfg).exists():
            w.path(Path(cfg))
    if Path("/etc/ld.so.conf.d").is_dir():
        w.tree(Path("/etc/ld.so.conf.d"))
    w.text("/etc/passwd", PASSWD)
    w.text("/etc/group", GROUP)
    # /workspace stays absent: a tmpfs mounted on a missing directory keeps its mode=1777,
    # while one mounted on an image directory copies that directory's mode
    w.directory("/tmp", 0o1777)
    if repo is not None:
        with tempfile.TemporaryDirectory() as staging:
            _install_package(repo, Path(staging))
            target = Path(staging, "site")
            for host in sorted(target.rglob("*")):
                if host.is_file() or host.is_symlink():
                    rel = host.relative_to(target)
                    dest = base / rel if rel.parts[0] == "bin" else site / rel
                    w.path(host, str(dest))
    w.tar.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--with-package",
        type=Path,
        metavar="REPO",
        help="also install this repository (and its dependencies) into the image",
    )
    args = parser.parse_args()
    write_rootfs(sys.stdout.buffer, args.with_package)


if __name__ == "__main__":
    main()
