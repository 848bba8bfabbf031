"""Your own functions in sqlfeed SQL: Python scalar and batch functions.

A **scalar function** takes one Arrow array per argument and returns one
value per row; a **batch function** takes the arguments as one batch (a dict
of NumPy arrays, or a ``pyarrow.RecordBatch``) and returns several columns at
once, declared by ``output`` — the ``map_batches`` a Ray Data user knows.
Both are called in SQL like any function, in queries, ``CACHE TABLE`` and
feeds (also under ``SHUFFLE``, where deterministic functions run after the
shuffle, on the rows kept)::

    @sqlfeed.udf(pa.float32())
    def celsius(f):                       # f: pyarrow.Array
        return pc.divide(pc.subtract(f, 32.0), 1.8)

    @sqlfeed.batch_udf({"pixels": pa.list_(pa.float32()), "label": pa.int64()},
                       batch_format="numpy", concurrency=2, costly=True)
    def preprocess_image(batch):          # {"image": array of bytes, "label": ...}
        ...
        return {"pixels": pixels, "label": batch["label"]}

    session = sqlfeed.Session(functions=[celsius, preprocess_image])
    session.sql("SELECT p['pixels'] AS x, p['label'] AS y FROM "
                "(SELECT preprocess_image(image, label) AS p FROM 'train/*.parquet')")

A batch function returns a struct; ``p['field']`` selects its columns (the
function runs once per batch however many fields are selected).

Scaling past the GIL: ``concurrency=N`` runs the function in N worker
processes (started with ``spawn``, so the function must be importable: a
module-level ``def``, in a script under ``if __name__ == "__main__":``).
Batches travel as Arrow IPC in shared memory, one segment per worker and
direction; the engine's partitions keep the workers busy. Worker processes
rather than free-threaded CPython: the libraries a preprocessing function
calls (Pillow, tokenizers, NumPy) are GIL-bound or not yet safe without it
on most installations, and a crashing C extension then takes down a worker,
not the training process. A worker that dies is an error naming it, never a
hang; Ctrl-C (or the end of the process) stops the workers. A function the
workers cannot import (one defined in ``python -c``, a notebook or the
REPL) is refused with what to do.

Errors: an exception the function raises comes back to your code as itself
(``except MyError:`` works, in-process and from workers), with a note naming
the function and the batch. sqlfeed's own complaints about a function (a
result of the wrong length or type, a worker that died or cannot import it)
raise :class:`FunctionFailed`, a :class:`sqlfeed.ExecutionError`.

Exactness: a function's **identity** (its bytecode, constants, default
arguments, the values its closure and the globals it names hold, or an
explicit ``version=``) is part of the epoch cache's key, so a changed
function never serves a stale cache; give ``version=`` when the function's
result depends on code it calls. ``seeded=True`` passes ``seed=``, an
integer mixed from ``seed`` and the feed's (shuffle seed, epoch), so random
augmentations differ per epoch and reproduce on resume. A function declared
``volatility="volatile"`` makes results session-only (never cached across
runs) and is not moved through a shuffle.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import inspect
import pickle
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlfeed._sqlfeed import ExecutionError

if TYPE_CHECKING:
    import pyarrow

#: What ``batch_format`` may be.
BATCH_FORMATS = ("numpy", "pyarrow")
#: What ``volatility`` may be.
VOLATILITIES = ("immutable", "stable", "volatile")


class Function:
    """A Python function sqlfeed SQL can call; made by :func:`udf` or
    :func:`batch_udf`. Calling it calls the Python function unchanged."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        kind: str,
        name: str | None,
        returns: Any,
        input_types: Sequence[Any] | None,
        batch_format: str,
        volatility: str,
        costly: bool,
        concurrency: int | None,
        version: str | None,
        seeded: bool,
        seed: int,
        inputs: Sequence[str] | None = None,
    ) -> None:
        import pyarrow as pa

        if not callable(fn):
            raise TypeError(f"sqlfeed.{kind}: expected a function, got {fn!r}")
        if batch_format not in BATCH_FORMATS:
            raise ValueError(f"batch_format must be one of {BATCH_FORMATS}, not {batch_format!r}")
        if volatility not in VOLATILITIES:
            raise ValueError(f"volatility must be one of {VOLATILITIES}, not {volatility!r}")
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ValueError(f"concurrency must be an integer >= 1, not {concurrency!r}")
        self.fn = fn
        self.kind = kind
        self.name = name or fn.__name__
        self.batch_format = batch_format
        self.volatility = volatility
        self.costly = costly
        # Unset: 1 (this process) embedded; an executor's task slots on a
        # cluster (sqlfeed.executor sets it).
        self.concurrency = 1 if concurrency is None else concurrency
        self.concurrency_given = concurrency is not None
        self.seeded = seeded
        # A u64 in Rust; any Python int maps onto one.
        self.seed = int(seed) & ((1 << 64) - 1)
        self.qualname = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', self.name)}"
        if kind == "scalar":
            self.return_type = _data_type(returns, self.name)
        else:
            self.output = _output_schema(returns, self.name)
            self.return_type = pa.struct(list(self.output))
        self.input_types = (
            None if input_types is None else [_data_type(t, self.name) for t in input_types]
        )
        self.inputs = None if inputs is None else [str(name) for name in inputs]
        if self.inputs is not None and len(set(self.inputs)) != len(self.inputs):
            raise ValueError(f"function '{self.name}': inputs has repeated names: {self.inputs}")
        if kind == "scalar":
            self.arg_count = _arg_count(fn, seeded)
        else:
            self.arg_count = None if self.inputs is None else len(self.inputs)
        self.version = version
        self.identity = _identity(self, version)
        self.__doc__ = getattr(fn, "__doc__", None)
        # What running the function needs (also what workers receive).
        self._spec = FunctionSpec(
            fn=fn,
            kind=kind,
            name=self.name,
            qualname=self.qualname,
            batch_format=batch_format,
            return_type=self.return_type,
            seeded=seeded,
            inputs=self.inputs,
        )
        self._pool: Any = None
        self._pool_lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"sqlfeed.Function({self.kind} {self.name!r} of {self.qualname}, "
            f"returns {self.return_type}, concurrency={self.concurrency})"
        )

    def close(self) -> None:
        """Stops this function's worker processes (they start again when
        it is next called)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    # -- what the engine calls ----------------------------------------------

    def _invoke(self, batch: Any, num_rows: int, seed: int | None) -> Any:
        """Runs the function on one batch of arguments (an Arrow stream with
        one column per argument) and returns a one-column ``pyarrow.Table``.
        ``seed``: for a seeded function, the declared seed mixed in Rust with
        the feed's seed and epoch (as sqlfeed's own functions draw)."""
        import pyarrow as pa

        table = pa.table(batch)
        if self.concurrency == 1:
            return apply(self._spec, table, num_rows, seed)
        with self._pool_lock:
            # Engine threads call at once: one pool for all of them.
            if self._pool is None:
                from sqlfeed._workers import WorkerPool

                self._pool = WorkerPool(self._spec, self.concurrency)
                _POOLS.append(self)
            pool = self._pool
        return pool.call(table, num_rows, seed)

    def _register(self, session: Any) -> None:
        session._register_function(self._declaration())

    def _declaration(self) -> dict[str, Any]:
        """What the engine registers: the name, types and identity, and
        ``_invoke`` to call (see ``FunctionSpec`` in ``python/src/functions.rs``)."""
        import pyarrow as pa

        # Empty tables that carry the types (from_batches: no array is built,
        # so pyarrow does not import pandas to check one).
        returns = pa.Table.from_batches(
            [], schema=pa.schema([pa.field("result", self.return_type)])
        )
        inputs = (
            None
            if self.input_types is None
            else pa.Table.from_batches(
                [],
                schema=pa.schema([pa.field(f"arg{i}", t) for i, t in enumerate(self.input_types)]),
            )
        )
        # "Costly" asks the engine to run the function on several threads:
        # in this process they would only take turns at the GIL.
        parallel = self.costly and self.concurrency > 1
        return {
            "name": self.name,
            "invoke": self._invoke,
            "returns": returns,
            "inputs": inputs,
            "arg_count": self.arg_count,
            "volatility": self.volatility,
            "identity": self.identity,
            "costly": parallel,
            "qualname": self.qualname,
            "seed": self.seed if self.seeded else None,
        }


class FunctionSpec:
    """What running a function needs; sent to worker processes (the
    function itself by reference, as pickle sends functions)."""

    def __init__(
        self,
        *,
        fn: Callable[..., Any],
        kind: str,
        name: str,
        qualname: str,
        batch_format: str,
        return_type: Any,
        seeded: bool,
        inputs: list[str] | None = None,
    ) -> None:
        self.fn = fn
        self.kind = kind
        self.name = name
        self.qualname = qualname
        self.batch_format = batch_format
        self.return_type = return_type
        self.seeded = seeded
        self.inputs = inputs

    def __getstate__(self) -> dict[str, Any]:
        # A decorated module-level function's name is bound to its Function,
        # so pickle, which sends functions by module and name, would refuse
        # the function itself ("not the same object"). Such a function goes
        # by reference, resolved to the same Function's function in the
        # worker (which imports the module, or the script as `__mp_main__`).
        state = dict(self.__dict__)
        module = getattr(self.fn, "__module__", None)
        qualname = getattr(self.fn, "__qualname__", "")
        if module is not None and "<locals>" not in qualname:
            owner = _resolve(module, qualname)
            if isinstance(owner, Function) and owner.fn is self.fn:
                state["fn"] = _FunctionRef(module, qualname)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        fn = state["fn"]
        if isinstance(fn, _FunctionRef):
            owner = _resolve(fn.module, fn.qualname, import_module=True)
            if not isinstance(owner, Function):
                raise ImportError(f"{fn.module}.{fn.qualname} is not a sqlfeed function here")
            state["fn"] = owner.fn
        self.__dict__.update(state)


class _FunctionRef:
    """A decorated function, by module and qualified name."""

    def __init__(self, module: str, qualname: str) -> None:
        self.module = module
        self.qualname = qualname


def _resolve(module: str, qualname: str, import_module: bool = False) -> Any:
    """``module.qualname`` (an attribute path), or None where it is not there."""
    owner: Any = importlib.import_module(module) if import_module else sys.modules.get(module)
    for part in qualname.split("."):
        owner = getattr(owner, part, None)
    return owner


class FunctionFailed(ExecutionError):
    """sqlfeed could not use a user function's work: it returned something
    unusable, or its worker process died or cannot import it. The message
    names the function and the batch. (An exception the function itself
    raises comes back as itself.)"""


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` where Python has notes (3.11+)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)


def udf(
    return_type: Any,
    *,
    name: str | None = None,
    input_types: Sequence[Any] | None = None,
    batch_format: str = "pyarrow",
    volatility: str = "immutable",
    costly: bool = False,
    concurrency: int | None = None,
    version: str | None = None,
    seeded: bool = False,
    seed: int = 0,
) -> Callable[[Callable[..., Any]], Function]:
    """Makes a Python function a sqlfeed scalar function.

    Args:
        return_type: a ``pyarrow.DataType`` (or what ``pyarrow`` types a
            NumPy dtype or Python type as).
        name: the name in SQL (default: the function's ``__name__``).
        input_types: the argument types, coerced to; default: any types,
            as many as the function has positional parameters.
        batch_format: ``"pyarrow"`` (each argument a ``pyarrow.Array``) or
            ``"numpy"`` (each a NumPy array).
        volatility: ``"immutable"`` (default; same inputs, same output),
            ``"stable"`` or ``"volatile"`` (never cached across runs, not
            moved through a shuffle).
        costly: a row costs far more than a copy (decoding, resizing):
            sqlfeed runs it on small batches on every core, and in a ``MIX``
            source only on the rows each epoch draws (a cheap function runs
            on every row of the source's pass, before its shuffle).
        concurrency: worker processes to run it in (1: in this process).
            Unset: 1 embedded, and on a cluster's executor as many as the
            executor runs tasks at once (``--concurrent-tasks``, default its
            cores): one process's GIL would serialise them.
        version: the function's identity in cache keys instead of its code.
        seeded: pass ``seed=`` (mixed from ``seed`` and the feed's seed and
            epoch) to the function.
        seed: the base of ``seeded``'s seed.
    """

    def wrap(fn: Callable[..., Any]) -> Function:
        return Function(
            fn,
            kind="scalar",
            name=name,
            returns=return_type,
            input_types=input_types,
            batch_format=batch_format,
            volatility=volatility,
            costly=costly,
            concurrency=concurrency,
            version=version,
            seeded=seeded,
            seed=seed,
        )

    return wrap


def batch_udf(
    output: Any,
    *,
    inputs: Sequence[str] | None = None,
    name: str | None = None,
    batch_format: str = "numpy",
    volatility: str = "immutable",
    costly: bool = True,
    concurrency: int | None = None,
    version: str | None = None,
    seeded: bool = False,
    seed: int = 0,
) -> Callable[[Callable[..., Any]], Function]:
    """Makes a Python function over whole batches a sqlfeed function.

    The function gets the call's arguments as one batch, keyed by the names
    in ``inputs`` (in argument order; the call must pass that many), else by
    the arguments' own names (a column argument's is the column's, but the
    optimizer may rename what it rewrites: declare ``inputs`` when a function
    relies on the keys), and returns the columns
    of ``output``: a dict of arrays (NumPy arrays, 2-D ones for list columns,
    lists, pyarrow arrays) or a ``pyarrow.RecordBatch``/``Table``, one value
    per input row. In SQL it returns a struct of ``output``'s fields.

    Args:
        output: the output columns: a ``pyarrow.Schema`` or a dict of name to
            type.
        inputs: the names the arguments have in the batch, in order.
        batch_format: ``"numpy"`` (default; a dict of NumPy arrays, binary
            columns as object arrays of ``bytes``) or ``"pyarrow"`` (a
            ``pyarrow.RecordBatch``).
        costly: default True (what a batch function usually is); see :func:`udf`.

    The other arguments are :func:`udf`'s.
    """

    def wrap(fn: Callable[..., Any]) -> Function:
        return Function(
            fn,
            kind="batch",
            name=name,
            returns=output,
            input_types=None,
            batch_format=batch_format,
            volatility=volatility,
            costly=costly,
            concurrency=concurrency,
            version=version,
            seeded=seeded,
            seed=seed,
            inputs=inputs,
        )

    return wrap


# -- running a function on a batch (in this process or in a worker) --------


def apply(spec: FunctionSpec, table: pyarrow.Table, num_rows: int, seed: int | None) -> Any:
    """Runs ``spec``'s function on ``table`` (one column per argument) and
    returns a one-column ``pyarrow.Table``; raises :class:`FunctionFailed`."""
    import pyarrow as pa

    kwargs = {} if seed is None else {"seed": seed}
    columns = [table.column(i).combine_chunks() for i in range(table.num_columns)]
    try:
        if spec.kind == "scalar":
            args: list[Any] = columns
            if spec.batch_format == "numpy":
                args = [c.to_numpy(zero_copy_only=False) for c in columns]
            result = spec.fn(*args, **kwargs)
        else:
            names = spec.inputs if spec.inputs is not None else table.column_names
            if spec.batch_format == "numpy":
                batch: Any = {
                    n: c.to_numpy(zero_copy_only=False) for n, c in zip(names, columns, strict=True)
                }
            else:
                batch = pa.RecordBatch.from_arrays(columns, names=names)
            result = spec.fn(batch, **kwargs)
    except Exception as exc:
        # The caller gets the exception itself back, told where it came from.
        add_note(
            exc,
            f"raised in Python function '{spec.name}' ({spec.qualname}) on a batch of "
            f"{num_rows} rows",
        )
        raise
    try:
        if spec.kind == "scalar":
            array = to_arrow(result, spec.return_type)
        else:
            array = to_struct(result, spec.return_type, num_rows)
    except (TypeError, ValueError, KeyError, pa.ArrowException) as exc:
        raise FunctionFailed(
            f"Python function '{spec.name}' ({spec.qualname}) returned "
            f"{_describe(result)}, which is not {spec.return_type}: {exc}"
        ) from None
    if len(array) != num_rows:
        raise FunctionFailed(
            f"Python function '{spec.name}' ({spec.qualname}) returned {len(array)} "
            f"values for a batch of {num_rows} rows; it must return one per row"
        )
    return pa.Table.from_arrays([array], names=["result"])


def to_arrow(value: Any, data_type: Any) -> Any:
    """``value`` (a pyarrow array, NumPy array, 2-D for list types, or a
    sequence) as a pyarrow array of ``data_type``."""
    import numpy as np
    import pyarrow as pa

    if isinstance(value, pa.ChunkedArray):
        value = value.combine_chunks()
    if isinstance(value, pa.Array):
        return value if value.type == data_type else value.cast(data_type)
    if isinstance(value, np.ndarray) and value.ndim > 1 and _is_list(data_type):
        rows = value.shape[0]
        width = int(np.prod(value.shape[1:]))
        flat = np.ascontiguousarray(value).reshape(rows * width)
        values = to_arrow(flat, data_type.value_type)
        return pa.FixedSizeListArray.from_arrays(values, width).cast(data_type)
    return pa.array(value, type=data_type)


def to_struct(value: Any, struct_type: Any, num_rows: int) -> Any:
    """A batch function's result as a struct array of ``struct_type``."""
    import pyarrow as pa

    if isinstance(value, pa.Table):
        value = value.combine_chunks().to_batches()[0] if value.num_rows else value
    if isinstance(value, (pa.RecordBatch, pa.Table)):
        value = {name: value.column(name) for name in value.column_names}
    if not isinstance(value, Mapping):
        raise TypeError("a batch function returns a dict of columns or a RecordBatch")
    arrays = []
    for field in struct_type:
        if field.name not in value:
            raise KeyError(f"column '{field.name}' is missing (got {sorted(value)})")
        arrays.append(to_arrow(value[field.name], field.type))
    return pa.StructArray.from_arrays(arrays, fields=list(struct_type))


def _is_list(data_type: Any) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_list(data_type)
        or pa.types.is_large_list(data_type)
        or pa.types.is_fixed_size_list(data_type)
    )


