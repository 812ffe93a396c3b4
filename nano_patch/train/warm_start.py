"""Child ranks that start warm: Lightning's launcher starts them, a pre-imported interpreter runs them.

Lightning's script launcher starts each child rank as a new interpreter that runs the script from its top, so each
imports torch, torchvision and Lightning again: most of what a second rank adds to the start of a run
(``docs/benchmarks.md``, ``rank_startup.py``), all of it after the launching process reached ``fit``. nano-patch
already runs each child through its rank entry (``python -m nano_patch._rank SCRIPT ARGS``, ``train/ranks.py``). So:

1. A process that starts a multi-instance run (``nano-patch run --num-processes N|auto``, ``patch_torch(num_processes
   =...)`` in a script) starts, at once, one *warm interpreter* (:func:`maybe_start`): ``python -m nano_patch._rank
   --warm-interpreter``, in its own session, which imports the well-known packages the script imports
   (:func:`heavy_imports`: read from the script's source, never run, and forwarded as the launching process imports
   them; only names on :data:`PREIMPORT`), and then waits. It imports while the launching process runs its own
   start, on the cores that start leaves idle.
2. When Lightning's launcher later starts a child rank, the rank entry (:func:`run_warm`) hands the warm interpreter
   its command line, environment, working directory and standard streams (over a Unix socket, the streams as file
   descriptors). The warm interpreter forks; the fork takes them on and runs the rank exactly as the rank entry would
   have (``nano_patch._rank.run``), already imported.
3. The rank entry stays the process Lightning started: it passes every signal it gets on to the rank, and ends with
   the rank's exit status, by the same signal where the rank was killed by one. Lightning's launcher, its process
   observer and ``stop_children`` see and manage the very processes they started; the warm interpreter kills a rank
   whose rank entry was killed (``SIGKILL`` cannot be passed on).

What the rank sees is a fresh interpreter's: its own environment (``os.environ`` replaced before the script runs),
working directory, ``sys.argv`` and ``sys.path``, standard streams rebuilt on the descriptors it was given as
CPython builds them, Python's ``random`` reseeded (CPython does so after every fork) and NumPy's global generator too,
and Lightning's rank-zero flag read again from the rank's environment. It is no child of the launching process (its
parent is the warm interpreter), and it shares the warm interpreter's hash seed.

Anything amiss (no warm interpreter, one that is not ready within :data:`READY_TIMEOUT_S`, one that died, a platform
without ``fork`` or descriptor passing) and the rank entry runs the rank itself, as before. Start methods other than
Lightning's script re-run (``spawn``, ``fork``) and ranks started by torchrun or SLURM are unchanged.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import importlib.util
import io
import json
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

from . import topology

log = logging.getLogger("nano_patch")

#: The warm interpreter's socket, in the launching process's environment (and so its child ranks').
WARM_ENV = "_NANO_PATCH_WARM"
#: Packages the warm interpreter may import ahead: well-known frameworks whose import has no effect a user sees.
PREIMPORT = ("torch", "torchvision", "torchaudio", "pytorch_lightning", "lightning", "lightning_fabric",
             "torchmetrics", "timm", "numpy", "PIL", "sklearn", "scipy")
#: ``python -m nano_patch._rank --warm-interpreter SOCKET [MODULE ...]``: the warm interpreter's command line.
WARM_FLAG = "--warm-interpreter"
#: Seconds a rank entry waits for the warm interpreter to take its rank (it may still be importing).
READY_TIMEOUT_S = 30.0
#: Signals the rank entry passes on to the rank.
FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCONT")

_server: subprocess.Popen | None = None
#: the private folder of the warm interpreter's socket and ready file (removed by :func:`stop`)
_folder: str | None = None
#: Set by ``nano-patch run``, which starts the warm interpreter itself, knowing the script.
deferred = False


def supported() -> bool:
    return hasattr(os, "fork") and hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX") and \
        sys.platform.startswith("linux")


# -- in the launching process --------------------------------------------------------------------------------------


def wanted(num_processes: Any, cpu_for_each_process: Any) -> bool:
    """Options that ask for several processes per node, or for ``auto``."""
    return num_processes == "auto" or (isinstance(num_processes, int) and num_processes > 1) or \
        bool(cpu_for_each_process and len(cpu_for_each_process) > 1)


def _a_rank_or_helper() -> bool:
    """This process is a rank already (Lightning's, torchrun's, SLURM's) or a multiprocessing child."""
    import multiprocessing

    env = os.environ
    return ("LOCAL_RANK" in env or "SLURM_PROCID" in env or "TORCHELASTIC_RUN_ID" in env or WARM_ENV in env
            or multiprocessing.parent_process() is not None)


def maybe_start(num_processes: Any, cpu_for_each_process: Any, script: str | None = None,
                module: str | None = None) -> bool:
    """Start the warm interpreter for a run that asks for several processes (once); True if it started."""
    global _server, _hook, _folder
    if _server is not None or not supported() or not wanted(num_processes, cpu_for_each_process) \
            or _a_rank_or_helper():
        return False
    if num_processes == "auto" and len(topology.counts_to_try()) < 2:
        return False  # auto cannot choose more than one process here
    if script is None and module is None:
        if deferred:
            return False
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None)
        if script is None or os.path.basename(os.path.dirname(os.path.abspath(script))) == "nano_patch":
            return False  # an interactive session (fork start method), or nano-patch's own entry point
    from ..config import STARTUP_ENV

    # What this process imported already, then what the script's top level imports; the rest as it is imported.
    modules = [m for m in PREIMPORT if m in sys.modules]
    modules += [m for m in heavy_imports(script, module) if m not in modules]
    folder = _folder = tempfile.mkdtemp(prefix="nano-patch-warm-")  # mode 0700: only this user reaches the socket
    path = os.path.join(folder, "socket")
    # Unpatched: the rank patches itself with its own environment's options (the rank entry's path).
    env = {k: v for k, v in os.environ.items() if k != STARTUP_ENV}
    try:
        _server = subprocess.Popen([sys.executable, "-m", "nano_patch._rank", WARM_FLAG, path, *modules],
                                   env=env,
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True, close_fds=True)
    except OSError as exc:
        log.debug("nano-patch: no warm interpreter: %s", exc)
        return False
    os.environ[WARM_ENV] = path
    _hook = _Forward(_server.stdin.fileno(), set(modules))  # type: ignore[union-attr]
    sys.meta_path.insert(0, _hook)
    atexit.register(stop)
    return True


