"""Stand-in workers: the worker processes a virtual-worker iterator (``virtual_workers.py``) starts only where a batch
needs stock's own code.

A virtual worker's fast path takes only what it can prove stock's. A batch it cannot (a file PIL must decode or warn
about, a draw the draw program gives back, a render that fails, an error stock raises at sample k) is loaded by a
stand-in for that worker: a process that is worker ``k`` as stock would have started it, running stock's fetch.

- **Started with the iterator, as stock starts its workers.** :class:`StandIns` forks one idle process, the
  *template*, from the thread that starts the iterator, at the moment stock forks its workers. It freezes what a
  forked worker freezes: torch's default dtype and grad modes, PIL's flags, the working directory, the warning
  filters, the dataset snapshot. Worker ``k``'s stand-in is forked from the template the first time stream ``k``
  needs one, and then serves every later batch of that stream for the iterator's life, as worker ``k`` would: one
  process per worker, so each warns as one stock worker does (once per message and place). The template is
  single-threaded, so nothing is forked from a thread in the middle of a training step.
- **Each batch is a request:** the stream's generator states (torch, ``random``, NumPy) go in, the batch (or the
  error, wrapped as stock's worker wraps it) and the states after it come back; the stream continues from them.
- **Nothing waits forever and nothing is left behind.** The template and the stand-ins watch their parent (its
  pid, once a second, as stock's workers' ``ManagerWatchdog``) and their socket, and exit when either goes; the
  template ends its stand-ins when it ends. A stand-in that dies surfaces as stock's "DataLoader worker (pid(s) ...)
  exited unexpectedly", raised at the batch.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any

from ..batches import generator_states

#: How often (seconds) a waiting process checks that its parent lives (stock's MP_STATUS_CHECK_INTERVAL is 5).
WATCH_INTERVAL = 1.0
_PID = struct.Struct("!q")
#: what the main process sends the template to end it (a worker's id is never negative)
_STOP = -1


@dataclass
class Loaded:
    """A stand-in's batch (or a ``torch._utils.ExceptionWrapper``) and the worker's generator states after it."""

    data: Any
    torch_state: Any
    random_state: Any
    numpy_state: Any


class WorkerDied(RuntimeError):
    """A stand-in exited while it held a batch: raised at that batch as stock raises a dead worker's."""


@dataclass
class _Batch:
    """What a stand-in needs for one batch: the indices and the stream's generator states."""

    indices: list[Any]
    torch_state: Any
    random_state: Any
    numpy_state: Any
    uint8: bool