def _describe(value: Any) -> str:
    shape = getattr(value, "shape", None)
    kind = type(value).__name__
    return f"a {kind} of shape {shape}" if shape is not None else f"a {kind}"


# -- declarations ------------------------------------------------------------


def _data_type(value: Any, name: str) -> Any:
    import numpy as np
    import pyarrow as pa

    if isinstance(value, pa.DataType):
        return value
    try:
        return pa.from_numpy_dtype(np.dtype(value))
    except TypeError:
        pass
    raise TypeError(f"function '{name}': {value!r} is not a pyarrow type")


def _output_schema(value: Any, name: str) -> Any:
    import pyarrow as pa

    if isinstance(value, pa.Schema):
        fields = list(value)
    elif isinstance(value, Mapping):
        fields = [pa.field(k, _data_type(t, name)) for k, t in value.items()]
    else:
        raise TypeError(
            f"function '{name}': output must be a pyarrow.Schema or a dict of name to type"
        )
    if not fields:
        raise ValueError(f"function '{name}': output needs at least one column")
    return pa.schema(fields)


def _arg_count(fn: Callable[..., Any], seeded: bool) -> int | None:
    """Positional parameters of ``fn`` without defaults (None: ``*args``),
    but for ``seed`` when sqlfeed passes it."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    count = 0
    for p in params:
        if p.kind == p.VAR_POSITIONAL:
            return None
        if seeded and p.name == "seed":
            continue
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            count += 1
    return count


def _identity(function: Function, version: str | None) -> str:
    """32 hex digits that change when the function's code or settings do."""
    digest = hashlib.sha256()
    for part in (
        function.kind,
        function.name,
        str(function.return_type),
        str(function.input_types),
        function.batch_format,
        function.volatility,
        str(function.seeded),
        str(function.seed),
        str(function.inputs),
    ):
        digest.update(part.encode())
        digest.update(b"\0")
    if version is not None:
        digest.update(b"version\0" + str(version).encode())
    else:
        _hash_function(digest, function.fn, set())
    return digest.hexdigest()[:32]


