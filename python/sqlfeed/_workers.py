"""Worker processes for Python functions with ``concurrency=N``.

::

    engine thread ─► WorkerPool.call(table) ─► an idle worker (queue, GIL released)
                       │ Arrow IPC of the arguments ─► request segment (shared memory)
                       │ ("call", segment, size, rows, seed) ─────► pipe ─► worker
                       │                                        apply(fn, table)
                       │ ◄── ("ok", segment, size) ◄── pipe ◄── IPC ─► response segment
                       ▼
                     result table (copied out of the segment, which the worker reuses)

Each worker has one request segment (created and resized by this process)
and one response segment (created and resized by the worker); each is
unlinked by its creator. The parent waits on the pipe with the GIL released,
so as many engine threads as workers run at once.

A worker is handed the function pickled (by module and name) and imports it
first thing, answering ``("ready",)`` or ``("cannot-import", why)``: a
function defined where a spawned process cannot find it (``python -c``, a
notebook) is refused with what to do instead of looking like a dead worker.
An exception the function raises travels back pickled (with its traceback
as text) and is raised again here as itself.

A worker ignores SIGINT (Ctrl-C is the training process's to handle) and
exits when its pipe closes, when the pool closes it (at exit, within a
second: stop, then SIGTERM, then SIGKILL) or when its parent process is
gone. A worker that dies mid-batch (a segfault, the OOM killer) makes that
call fail with an error saying how it died; the next call starts a new one.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import threading
import traceback
from multiprocessing import shared_memory
from typing import Any

from sqlfeed.functions import FunctionFailed, FunctionSpec, add_note, apply

#: Smallest shared-memory segment (bytes); segments grow to the largest batch.
MIN_SEGMENT_BYTES = 1 << 20
#: Seconds a closing worker gets to stop by itself, then after SIGTERM.
STOP_GRACE_S = 0.5


class WorkerDied(Exception):
    """The worker process ended while it held a batch."""


def _attach(name: str) -> shared_memory.SharedMemory:
    """Opens the other side's segment. Workers are spawned, so they share
    this process's resource tracker: attaching registers a name already
    registered, and the creator's unlink unregisters it once."""
    return shared_memory.SharedMemory(name=name)


def _close(segment: shared_memory.SharedMemory | None, unlink: bool) -> None:
    if segment is None:
        return
    try:
        segment.close()
    except BufferError:
        # An Arrow buffer still views it; the mapping goes with the process.
        pass
    if unlink:
        try:
            segment.unlink()
        except FileNotFoundError:
            pass


def _ipc_size(table: Any) -> int:
    import pyarrow as pa

    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.size()


def _write_ipc(table: Any, segment: shared_memory.SharedMemory) -> None:
    import pyarrow as pa

    sink = pa.FixedSizeBufferWriter(pa.py_buffer(segment.buf))
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (killed: out of memory?)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit status {code}"


class _Worker:
    """One worker process and its segments."""

    def __init__(self, context: Any, spec: FunctionSpec, index: int) -> None:
        parent, child = context.Pipe()
        self.process = context.Process(
            target=_worker_main,
            # Pickled here, unpickled in the worker's own code: a function it
            # cannot import is then an answer, not a crash in bootstrap.
            args=(child, pickle.dumps(spec), os.getpid()),
            name=f"sqlfeed-{spec.name}-{index}",
            daemon=True,
        )
        self.process.start()
        child.close()
        self.conn = parent
        self.request: shared_memory.SharedMemory | None = None
        self.response: shared_memory.SharedMemory | None = None
        self.broken = False
        try:
            hello = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.close()
            raise WorkerDied(
                f"{_describe_exit(self.process.exitcode)} while starting; pid {self.process.pid}"
            ) from exc
        if hello[0] == "cannot-import":
            self.close()
            raise FunctionFailed(
                f"worker processes cannot import Python function '{spec.name}' "
                f"({spec.qualname}): {hello[1]}. A worker is a new Python process that "
                "imports the function by its module and name, so a function defined in "
                "`python -c`, a notebook or an interactive session cannot reach it: define "
                "it in a module (a .py file the workers can import), or use concurrency=1"
            )

    def call(self, table: Any, num_rows: int, seed: int | None) -> Any:
        import pyarrow as pa

        size = _ipc_size(table)
        if self.request is None or self.request.size < size:
            _close(self.request, unlink=True)
            self.request = shared_memory.SharedMemory(
                create=True, size=max(MIN_SEGMENT_BYTES, size + size // 2)
            )
        _write_ipc(table, self.request)
        try:
            self.conn.send(("call", self.request.name, size, num_rows, seed))
            reply = self.conn.recv()
        except (EOFError, OSError) as exc:
            self.process.join(timeout=1.0)
            raise WorkerDied(
                f"{_describe_exit(self.process.exitcode)}; pid {self.process.pid}"
            ) from exc
        except BaseException:
            # Interrupted between request and reply (KeyboardInterrupt): the
            # reply would be read as the next call's. Never reuse it.
            self.broken = True
            raise
        if reply[0] == "error":
            raise FunctionFailed(f"{reply[1]}\n(in worker process {self.process.pid})")
        if reply[0] == "raised":
            _, payload, text = reply
            where = f"in worker process {self.process.pid}, whose traceback was:\n{text}"
            try:
                raised = pickle.loads(payload) if payload is not None else None
            except Exception:
                raised = None
            if not isinstance(raised, BaseException):
                raise FunctionFailed(f"{text}\n({where})")
            add_note(raised, where)
            raise raised
        _, name, out_size = reply
        if self.response is None or self.response.name != name:
            _close(self.response, unlink=False)
            self.response = _attach(name)
        # A copy: the worker writes its next result into the same segment.
        data = bytes(self.response.buf[:out_size])
        return pa.ipc.open_stream(data).read_all()

    def close(self) -> None:
        try:
            self.conn.send(("stop",))
        except (OSError, ValueError):
            pass
        self.process.join(timeout=STOP_GRACE_S)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=STOP_GRACE_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=STOP_GRACE_S)
        self.conn.close()
        _close(self.response, unlink=False)
        _close(self.request, unlink=True)
        self.response = self.request = None