class _Forward:
    """A meta path entry that finds nothing: it tells the warm interpreter each package of :data:`PREIMPORT` this
    process starts importing, so that it imports it too, alongside."""

    def __init__(self, fd: int, sent: set[str]) -> None:
        self.fd, self.sent = fd, sent

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in PREIMPORT and name not in self.sent:
            self.sent.add(name)
            with contextlib.suppress(OSError):
                os.write(self.fd, f"{name}\n".encode())

    def invalidate_caches(self) -> None:
        pass


_hook: _Forward | None = None


def stop() -> None:
    """No more ranks will start: the warm interpreter takes no more and ends once the ranks it runs have ended."""
    global _server, _hook, _folder
    os.environ.pop(WARM_ENV, None)
    if _hook is not None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_hook)
        _hook = None
    if _server is not None:
        with contextlib.suppress(OSError):
            _server.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            _server.terminate()
        _server = None
    if _folder is not None:  # (no rank starts from here on: nothing reads the socket or the ready file again)
        shutil.rmtree(_folder, ignore_errors=True)
        _folder = None


def ready_import_seconds() -> float | None:
    """Seconds the warm interpreter spent importing, once it is ready to take ranks; None until then."""
    path = os.environ.get(WARM_ENV)
    if not path:
        return None
    try:
        with open(os.path.join(os.path.dirname(path), "ready")) as f:
            return float(f.read())
    except (OSError, ValueError):
        return None


def heavy_imports(script: str | None, module: str | None) -> list[str]:
    """The modules of :data:`PREIMPORT`'s packages that the script imports at its top level (read, not run), in
    order; ``["torch"]`` where the source cannot be read."""
    path = script
    if module is not None:
        with contextlib.suppress(Exception):
            spec = importlib.util.find_spec(module)
            path = spec.origin if spec is not None else None
    found: list[str] = []
    try:
        with open(path) as f:  # type: ignore[arg-type]
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError, TypeError):
        return ["torch"]
    for node in tree.body:  # the top level only: what runs whenever the script runs
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            if name.split(".")[0] in PREIMPORT and name not in found:
                found.append(name)
    return found or ["torch"]


# -- in the rank entry (the process Lightning started) -------------------------------------------------------------


def _send(sock: socket.socket, data: bytes, fds: list[int] | None = None) -> None:
    frame = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [frame], fds)
    else:
        sock.sendall(frame)