class StandIns:
    """The stand-in processes of one iterator: the template, forked now, and worker ``k``'s stand-in, forked from it
    on first use. ``dataset``: the snapshot stock's fetch loads from."""

    def __init__(self, dataset: Any, num_workers: int, base_seed: int, collate_fn: Any, drop_last: bool,
                 fresh_context: Any = None) -> None:
        import multiprocessing

        import torch.multiprocessing  # noqa: F401 - its reductions: the batch's tensors cross as shared memory

        self._lock = threading.Lock()
        self._workers: dict[int, tuple[int, Any, threading.Lock]] = {}
        self._closed = False
        self._started = 0
        #: under forkserver or spawn: the context that starts each stand-in as a fresh interpreter, as stock's
        #: workers start (nothing is forked from this process: a fresh worker freezes nothing of it)
        self._fresh = fresh_context
        self._args = (dataset, num_workers, base_seed, collate_fn, drop_last)
        self._procs: list[Any] = []
        if fresh_context is not None:
            self._template = None
            return
        mine, theirs = socket.socketpair()
        self._control = mine
        # (a process forked from the main thread may die with its parent's death signal; from another thread, the
        # signal would come when that thread ends: it then watches the parent's pid alone)
        main_thread = threading.current_thread() is threading.main_thread()
        self._template = multiprocessing.get_context("fork").Process(
            target=_template, name="nano-patch-stand-in-template", daemon=True,
            args=(theirs, mine, os.getpid(), main_thread, dataset, num_workers, base_seed, collate_fn, drop_last))
        self._template.start()
        theirs.close()

    def load(self, worker_id: int, indices: list[Any], torch_state: Any, random_state: Any, numpy_state: Any,
             uint8: bool) -> Loaded:
        """Worker ``worker_id``'s batch of ``indices`` by stock's code, its generators at the given states. One call
        per worker at a time (a stream's batches are loaded in its order)."""
        pid, conn, busy = self._worker(worker_id)
        with busy:
            try:
                conn.send(_Batch(list(indices), torch_state, random_state, numpy_state, uint8))
                while not conn.poll(WATCH_INTERVAL):
                    if self._closed:
                        raise WorkerDied(f"DataLoader worker (pid(s) {pid}) exited unexpectedly")
                got = conn.recv()
            except (EOFError, OSError):
                raise WorkerDied(f"DataLoader worker (pid(s) {pid}) exited unexpectedly") from None
        return Loaded(*got)

    def _worker(self, worker_id: int) -> tuple[int, Any, threading.Lock]:
        with self._lock:
            found = self._workers.get(worker_id)
            if found is not None:
                return found
            if self._closed:
                raise WorkerDied("DataLoader worker (pid(s) ) exited unexpectedly: the iterator was shut down")
            found = self._start_fresh(worker_id) if self._fresh is not None else self._fork(worker_id)
            self._workers[worker_id] = found
            self._started += 1
            return found

    def _start_fresh(self, worker_id: int) -> tuple[int, Any, threading.Lock]:
        """Worker ``worker_id``'s stand-in as a fresh interpreter of the loader's start method (the dataset crosses
        as a pickle, the main module is imported as ``__mp_main__``: stock's worker start)."""
        mine, theirs = self._fresh.Pipe()
        proc = self._fresh.Process(target=_fresh_stand_in, name=f"nano-patch-stand-in-{worker_id}", daemon=True,
                                   args=(theirs, worker_id, *self._args))
        try:
            proc.start()
        except Exception as exc:  # noqa: BLE001 - (the dataset pickled when the iterator started)
            raise WorkerDied(f"DataLoader worker (pid(s) {proc.pid}) exited unexpectedly: {exc}") from None
        finally:
            theirs.close()
        self._procs.append(proc)
        return proc.pid, mine, threading.Lock()

    def _fork(self, worker_id: int) -> tuple[int, Any, threading.Lock]:
        """Worker ``worker_id``'s stand-in, forked by the template."""
        from multiprocessing.connection import Connection

        try:
            self._control.sendall(_PID.pack(worker_id))
            ready, _, _ = select.select([self._control], [], [], 60.0)
            if not ready:
                raise OSError("no answer")
            msg, fds, _, _ = socket.recv_fds(self._control, _PID.size, 1)
        except OSError:
            raise WorkerDied(f"DataLoader worker (pid(s) {self._template.pid}) exited unexpectedly") from None
        if len(msg) != _PID.size or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise WorkerDied(f"DataLoader worker (pid(s) {self._template.pid}) exited unexpectedly")
        return _PID.unpack(msg)[0], Connection(fds[0]), threading.Lock()

    @property
    def started(self) -> int:
        """How many stand-ins were started (the template not counted)."""
        return self._started

    def close(self, wait: bool = True) -> None:
        """End the template and the stand-ins (idempotent); ``wait``: reap the template (briefly)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers, self._workers = list(self._workers.values()), {}
        for _, conn, _ in workers:
            with contextlib.suppress(OSError):
                conn.close()  # (a stand-in sees the end of its connection and exits)
        if self._template is None:
            for proc in self._procs:
                proc.join(timeout=WATCH_INTERVAL if wait else 0)
                if proc.is_alive():
                    proc.kill()
                    proc.join(timeout=WATCH_INTERVAL if wait else 0)
            return
        with contextlib.suppress(OSError):
            # said, not only closed: a process forked since holds a copy of this end, so the template might never
            # see it close (it would still see this process go)
            self._control.sendall(_PID.pack(_STOP))
        with contextlib.suppress(OSError):
            self._control.close()  # the template ends its stand-ins, then itself
        if wait:
            self._template.join(timeout=2 * WATCH_INTERVAL)
            if self._template.is_alive():
                self._template.kill()
                self._template.join(timeout=WATCH_INTERVAL)


def _parent_gone(parent: int) -> bool:
    return os.getppid() != parent


def _die_with(parent: int) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux's ``PR_SET_PDEATHSIG``; elsewhere the pid
    watch alone), and exit now where the parent is already gone."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if _parent_gone(parent):
        os._exit(0)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)  # (the ``finally`` that ends the stand-ins runs)


def _template(control: socket.socket, main_end: socket.socket, main_pid: int, main_thread: bool, dataset: Any,
              num_workers: int, base_seed: int, collate_fn: Any, drop_last: bool) -> None:
    """The template process: forks worker ``k``'s stand-in on request and hands its socket to the main process."""
    main_end.close()
    if main_thread:
        _die_with(main_pid)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # (its stand-ins are reaped as they exit)
    children: list[int] = []
    try:
        while not _parent_gone(main_pid):
            ready, _, _ = select.select([control], [], [], WATCH_INTERVAL)
            if not ready:
                continue
            msg = control.recv(_PID.size)
            if len(msg) != _PID.size:
                return  # the iterator is done with its stand-ins
            worker_id = _PID.unpack(msg)[0]
            if worker_id == _STOP:
                return
            ours, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:  # worker ``worker_id``'s stand-in
                code = 1
                try:
                    import multiprocessing.util

                    _die_with(os.getppid())
                    multiprocessing.util._run_after_forkers()  # (as a forked Process: the resource sharer afresh)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    control.close()
                    ours.close()
                    from multiprocessing.connection import Connection

                    code = _stand_in(Connection(theirs.detach()), os.getppid(), dataset, worker_id, num_workers,
                                     base_seed, collate_fn, drop_last)
                finally:
                    os._exit(code)
            children.append(pid)
            theirs.close()
            socket.send_fds(control, [_PID.pack(pid)], [ours.fileno()])
            ours.close()
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _fresh_stand_in(conn: Any, worker_id: int, dataset: Any, num_workers: int, base_seed: int, collate_fn: Any,
                    drop_last: bool) -> None:
    """A stand-in started as a fresh interpreter (forkserver, spawn): its parent is the one that started it."""
    parent = os.getppid()
    _die_with(parent)
    code = _stand_in(conn, parent, dataset, worker_id, num_workers, base_seed, collate_fn, drop_last)
    if code:
        raise SystemExit(code)


