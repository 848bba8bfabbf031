"""Sessions and SQL results."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from sqlfeed import _sqlfeed

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pyarrow

    from sqlfeed.feed import Feed
    from sqlfeed.functions import Function


class Session:
    """A sqlfeed session: one memory budget, a spill folder, the epoch cache,
    object stores and sqlfeed's SQL functions.

    Args:
        memory_limit: bytes, or text such as ``"4G"``, ``"512M"``, ``"25%"``.
            Default: half of RAM, or of the container's cgroup limit if lower.
            Sorts, shuffles and joins spill to disk beyond it.
        target_partitions: parallelism of queries (default: the core count).
            Feeds' batches never depend on it.
        cache_dir: the epoch cache's folder (default ``$SQLFEED_CACHE_DIR`` or
            ``~/.cache/sqlfeed``).
        cluster: ``"df://host:port"`` of a Ballista scheduler started with
            ``sqlfeed scheduler``, or ``"standalone"``; None runs embedded.
        spill_dir: where spill files go (default: the OS temp folder).
        batch_size: rows per record batch inside the engine (default 8192).
        allow_http: read plain ``http://`` object-store URLs (and ``http://``
            endpoints of S3, GCS, Azure). Refused by default, with an error
            naming the URL, since what travels unencrypted can be altered on
            the way. None: ``$SQLFEED_ALLOW_HTTP=1`` allows it.
        plugins: paths of Rust function plugins (``cdylib`` libraries built
            with ``sqlfeed-plugin``, see ``examples/udf-plugin``) whose
            functions SQL can call.
        functions: Python functions made with :func:`sqlfeed.udf` or
            :func:`sqlfeed.batch_udf`, part of the session from the start
            (as :meth:`register` adds one later). With
            ``cluster="standalone"`` its executor, in this process, runs
            them; a cluster's own executors run the functions of their
            ``--function-dir``.
    """

    def __init__(
        self,
        memory_limit: int | str | None = None,
        target_partitions: int | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cluster: str | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
        batch_size: int | None = None,
        allow_http: bool | None = None,
        plugins: Sequence[str | os.PathLike[str]] = (),
        functions: Sequence[Function] = (),
    ) -> None:
        from sqlfeed.functions import Function

        for function in functions:
            if not isinstance(function, Function):
                raise TypeError(
                    "functions= takes functions made with @sqlfeed.udf(...) or "
                    f"@sqlfeed.batch_udf(...), not {function!r}"
                )
        self._inner = _sqlfeed.Session(
            memory_limit=memory_limit,
            target_partitions=target_partitions,
            cache_dir=None if cache_dir is None else os.fspath(cache_dir),
            cluster=cluster,
            spill_dir=None if spill_dir is None else os.fspath(spill_dir),
            batch_size=batch_size,
            allow_http=allow_http,
            plugins=[os.fspath(p) for p in plugins],
            # Part of the session from its build (also hosted by the executor
            # of cluster="standalone", which runs in this process).
            functions=[function._declaration() for function in functions],
        )

    def register(self, function: Function) -> None:
        """Makes a Python function (from :func:`sqlfeed.udf` or
        :func:`sqlfeed.batch_udf`) callable in this session's SQL under its
        name; registering a function of the same name again replaces it.
        Raises :class:`sqlfeed.PlanError` if the name is one of sqlfeed's or a
        plugin's functions."""
        from sqlfeed.functions import Function

        if not isinstance(function, Function):
            raise TypeError(
                "register() takes a function made with @sqlfeed.udf(...) or "
                f"@sqlfeed.batch_udf(...), not {function!r}"
            )
        function._register(self._inner)

    def sql(self, query: str) -> SqlResult:
        """Plans one statement of sqlfeed SQL (DataFusion SQL plus ``SHUFFLE``,
        ``SAMPLE``, ``SUMMARIZE``, ``DESCRIBE '<path>'``, ``CACHE TABLE`` …).

        Nothing runs until the result is read. Raises :class:`sqlfeed.PlanError`
        for bad SQL, naming what is wrong.
        """
        return SqlResult(self._inner.sql(query))

    def feed(self, query: str, **options: Any) -> Feed:
        """A training feed of ``query``; see :class:`sqlfeed.Feed` for the options."""
        from sqlfeed.feed import Feed

        return Feed(self, query, **options)

    @property
    def memory_limit(self) -> int:
        """The memory budget in bytes."""
        return self._inner.memory_limit

    @property
    def spill_folder(self) -> str:
        """This session's spill folder (removed when the session ends)."""
        return os.fspath(self._inner.spill_folder)

    def __repr__(self) -> str:
        return repr(self._inner)


class SqlResult:
    """A planned query. Read it with ``pyarrow.table(result)`` (or Polars,
    DuckDB: anything that takes the Arrow PyCapsule stream interface),
    :meth:`to_arrow` or :meth:`to_pylist`. Each read runs the query again."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The Arrow PyCapsule stream protocol: the rows, streamed as they are
        computed. Errors surface in the consumer as Arrow errors with
        sqlfeed's message; :meth:`to_arrow` raises sqlfeed's own classes."""
        return self._inner.__arrow_c_stream__(requested_schema)

    def to_arrow(self) -> pyarrow.Table:
        """The whole result as a ``pyarrow.Table`` (needs pyarrow)."""
        import pyarrow

        capsule = self._inner._collect_stream()
        return pyarrow.RecordBatchReader._import_from_c_capsule(capsule).read_all()

    def to_pylist(self) -> list[dict[str, Any]]:
        """The rows as a list of dicts (needs pyarrow)."""
        return self.to_arrow().to_pylist()

    @property
    def columns(self) -> list[str]:
        """The result's column names."""
        return self._inner.columns

    def explain(self) -> str:
        """The physical plan, as ``EXPLAIN`` prints it."""
        return self._inner.explain()

    def __repr__(self) -> str:
        return repr(self._inner)