def _recv(sock: socket.socket, fds: int = 0) -> tuple[bytes, list[int]]:
    got: list[int] = []
    if fds:
        head, got, _, _ = socket.recv_fds(sock, 4, fds)
    else:
        head = sock.recv(4)
    while 0 < len(head) < 4:
        more = sock.recv(4 - len(head))
        if not more:
            break
        head += more
    if len(head) < 4:
        for fd in got:
            os.close(fd)
        raise ConnectionError("closed")
    (size,) = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        more = sock.recv(size - len(body))
        if not more:
            for fd in got:  # (the descriptors came with the header: never left open here)
                os.close(fd)
            raise ConnectionError("closed")
        body += more
    return body, got


def run_warm(argv: list[str]) -> int | None:
    """Have the warm interpreter run this rank, watch it, and return its exit status as a negative signal number
    or a code. None where no warm interpreter took it: then this process runs the rank itself."""
    path = os.environ.get(WARM_ENV)
    if not path or not supported():
        return None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        return _run_warm_on(sock, path, argv)


def _run_warm_on(sock: socket.socket, path: str, argv: list[str]) -> int | None:
    try:
        sock.settimeout(READY_TIMEOUT_S)
        sock.connect(path)
        # The warm interpreter says it is ready (done importing); only then is the rank handed over, so that a rank
        # entry that stopped waiting never has its rank run twice.
        if _recv(sock)[0] != b"ready":
            return None
        request = {"argv": argv, "env": {k: v for k, v in os.environ.items() if k != WARM_ENV},
                   "cwd": os.getcwd()}
        _send(sock, json.dumps(request).encode(), [0, 1, 2])
        sock.settimeout(None)
        pid = int(_recv(sock)[0])
    except (OSError, ValueError, ConnectionError):
        return None
    # The rank runs: from here on this process only passes signals on and waits.
    for name in FORWARDED:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            signal.signal(getattr(signal, name), lambda sig, frame: _pass_on(pid, sig))
    try:
        status = _recv(sock)[0].decode()
    except (OSError, ConnectionError):  # the warm interpreter died: its rank must not run on unwatched
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        return 1
    kind, value = status.split()
    return -int(value) if kind == "signal" else int(value)


def _pass_on(pid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, sig)