def _hash_function(digest: Any, fn: Any, seen: set[int]) -> None:
    code = getattr(fn, "__code__", None)
    if code is None:
        # A callable object: its class's __call__ and its state.
        call = vars(type(fn)).get("__call__")
        if call is not None and hasattr(call, "__code__"):
            _hash_function(digest, call, seen)
        digest.update(_value_bytes(getattr(fn, "__dict__", None)))
        return
    _hash_code(digest, code)
    digest.update(_value_bytes(getattr(fn, "__defaults__", None)))
    digest.update(_value_bytes(getattr(fn, "__kwdefaults__", None)))
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        _hash_value(digest, value, seen)
    fn_globals = getattr(fn, "__globals__", {})
    for global_name in _names(code):
        if global_name in fn_globals:
            _hash_value(digest, fn_globals[global_name], seen)


def _hash_value(digest: Any, value: Any, seen: set[int]) -> None:
    if isinstance(value, types.FunctionType):
        if id(value) in seen:
            return
        seen.add(id(value))
        _hash_function(digest, value, seen)
    elif isinstance(value, types.ModuleType):
        digest.update(b"module " + value.__name__.encode())
    elif isinstance(value, type):
        digest.update(b"type " + value.__qualname__.encode())
    else:
        digest.update(_value_bytes(value))


def _hash_code(digest: Any, code: types.CodeType) -> None:
    digest.update(code.co_code)
    digest.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _hash_code(digest, const)
        else:
            digest.update(repr(const).encode())


def _names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_names(const))
    return names


def _value_bytes(value: Any) -> bytes:
    """Bytes for a value a function reads: its pickle, else its type (a value
    that cannot be pickled, such as a lock or a model on a device, is named
    by type only; give ``version=`` when such a value changes results)."""
    if value is None or callable(value):
        return repr(type(value)).encode()
    try:
        return pickle.dumps(value, protocol=4)
    except Exception:
        return repr(type(value)).encode()


# -- worker pools live as long as the process --------------------------------

_POOLS: list[Function] = []


@atexit.register
def _close_pools() -> None:
    for function in _POOLS:
        function.close()
    _POOLS.clear()