class WorkerPool:
    """``concurrency`` worker processes running one function."""

    def __init__(self, spec: FunctionSpec, concurrency: int) -> None:
        try:
            pickle.dumps(spec)
        except Exception as exc:
            raise FunctionFailed(
                f"Python function '{spec.name}' ({spec.qualname}) cannot be sent to "
                f"worker processes (concurrency={concurrency}): {exc}. Worker processes "
                "import the function by its module and name: define it with a "
                "module-level def (in a script, start the work under "
                "if __name__ == '__main__':), or use concurrency=1"
            ) from None
        self.spec = spec
        self.concurrency = concurrency
        self._context = multiprocessing.get_context("spawn")
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        for _ in range(concurrency):
            self._idle.put(None)  # a slot whose worker starts on first use

    def call(self, table: Any, num_rows: int, seed: int | None) -> Any:
        worker = self._idle.get()
        try:
            if self._closed:
                raise FunctionFailed(f"Python function '{self.spec.name}': its pool is closed")
            if worker is None:
                worker = self._start()
            return worker.call(table, num_rows, seed)
        except WorkerDied as died:
            self._forget(worker)
            worker = None
            raise FunctionFailed(
                f"a worker process of Python function '{self.spec.name}' "
                f"({self.spec.qualname}) died while running a batch of {num_rows} rows: "
                f"{died}. If it was killed, it likely ran out of memory: lower "
                "concurrency or the batch size"
            ) from None
        except BaseException:
            if worker is not None and worker.broken:
                self._forget(worker)
                worker = None
            raise
        finally:
            self._idle.put(worker)

    def _start(self) -> _Worker:
        with self._lock:
            worker = _Worker(self._context, self.spec, len(self._workers))
            self._workers.append(worker)
            return worker

    def _forget(self, worker: _Worker | None) -> None:
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
        if worker is not None:
            worker.close()

    def pids(self) -> list[int]:
        """Process ids of the running workers."""
        with self._lock:
            return [w.process.pid for w in self._workers if w.process.pid is not None]

    def close(self) -> None:
        """Stops every worker (within about a second)."""
        self._closed = True
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.close()


def _watch_parent(parent_pid: int) -> None:
    """Ends this worker when its parent is gone (killed without closing)."""
    import time

    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(0)


def _worker_main(conn: Any, pickled_spec: bytes, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
    try:
        spec = pickle.loads(pickled_spec)
    except Exception as exc:
        conn.send(("cannot-import", f"{type(exc).__name__}: {exc}"))
        conn.close()
        return
    conn.send(("ready",))
    import pyarrow as pa

    request: shared_memory.SharedMemory | None = None
    response: shared_memory.SharedMemory | None = None
    try:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] != "call":
                break
            _, name, size, num_rows, seed = message
            try:
                if request is None or request.name != name:
                    _close(request, unlink=False)
                    request = _attach(name)
                view = request.buf[:size]
                table = pa.ipc.open_stream(pa.py_buffer(view)).read_all()
                out = apply(spec, table, num_rows, seed)
                del table, view  # the next request may resize the segment
                out_size = _ipc_size(out)
                if response is None or response.size < out_size:
                    _close(response, unlink=True)
                    response = shared_memory.SharedMemory(
                        create=True, size=max(MIN_SEGMENT_BYTES, out_size + out_size // 2)
                    )
                _write_ipc(out, response)
                del out
                conn.send(("ok", response.name, out_size))
            except FunctionFailed as failed:
                conn.send(("error", str(failed)))
            except Exception as exc:
                text = "".join(traceback.format_exception(exc)).rstrip()
                try:
                    payload: bytes | None = pickle.dumps(exc)
                except Exception:
                    payload = None
                conn.send(("raised", payload, text))
    finally:
        _close(request, unlink=False)
        _close(response, unlink=True)
