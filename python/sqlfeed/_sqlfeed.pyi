"""Type stubs of the extension module ``sqlfeed._sqlfeed`` (Rust, pyo3).

Use the documented wrappers in :mod:`sqlfeed` (``Session``, ``SqlResult``,
``Feed``); the classes here are what they hold, and what ``format="dlpack"``
feeds yield (:class:`Tensor`).
"""

import os
from collections.abc import Callable
from typing import Any, TypedDict

__version__: str

class Error(Exception):
    """Base class of sqlfeed's errors; the message is the Rust message."""

class PlanError(Error):
    """The SQL or an option is wrong (a bad column, a syntax error, an impossible setting)."""

class ExecutionError(Error):
    """The data could not be processed (a corrupt file, a bad value in a row)."""

class ResourcesExhausted(Error):
    """The memory budget (memory_limit) does not fit the work, e.g. too many held batches."""

class InternalError(Error):
    """A bug in sqlfeed; the message says what failed."""

def cuda_device_count() -> int:
    """The number of usable CUDA devices (0 without a driver)."""

def executor_options(argv: list[str]) -> dict[str, Any]:
    """Of the executor command line ``argv`` (program name first): its
    ``function_dirs`` and ``task_slots`` (``--concurrent-tasks``, else the
    cores); ValueError with the CLI's message if it is not one."""

def serve_executor(argv: list[str], functions: list[dict[str, Any]]) -> int:
    """Runs the executor ``argv`` describes, hosting ``functions``
    (``Function._declaration()``), until stopped; returns the exit status."""

def generate(
    out: str | os.PathLike[str],
    rows: int,
    *,
    files: int = 4,
    seed: int = 42,
    image_size: int = 32,
) -> tuple[int, int]:
    """Writes ``rows`` rows of the synthetic training set of ``sqlfeed gen``
    (ids, features, labels, PNG/JPEG images, token lists) as ``files``
    Parquet files into ``out``; returns ``(rows, bytes)``."""

def raw_h2d_bytes_per_s(device: str, sizes: list[int], iters: int) -> float:
    """Bytes/s of raw pinned host-to-device copies on ``device`` (``cuda:N``):
    ``iters`` rounds of one copy per size; the yardstick for a feed's H2D."""

def query_fingerprint(sql: str) -> str:
    """The short sha-256 of a feed's SQL that its checkpoints record."""

def prometheus_text(
    *,
    rows: int,
    batches: int,
    bytes: int,
    wall_s: float,
    wait_s: float,
    h2d_s: float,
    prefetch: int,
    epoch: int,
    step: int,
    labels: list[tuple[str, str]],
) -> str:
    """A feed's running totals with the next batch's ``epoch`` and ``step``
    in Prometheus' text format, every sample labelled with ``labels``: the
    formatter of the CLI's ``--prometheus``. A bad label name raises
    :class:`PlanError`."""

