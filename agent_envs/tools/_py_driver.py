"""The in-sandbox side of the python tool: one interpreter, one globals dict, many code blocks.

Run as ``python3 -u -c <this source> STATUS_FD SWEEP``.  Each block arrives on stdin as
``<16-hex nonce> <byte length>\\n<utf-8 code>``.  Its output goes to the inherited stdout and
stderr; afterwards the driver (with ``SWEEP`` = 1, only inside a private pid namespace) SIGKILLs
every other process it can see, then writes ``<nonce> <kind> <rc>\\n`` to the status fd and
blocks reading the next block.  Kind ``R``: the interpreter lives on; ``X``: it exits right after
(``MemoryError``, or a thread left running, which Python cannot stop).  ``sys.exit``,
``os._exit`` and signals end the process without a status line.  The code runs in this process,
so it could write a status line too: the host takes one as a call's end only once this process
is blocked reading its commands with nothing else left running (tools/python.py).
"""

import _ast  # the builtin node classes: importing ``ast`` would double the start-up time
import io  # loaded at start-up already (sys.stdout is one): naming its types costs nothing
import os
import sys

#: the interpreter's globals, kept from block to block
Scope = dict[str, object]


def _read_exactly(stream: io.FileIO, size: int) -> bytes | None:
    chunks: list[bytes] = []
    while size > 0:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _sweep() -> None:
    """Kill every process of the sandbox but this one and init; reap our own children."""
    for _ in range(100000):
        try:
            os.kill(-1, 9)
        except OSError:
            break
        _reap()
    _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def _execute(code: str, scope: Scope) -> None:
    """Run one block like a notebook cell: the value of a final bare expression is printed."""
    tree = compile(code, "<python>", "exec", _ast.PyCF_ONLY_AST)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], _ast.Expr) else None  # type: ignore[attr-defined]
    exec(compile(tree, "<python>", "exec"), scope)  # type: ignore[call-overload]
    if last is not None:
        exec(compile(_ast.Interactive([last]), "<python>", "single"), scope)


def _block(code: bytes, scope: Scope) -> tuple[str, int]:
    """Returns (kind, rc)."""
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    try:
        _execute(code.decode("utf-8", "surrogateescape"), scope)
        return "R", 0
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - everything a block raises is its output
        import traceback

        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<python>":
            tb = tb.tb_next  # hide the driver's own frames
        traceback.print_exception(type(exc), exc, tb, file=sys.__stderr__)
        return ("X", 1) if isinstance(exc, MemoryError) else ("R", 1)


def main() -> None:
    status_fd, sweep = int(sys.argv[1]), sys.argv[2] == "1"
    commands = os.fdopen(os.dup(0), "rb", buffering=0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if not sweep:  # no pid namespace: adopt orphans, so the host can find and kill them
        import ctypes

        ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    scope: Scope = {"__name__": "__main__", "__builtins__": __builtins__}
    me = os.getpid()
    os.write(status_fd, b"boot B 0\n")
    while True:
        head = commands.readline()
        if not head:
            return
        nonce, size = head.split()
        code = _read_exactly(commands, int(size))
        if code is None:
            return
        _reap()
        kind, rc = _block(code, scope)
        if os.getpid() != me:  # a child forked by the code must not run the driver loop
            os._exit(rc)
        for stream in (sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()  # type: ignore[union-attr]
            except (OSError, ValueError):
                pass
        if sweep:
            _sweep()
        if _threads() > 1:
            os.write(
                2,
                b"python: a thread was still running after the code finished; threads "
                b"cannot outlive a call, so the interpreter restarts.\n",
            )
            kind = "X"
        # the leading newline ends whatever the code may have written to this fd
        os.write(status_fd, b"\n%s %s %d\n" % (nonce, kind.encode(), rc))
        if kind == "X":
            os._exit(rc)


main()