def exit_as(status: int) -> None:
    """End this process with ``status`` (a negative signal number: by that signal)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if status < 0:
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-status, signal.SIG_DFL)
            os.kill(os.getpid(), -status)
        os._exit(128 - status)
    os._exit(status)


# -- in the warm interpreter ---------------------------------------------------------------------------------------


def serve(path: str, modules: list[str], own: tuple[str, ...] = ()) -> dict[str, Any] | None:
    """The warm interpreter: listen, import ``modules`` and ``own`` (nano-patch's modules a rank imports when it
    patches, named by the entry point) and then each name the launching process sends on stdin,
    and fork one rank per request. Returns the request in each forked rank (its process set up as the request says);
    returns None in the warm interpreter when it is done (stdin closed or SIGTERM, and no rank of its running)."""
    import threading

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    imported = _import([*modules, *own], path, 0.0)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda sig, frame: stopping.append(sig))
    running: dict[int, socket.socket | None] = {}  # rank pid -> its rank entry's connection (None: gone)
    pending = b""
    orders: int | None = 0  # stdin: names to import; closed when the launching process stops or ends
    while True:
        # A fork copies only the forking thread: an import that started a Python thread leaves this one idle.
        # (Native pools that imports start, such as OpenBLAS's, wait idle and handle fork themselves.)
        if listener.fileno() >= 0 and (stopping or orders is None or threading.active_count() > 1):
            listener.close()  # no more ranks; the running ones are still watched
        if listener.fileno() < 0 and not running:
            return None
        waiting: list[Any] = [c for c in running.values() if c is not None]
        if listener.fileno() >= 0:
            waiting.append(listener)
        if orders is not None:
            waiting.append(orders)
        try:
            ready, _, _ = select.select(waiting, [], [], 0.1)
        except InterruptedError:
            ready = []
        for source in ready:
            if source is listener:
                request = _take(listener, running)
                if request is not None:
                    return request  # in the forked rank
            elif isinstance(source, int):  # the orders on stdin
                chunk = os.read(0, 4096)
                if not chunk:
                    orders = None
                    continue
                pending += chunk
                *names, rest = pending.split(b"\n")
                pending = rest
                imported = _import([n.decode() for n in names if n], path, imported)
            else:  # its rank entry ended (killed): the rank must not run on unwatched
                pid = next(p for p, c in running.items() if c is source)
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                source.close()
                running[pid] = None  # reaped below once it is gone
        _reap(running)


def _import(names: list[str], path: str, seconds: float) -> float:
    """Import ``names`` (errors ignored: the rank meets them itself); record the import time so far."""
    start = time.perf_counter()
    for name in names:
        with contextlib.suppress(BaseException):
            importlib.import_module(name)
    seconds += time.perf_counter() - start
    folder = os.path.dirname(path)
    with open(os.path.join(folder, "ready.tmp"), "w") as f:
        f.write(f"{seconds:.3f}")
    os.replace(os.path.join(folder, "ready.tmp"), os.path.join(folder, "ready"))
    return seconds


def _take(listener: socket.socket, running: dict[int, socket.socket | None]) -> dict[str, Any] | None:
    """Accept one rank entry and fork its rank; in the fork, return the request (set up); else None."""
    conn, _ = listener.accept()
    fds: list[int] = []
    try:
        conn.settimeout(10.0)
        _send(conn, b"ready")
        body, fds = _recv(conn, 3)
        request = json.loads(body)
        if len(fds) != 3:
            raise ValueError("expected the three standard streams")
        conn.settimeout(None)
    except (OSError, ValueError, ConnectionError):
        conn.close()
        for fd in fds:
            os.close(fd)
        return None
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in running.values():
            if other is not None:
                other.close()
        conn.close()
        _become(request, fds)
        return request
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):
        _send(conn, str(pid).encode())
    running[pid] = conn
    return None


def _reap(running: dict[int, socket.socket | None]) -> None:
    while running:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        message = f"signal {-code}" if code < 0 else f"exit {code}"
        with contextlib.suppress(OSError):
            _send(conn, message.encode())
        conn.close()


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked rank: take on the rank entry's streams, environment and working directory, as a fresh
    interpreter started with them would have them."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for name in ("SIGTERM", "SIGINT", "SIGPIPE"):
        sig = getattr(signal, name)
        signal.signal(sig, signal.default_int_handler if name == "SIGINT" else
                      (signal.SIG_IGN if name == "SIGPIPE" else signal.SIG_DFL))  # CPython's own settings
    os.chdir(request["cwd"])
    if sys.path:
        sys.path[0] = request["cwd"]  # as `python -m` sets it; a script's own folder replaces it (the rank entry)
    os.environ.clear()
    os.environ.update(request["env"])
    _reopen_stdio()
    numpy = sys.modules.get("numpy")
    if numpy is not None:  # a fresh interpreter seeds NumPy's global generator from the OS at import
        with contextlib.suppress(Exception):
            numpy.random.seed()
    _reread_rank_zero()


def _reopen_stdio() -> None:
    """sys.stdin/stdout/stderr on descriptors 0, 1 and 2, buffered as CPython buffers them at start-up for those
    files (line-buffered on a terminal, stderr always; ``PYTHONUNBUFFERED`` honoured)."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        try:
            tty = os.isatty(fd)
            if fd == 0:
                raw: Any = io.FileIO(fd, "rb", closefd=False)
                buffer: Any = io.BufferedReader(raw)
            else:
                raw = io.FileIO(fd, "wb", closefd=False)
                buffer = raw if unbuffered else io.BufferedWriter(raw)
            stream = io.TextIOWrapper(buffer, encoding=getattr(old, "encoding", None),
                                      errors=getattr(old, "errors", None), newline=None if fd == 0 else "\n",
                                      line_buffering=fd != 0 and (tty or fd == 2), write_through=unbuffered)
        except (OSError, ValueError):
            continue
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reread_rank_zero() -> None:
    """Lightning reads the process's rank into ``rank_zero_only.rank`` at import: read it again from the rank's
    environment, as its import in a fresh interpreter would have."""
    for name in ("lightning_utilities.core.rank_zero", "lightning_fabric.utilities.rank_zero",
                 "pytorch_lightning.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                 "lightning.pytorch.utilities.rank_zero"):
        mod = sys.modules.get(name)
        if mod is None:
            continue
        fn, get_rank = getattr(mod, "rank_zero_only", None), getattr(mod, "_get_rank", None)
        if fn is not None and get_rank is not None:
            with contextlib.suppress(Exception):
                fn.rank = get_rank() or 0