def write_whole(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` whole (a temporary file renamed over it)
    with the mode a plain ``open()`` gives under the umask; ``OSError`` if it
    cannot."""

class FunctionSpec(TypedDict):
    """What ``sqlfeed.functions`` registers a Python function with."""

    name: str
    invoke: Callable[[object, int, int | None], object]
    returns: object
    inputs: object | None
    arg_count: int | None
    volatility: str
    identity: str
    costly: bool
    qualname: str
    seed: int | None

class Session:
    def __init__(
        self,
        memory_limit: int | str | None = None,
        target_partitions: int | None = None,
        cache_dir: str | None = None,
        cluster: str | None = None,
        spill_dir: str | None = None,
        batch_size: int | None = None,
        allow_http: bool | None = None,
        plugins: list[str] = ...,
        functions: list[dict[str, Any]] = ...,
    ) -> None: ...
    def sql(self, query: str) -> SqlResult: ...
    def _register_function(self, spec: FunctionSpec) -> None: ...
    def _start_feed(self, options: dict[str, Any]) -> RawFeed: ...
    def _start_position(self, options: dict[str, Any], listed: bool) -> FeedPosition: ...
    def _resume(self, options: dict[str, Any], state: str, on_data_change: str) -> FeedPosition: ...
    def _explain_batch(
        self, options: dict[str, Any], epoch: int, step: int
    ) -> list[tuple[str, int, int]]: ...
    def _dataset(self, options: dict[str, Any], epoch: int) -> EpochDataset: ...
    def _quarantine_origins(
        self, options: dict[str, Any], rows: list[tuple[int, int, str, str, str]]
    ) -> list[tuple[int, int, tuple[str, int, int] | None]]: ...
    @property
    def memory_limit(self) -> int: ...
    @property
    def spill_folder(self) -> str: ...

class EpochDataset:
    @property
    def epoch(self) -> int: ...
    def __len__(self) -> int: ...
    def window_rows(self) -> list[int]: ...
    def _row(self, position: int) -> SqlResult: ...
    def _rows(self, positions: list[int]) -> SqlResult: ...

class SqlResult:
    def __arrow_c_stream__(self, requested_schema: object | None = None) -> object:
        """An ``arrow_array_stream`` PyCapsule over the rows."""
    def _collect_stream(self) -> object: ...
    @property
    def columns(self) -> list[str]: ...
    def explain(self) -> str: ...

class RawFeed:
    """One running pass of a feed: iterating yields :class:`Batch`."""

    def __iter__(self) -> RawFeed: ...
    def __next__(self) -> Batch: ...
    def _next_dict(
        self,
        importer: Callable[[object], object],
        by_capsule: bool,
        host_only: bool,
        stream: Callable[[int], int] | None = None,
    ) -> dict[str, Any] | None: ...
    def _position(self) -> FeedPosition: ...
    def _quarantined(self) -> list[tuple[int, int, str, str, str]]: ...
    def _timeline(self) -> tuple[str, str]: ...
    def close(self) -> None: ...
    @property
    def running(self) -> bool: ...
    def report(self) -> dict[str, Any]: ...

class FeedPosition:
    """Where a feed is: the Rust checkpoint, whose rules move, resume and
    skip it (``Feed.state_dict()`` is its JSON)."""

    @property
    def epoch(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def rows(self) -> int | None: ...
    @property
    def listed(self) -> bool: ...
    @property
    def quarantined(self) -> list[tuple[int, int, str, str, str]]: ...
    def at_epoch_start(self, epoch: int) -> FeedPosition: ...
    def skipping(self, epoch: int, steps: list[int]) -> FeedPosition: ...
    def to_json(self) -> str: ...

class Batch:
    """A batch's tensors by name, and where it sits in the feed."""

    @property
    def epoch(self) -> int: ...
    @property
    def step(self) -> int: ...
    @property
    def rows(self) -> int: ...
    @property
    def last_in_epoch(self) -> bool: ...
    @property
    def next_position(self) -> tuple[int, int]: ...
    @property
    def next_row_position(self) -> tuple[int, int]: ...
    def keys(self) -> list[str]: ...
    def tensors(self) -> list[Tensor]: ...
    def __getitem__(self, name: str) -> Tensor: ...
    def __len__(self) -> int: ...
    def use_on_stream(self, stream: object) -> None:
        """The batch's tensors are read on CUDA stream ``stream``: see
        :meth:`Tensor.use_on_stream`."""

class Tensor:
    """A DLPack producer over the feed's memory (no copy); pass it to
    ``torch.from_dlpack``, ``numpy.from_dlpack`` or ``jax.dlpack.from_dlpack``."""

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...
    def use_on_stream(self, stream: object) -> None:
        """This tensor (and its batch) is read on CUDA stream ``stream`` (a
        ``torch.cuda.Stream``, a CuPy stream, or a raw handle: 0/1 legacy
        default, 2 per-thread): ``stream`` waits for the batch's copies, and
        the memory is reused only after the work queued on it before the
        batch's release. A no-op on the CPU."""
    @property
    def name(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    @property
    def shape(self) -> list[int]: ...
    @property
    def device(self) -> str: ...
    @property
    def data_ptr(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def to_bytes(self) -> bytes: ...