def _stand_in(conn: Any, parent: int, dataset: Any, worker_id: int, num_workers: int, base_seed: int,
              collate_fn: Any, drop_last: bool) -> int:
    """Worker ``worker_id``'s stand-in: stock's ``_worker_loop`` set-up, then its fetch of each batch it is sent,
    while ``parent`` lives."""
    import torch
    from torch._utils import ExceptionWrapper
    from torch.utils.data import _DatasetKind
    from torch.utils.data._utils import signal_handling, worker

    signal_handling._set_worker_signal_handlers()
    torch.multiprocessing._set_thread_name("pt_data_worker")
    torch.set_num_threads(1)
    worker._worker_info = worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=base_seed + worker_id,
                                            dataset=dataset)
    fetcher = None
    while True:
        while not conn.poll(WATCH_INTERVAL):
            if _parent_gone(parent):
                return 0
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return 0
        generator_states.put_back((batch.torch_state, batch.random_state, batch.numpy_state))
        try:
            if fetcher is None:
                fetcher = _DatasetKind.create_fetcher(_DatasetKind.Map, dataset, True, collate_fn, drop_last)
            with _uint8(dataset) if batch.uint8 else contextlib.nullcontext():
                data = fetcher.fetch(batch.indices)
        except Exception:  # noqa: BLE001 - stock's worker sends its error, wrapped, to be raised at the batch
            data = ExceptionWrapper(where=f"in DataLoader worker process {worker_id}")
        try:
            after = generator_states.take()
            conn.send((data, after[0], after[1], after[2] if batch.numpy_state is not None else None))
        except (OSError, EOFError):
            return 0
        del data


def _uint8(dataset: Any) -> Any:
    """While this runs, the dataset's Compose stops before its tail (the device finishes the batch), as the fast path
    stops it for the same iterator (a persistent iterator may switch between epochs)."""
    from ...vision.plans import compose_call
    from ..tail.uint8_batches import register_collate, uint8_transform

    found = uint8_transform(dataset)
    if found is None:
        return contextlib.nullcontext()
    if found[1].erasers:
        register_collate()
    return compose_call.uint8_here(found[0])
