"""Training feeds: exact, sharded, shuffled batches of tensors, resumable.

A :class:`Feed` is iterated once per epoch, like a PyTorch DataLoader::

    feed = session.feed(query, batch_size=256, shuffle=42, shard="auto")
    for epoch in range(start_epoch, 10):
        feed.set_epoch(epoch)
        for batch in feed:              # dict of tensors
            loss = step(batch["x"], batch["y"])
        checkpoint(model, feed.state_dict())

Every batch is a pure function of (query, data, seed, epoch, step, rank,
world, batch size): :meth:`Feed.state_dict` is a handful of numbers, and a
new process that loads it yields exactly the batches an uninterrupted run
would have yielded from there.
"""

from __future__ import annotations

import json
import operator
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from sqlfeed import _sqlfeed

if TYPE_CHECKING:
    from sqlfeed.session import Session

#: What iterating yields per batch.
FORMATS = ("torch", "numpy", "jax", "dlpack")

#: Keys a column spec may have.
COLUMN_KEYS = ("dtype", "shape", "scale", "offset", "pad_to", "pad_value", "fill_null", "unit")


def auto_shard() -> tuple[int, int]:
    """``(rank, world)`` of this process: from ``torch.distributed`` when it is
    initialised, else from the ``RANK``/``WORLD_SIZE`` variables ``torchrun``
    sets, else ``(0, 1)``."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is not None and world is not None:
        try:
            return int(rank), int(world)
        except ValueError as err:
            raise _sqlfeed.PlanError(
                f"shard='auto': RANK={rank!r} and WORLD_SIZE={world!r} must be integers"
            ) from err
    return 0, 1


def _shard(shard: tuple[int, int] | str | None) -> tuple[int, int]:
    if shard is None:
        return 0, 1
    if shard == "auto":
        return auto_shard()
    if isinstance(shard, str):
        raise _sqlfeed.PlanError(f"shard={shard!r}: expected (rank, world), 'auto' or None")
    rank, world = shard
    return int(rank), int(world)


def _columns(columns: Mapping[str, Mapping[str, Any]] | None) -> list[tuple]:
    out = []
    for name, spec in (columns or {}).items():
        unknown = set(spec) - set(COLUMN_KEYS)
        if unknown:
            raise _sqlfeed.PlanError(
                f"columns[{name!r}]: unknown keys {sorted(unknown)}; "
                f"expected some of {list(COLUMN_KEYS)}"
            )
        shape = spec.get("shape")
        out.append(
            (
                name,
                None if spec.get("dtype") is None else str(spec["dtype"]).replace("torch.", ""),
                None if shape is None else [int(d) for d in shape],
                spec.get("scale"),
                spec.get("offset"),
                spec.get("pad_to"),
                spec.get("pad_value"),
                spec.get("fill_null"),
                None if spec.get("unit") is None else str(spec["unit"]),
            )
        )
    return out


class Feed:
    """A training feed of one SQL query.

    Args:
        session: the :class:`sqlfeed.Session` to run on.
        query: sqlfeed SQL whose columns become tensors.
        batch_size: rows per batch (per rank).
        shuffle: a seed for a global shuffle per epoch (epoch ``e`` uses
            ``(seed, e)``), or None for the query's own (deterministic) order.
        shuffle_window: with ``shuffle``, shuffle each epoch in windows of at
            least this many rows drawn from all over the data (``SHUFFLE
            WINDOW``) instead of as one exact permutation: the first batch
            and each epoch boundary wait for one window, not for the whole
            epoch, and memory holds two windows. Rows of one Parquet row
            group land in one window; still a pure function of (data, seed,
            epoch), the same on a cluster (one job per window), resumable
            exactly. One Parquet table, row-wise queries. See
            docs/shuffle-and-mix.md.
        shuffle_by_position: with ``shuffle``, an exact shuffle keyed by
            each row's Parquet file and row instead of its content (``SHUFFLE
            BY POSITION``): the first batch waits for the scan alone, not for
            hashing and indexing every row. The order follows the files (the
            same rows in other files are another order); the epoch is held in
            memory, or spilled by position range when it does not fit
            ``memory_limit`` (the same order); on a cluster, one job an
            epoch keyed by position and dealt to the ranks. With
            ``cache=True`` the first epoch stores its rows in its order and
            later epochs read them in theirs (the same batches).
        epochs: None (default): every ``for`` loop is one epoch, the current
            one (DataLoader style: advance with :meth:`set_epoch`, or let the
            position roll over: after an epoch's last batch it is the next
            epoch's start). ``N``: the feed has epochs ``0 … N-1`` in all, as
            the CLI's ``--epochs N`` and the Rust builder's ``epochs(N)``; a
            ``for`` loop runs from the current position to the end of epoch
            ``N-1`` (after ``load_state_dict`` at (1, 5) with ``epochs=2``:
            the rest of epoch 1) and yields nothing once there.
        drop_last: drop the last partial batch; otherwise it is padded with the
            epoch's first rows so that every rank gets as many batches.
        prefetch: batches prepared ahead, on the device.
        shard: ``(rank, world)``, ``"auto"`` (torch.distributed or torchrun's
            ``RANK``/``WORLD_SIZE``) or None for one process.
        device: ``"auto"`` (cuda:0 when usable), ``"cpu"`` or ``"cuda:N"``.
        columns: per column ``{dtype, shape, scale, offset, pad_to, pad_value,
            fill_null, unit}``; ``unit`` (``s``, ``ms``, ``us``, ``ns``)
            rescales a timestamp, date or duration column, which is otherwise
            int64 in its own unit (``{"dtype": "float64", "unit": "s"}``:
            epoch seconds with the fraction).
        batch_tokens: pack variable-size batches of at most this many padded
            tokens instead of ``batch_size`` rows.
        bucket_by_length: sort windows of this many steps by length to cut
            padding.
        pack: pack the query's one column of token ids (a document per row)
            into ``batch_size`` sequences per rank of at most this many
            tokens, no padding between documents; batches hold ``input_ids``,
            ``position_ids`` (restarting per document), ``labels`` (-100 at
            each document's first token and in padding: Hugging Face's
            convention, the model shifts) and ``cu_seqlens`` (int32
            FlashAttention varlen offsets of the flattened batch). Every rank
            gets the same number of sequences per step, with balanced
            attention cost (Σ len²). See docs/packing.md.
        pack_window: documents planned together (default 10,000).
        pack_long: documents longer than ``pack``: ``"split"`` (default:
            pieces of ``pack`` tokens), ``"truncate"`` or ``"fail"``.
        pack_flat: one flat ``[T]`` stream per batch instead of
            ``[batch_size, pack]``.
        cache: materialise the query once (the epoch cache); later epochs and
            runs read preprocessed rows.
        format: ``"torch"`` (default), ``"numpy"``, ``"jax"`` or ``"dlpack"``
            (sqlfeed's own tensor objects, for any ``from_dlpack``).
        order_lanes: partitions of an unshuffled feed (default 4, the same on
            every machine).
        run_id: names a training run so that its ranks share one cluster job
            per epoch (default ``$SQLFEED_RUN_ID`` or ``$TORCHELASTIC_RUN_ID``).
        on_error: what a row whose functions fail (a truncated image, a
            function raising on it) does. ``"fail"`` (default): iteration
            raises, naming it. ``"quarantine"``: the row is left out and
            recorded (:meth:`quarantined`), and its slot takes the row before
            it in the epoch's order, so every rank keeps its step count and
            every other batch is what it would have been; the same on any
            world size, across resumes and on a cluster (not with
            ``cache`` yet).
        max_quarantined: with ``on_error="quarantine"``, the rows an epoch
            may quarantine before iteration raises with a summary: a count
            (``100``), a fraction (``0.005``) or a percentage (``"0.5%"``) of
            the rows of its order read so far, counting at least 10,000 rows
            (default 1%).

    Batches obey sqlfeed's batch contract: a batch (and every tensor made from
    it) stays valid as long as you hold it; hold as many as the memory budget
    allows; past it iteration raises :class:`sqlfeed.ResourcesExhausted`
    saying how many batches are held.
    """

    def __init__(
        self,
        session: Session,
        query: str,
        *,
        batch_size: int = 256,
        shuffle: int | None = None,
        shuffle_window: int | None = None,
        shuffle_by_position: bool = False,
        epochs: int | None = None,
        drop_last: bool = False,
        prefetch: int = 4,
        shard: tuple[int, int] | str | None = None,
        device: str = "auto",
        columns: Mapping[str, Mapping[str, Any]] | None = None,
        batch_tokens: int | None = None,
        bucket_by_length: int | None = None,
        pack: int | None = None,
        pack_window: int | None = None,
        pack_long: str | None = None,
        pack_flat: bool = False,
        cache: bool = False,
        format: str = "torch",
        order_lanes: int | None = None,
        run_id: str | None = None,
        on_error: str = "fail",
        max_quarantined: int | float | str | None = None,
    ) -> None:
        if format not in FORMATS:
            raise _sqlfeed.PlanError(f"format={format!r}: expected one of {list(FORMATS)}")
        if epochs is not None and int(epochs) < 1:
            raise _sqlfeed.PlanError(
                f"epochs={epochs}: must be at least 1 (the feed's epochs in all), or None "
                "for one epoch per `for` loop"
            )
        self._session = session
        self._query = query
        self._rank, self._world = _shard(shard)
        self._format = format
        self._epochs = None if epochs is None else int(epochs)
        if run_id is None:
            run_id = os.environ.get("SQLFEED_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
        self._options: dict[str, Any] = {
            "query": query,
            "batch_size": int(batch_size),
            "shuffle": None if shuffle is None else int(shuffle),
            "shuffle_window": None if shuffle_window is None else int(shuffle_window),
            "shuffle_by_position": bool(shuffle_by_position),
            "drop_last": bool(drop_last),
            "prefetch": int(prefetch),
            "rank": self._rank,
            "world": self._world,
            "device": str(device),
            "columns": _columns(columns),
            "batch_tokens": batch_tokens,
            "bucket_by_length": bucket_by_length,
            "pack": None if pack is None else int(pack),
            "pack_window": None if pack_window is None else int(pack_window),
            "pack_long": None if pack_long is None else str(pack_long),
            "pack_flat": bool(pack_flat),
            "cache": bool(cache),
            "order_lanes": order_lanes,
            "run_id": run_id or "",
            "on_error": str(on_error),
            "max_quarantined": None if max_quarantined is None else str(max_quarantined),
        }
        # Where the feed is (``_sqlfeed.FeedPosition``: the Rust checkpoint,
        # whose rules move, resume and skip it; None before anything set
        # it: the start of epoch 0). While a pass's batches are being taken
        # the pass holds it (``_moving``): the batches taken are the ones
        # trained on.
        self._position: Any = None
        self._moving: Any = None
        self._pass: Any = None
        self._len: int | None = None
        self._reports: list[dict[str, Any]] = []
        # The pass the timeline shows: the running one, else the last.
        self._last_pass: Any = None
        self._converter = _converter(format)
        self._importer = _importer(format)

    # -- iteration ---------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One pass from the current position (where the last pass stopped,
        or where :meth:`load_state_dict` or :meth:`set_epoch` put it): to the
        end of the current epoch, or with ``epochs=N`` to the end of epoch
        ``N-1``."""
        self.close()
        first = self.epoch
        end = first + 1 if self._epochs is None else self._epochs
        if first >= end:
            return iter(())
        raw = self._session._inner._start_feed(self._pass_options(end, self._now()))
        # The pass's start: the files its order is over, as it listed them,
        # and the Delta versions it read — what a checkpoint records.
        self._position = raw._position()
        self._pass = self._last_pass = raw
        return self._run(raw, end)

    def _pass_options(self, end: int, position: Any) -> dict[str, Any]:
        """What the extension starts a pass (or resolves a position) with."""
        return dict(self._options, end_epoch=end, position=position)

    def _now(self) -> Any:
        """The position (``None``: the start of epoch 0)."""
        if self._moving is not None:
            return self._moving._position()
        return self._position

    def _made(self, listed: bool = False) -> Any:
        """The position, made where there is none yet; ``listed``: with the
        files its order is over listed (what a state records)."""
        position = self._now()
        if position is None or (listed and not position.listed):
            # (A position has no last epoch: the extension ignores end_epoch.)
            made = self._session._inner._start_position(self._pass_options(1, position), listed)
            if self._moving is None:
                self._position = made
            return made
        return position

    def _run(self, raw: Any, end: int) -> Iterator[dict[str, Any]]:
        # The position is set before a batch is handed out: a loop that stops
        # after an epoch's last batch without asking for another (Lightning,
        # `zip(range(len(feed)), feed)`) is then at the next epoch.
        try:
            if self._importer is not None:
                # One call per batch: the tensors are made in Rust.
                take = raw._next_dict
                importer, by_capsule, host_only, stream = self._importer
                while (batch := take(importer, by_capsule, host_only, stream)) is not None:
                    self._moving = raw
                    yield batch
            else:
                convert = self._converter
                for batch in raw:
                    self._moving = raw
                    yield convert(batch)
            self._moving = None
            self._position = raw._position().at_epoch_start(end)
        finally:
            if self._moving is raw:
                self._position = raw._position()
                self._moving = None
            self._reports.append(raw.report())
            raw.close()
            if self._pass is raw:
                self._pass = None

    def close(self) -> None:
        """Stops a running pass and its threads (held batches stay valid)."""
        if self._moving is not None:
            self._position = self._moving._position()
            self._moving = None
        if self._pass is not None:
            self._pass.close()
            self._pass = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __len__(self) -> int:
        """Batches per rank per epoch (runs a ``count(*)`` of the query once)."""
        if self._options["batch_tokens"] is not None:
            raise TypeError(
                "len() of a feed with batch_tokens is not known before the epoch runs: "
                "batch sizes depend on the rows' lengths"
            )
        if self._options["pack"] is not None:
            raise TypeError(
                "len() of a packing feed is not known before the epoch runs: the "
                "number of sequences depends on the documents' lengths"
            )
        if self._len is None:
            query = self._query.strip().rstrip(";")
            counted = self._session.sql(f"SELECT count(*) AS n FROM ({query})").to_pylist()
            rows = int(counted[0]["n"])
            chunk = self._options["batch_size"] * self._world
            self._len = rows // chunk if self._options["drop_last"] else -(-rows // chunk)
        return self._len

    # -- position and checkpoints -------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """The next ``for`` loop starts at the beginning of ``epoch`` (like
        ``DistributedSampler.set_epoch``, whose iterator, once made, is not
        changed by it). A pass already running is not interrupted: PyTorch
        Lightning starts the epoch's iterator (and takes its first batch)
        before ``on_train_epoch_start``, where code calls ``set_epoch``.
        Batches taken from it still move the position, since they are the
        ones trained on."""
        position = self._made()
        self._moving = None
        self._position = position.at_epoch_start(int(epoch))

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        position = self._now()
        return 0 if position is None else position.epoch

    @property
    def step(self) -> int:
        """The step (within :attr:`epoch`) of the next batch."""
        position = self._now()
        return 0 if position is None else position.step

    @property
    def epochs(self) -> int | None:
        """The feed's epochs in all (``epochs=``), whose end one pass runs
        to; ``None``: each pass runs one epoch."""
        return self._epochs

    @property
    def rank(self) -> int:
        """This process's rank among the feed's ``world`` (``shard``)."""
        return self._rank

    @property
    def world(self) -> int:
        """How many ranks the epoch is dealt to (``shard``)."""
        return self._world

    def state_dict(self) -> dict[str, Any]:
        """Where the feed is, as a small JSON-serialisable dict (the
        StatefulDataLoader protocol), the same on every rank: loading it in a
        new process resumes with exactly the next batch — under the same
        shape, or under another world size, batch size or token budget (see
        :meth:`load_state_dict`). It is the Rust feed's checkpoint
        (``sqlfeed::feed::Checkpoint``), the format of the CLI's
        ``--save-checkpoint``."""
        return json.loads(self._made(listed=True).to_json())

    def load_state_dict(self, state: Mapping[str, Any], on_data_change: str = "error") -> None:
        """Continues from :meth:`state_dict`'s position.

        Under the same world size and batch size the batches are exactly the
        uninterrupted run's. Under another world size, batch size, token
        budget or ``drop_last`` (elastic resume: a job preempted on 2 GPUs
        that comes back on 3) the epoch continues from the same row of the
        same order, cut into this feed's batches: within the epoch no row is
        fed twice and none is skipped, except the pads or drops the new
        shape's last step needs; later epochs are a fresh run's with the new
        shape. Every rank loads the one state (rank 0's is everyone's).
        Refuses a state of another query or seed, whose rows are others.

        The state lists the files the order was over. If files were added,
        removed or changed since, the rest of the epoch would be another
        order (a shuffle is over all rows): ``on_data_change="error"`` (the
        default) refuses, naming the files; ``"restart_epoch"`` starts the
        checkpoint's epoch anew over the data as it is now; ``"continue"``
        (shuffled feeds, files only added) goes on with every row of the old
        files not yet consumed plus every row of the added files, in a fresh
        order that is a pure function of the data, the seed and the
        checkpoint: no row is fed twice in the epoch and every new row is in
        it; later epochs cover everything. A checkpoint taken in such an
        epoch records that, and resumes it."""
        position = self._session._inner._resume(
            self._pass_options(1, None), json.dumps(dict(state)), on_data_change
        )
        self.close()
        self._position = position

    def skip_steps(self, epoch: int, steps: Iterable[int]) -> None:
        """Leaves out global steps ``steps`` of ``epoch`` (the batches of a loss
        spike, after :meth:`load_state_dict` of a checkpoint before it) and
        nothing else: every other batch stays where it was, so the rest of
        the run is the uninterrupted one minus those steps, on every rank.
        Kept in :meth:`state_dict`."""
        self.close()
        self._position = self._made().skipping(int(epoch), [int(s) for s in steps])

    def explain_batch(self, epoch: int, step: int, rank: int | None = None) -> list[dict[str, Any]]:
        """Where each row of the batch at global step ``step`` of ``epoch``
        (of ``rank``, default this feed's) came from, in batch order: a dict
        ``{"file", "row_group", "row"}`` per row — the Parquet file, its row
        group, and the row's index in the file. The batch is recomputed, not
        logged: the feed runs again with its query reduced to where rows come
        from (filters and the shuffle run, the preprocessing does not), so it
        costs a fraction of an epoch, on any machine, any time after the run.
        It is the batch this feed hands over there (after
        :meth:`load_state_dict`, under its shape), or an uninterrupted run's.
        Rows with identical content are interchangeable copies in a shuffled
        order; the answer names, at each position, a copy with that content,
        and the same copies on every call (each once per epoch)."""
        rank = self._rank if rank is None else int(rank)
        if not 0 <= rank < self._world:
            raise _sqlfeed.PlanError(f"rank={rank}: the feed's ranks are 0..{self._world - 1}")
        first = self.epoch
        end = first + 1 if self._epochs is None else self._epochs
        options = dict(self._pass_options(max(end, first + 1), self._now()), rank=rank)
        rows = self._session._inner._explain_batch(options, int(epoch), int(step))
        return [{"file": file, "row_group": group, "row": row} for file, group, row in rows]

    def dataset(self, epoch: int | None = None) -> EpochDataset:
        """Epoch ``epoch`` (default: :attr:`epoch`, the next batch's) by position, map-style:
        ``len(d)`` rows, and ``d[i]`` row ``i`` of the epoch's order as a dict
        of the query's columns (Python values, not tensors), for samplers and
        debugging. The order is the feed's before it is cut into ranks and
        batches: a feed of world 1 without ``drop_last`` hands over rows 0, 1,
        … in it. Row ``i`` costs reading its window (the last window read is
        kept, so rows in order read each window once); the windows' sizes come
        from the footers, or, with a filter, are counted once. With
        ``shuffle_by_position=True`` row ``i`` costs reading its Parquet row
        group up to the shuffle (the row groups read last are kept, up to 256
        MiB) and the functions above the shuffle for that row alone. Needs
        ``shuffle_window`` or ``shuffle_by_position``: an exact ``shuffle``
        keyed by content would cost the whole epoch per row, and an
        unshuffled feed is refused too. Runs on this machine, also for a
        cluster session. Reading rows needs pyarrow (``sqlfeed[arrow]``)."""
        epoch = self.epoch if epoch is None else int(epoch)
        # The order depends on the options, not on where the feed stands.
        options = self._pass_options(epoch + 1, None)
        return EpochDataset(self._session._inner._dataset(options, epoch))

    def quarantined(self, origins: bool = True) -> list[dict[str, Any]]:
        """The rows quarantined so far (``on_error="quarantine"``), by epoch
        and position: a dict ``{"epoch", "position", "function", "column",
        "error", "file", "row_group", "row"}`` per row. ``position`` is the
        row's slot in the epoch's order (the same under any world size);
        ``function`` the innermost function that failed, ``column`` the
        output column it computes. Every rank holds the same rows, with those
        of the state it resumed from, and rows of batches prefetched but not
        yet handed out. ``origins=True`` resolves each row's Parquet file, row
        group and row by running the feed's query reduced to where rows come
        from, once per epoch listed (no preprocessing runs); with ``False``
        they are None."""
        found: dict[tuple[int, int], tuple[int, int, str, str, str]] = {}
        position = self._now()
        if position is not None:
            found.update(((r[0], r[1]), r) for r in position.quarantined)
        if self._last_pass is not None:
            found.update(((r[0], r[1]), r) for r in self._last_pass._quarantined())
        rows = [found[key] for key in sorted(found)]
        located: dict[tuple[int, int], tuple[str, int, int] | None] = {}
        if origins and rows:
            first = self.epoch
            end = first + 1 if self._epochs is None else self._epochs
            options = self._pass_options(max(end, first + 1), position)
            for epoch, slot, origin in self._session._inner._quarantine_origins(options, rows):
                located[(epoch, slot)] = origin
        table = []
        for epoch, slot, function, column, error in rows:
            file, row_group, row = located.get((epoch, slot)) or (None, None, None)
            table.append(
                {
                    "epoch": epoch,
                    "position": slot,
                    "function": function,
                    "column": column,
                    "error": error,
                    "file": file,
                    "row_group": row_group,
                    "row": row,
                }
            )
        return table

    # -- metrics ---------------------------------------------------------------

    def timeline(self, path: str | os.PathLike[str] | None = None) -> str:
        """Where the time of the running pass (else the last one) went, and
        what bounds it: returns the verdict, e.g. ``"bound by image_decode at
        7.6k rows/s on 2 workers (busy 96%); the loop waited 31%"`` or
        ``"bound by the training loop: …"``, and with ``path`` writes one
        self-contained HTML page (no script, opens offline): busy cores per
        stage (scan, each costly function, shuffle, batch conversion), the
        loop's wait, rows/s, batches ready in the prefetch ring and memory
        reserved, over time. The verdict is measured after the first batch;
        a loop waiting less than 5% of the time is the bound itself."""
        if self._last_pass is None:
            raise RuntimeError("feed.timeline(): no pass has started yet; iterate the feed first")
        html, verdict = self._last_pass._timeline()
        if path is not None:
            with open(path, "w", encoding="utf-8") as page:
                page.write(html)
        return verdict

    def stats(self) -> dict[str, Any]:
        """Metrics of the passes so far: rows/s, the share of time the loop
        waited for data (``wait_share``, and ``wait_share_steady`` from each
        pass's first batch on, the CLI's ``wait_frac_steady``), H2D seconds,
        first-batch latency, seconds per epoch, for a ``MIX`` query the
        realised rows and share of each source per epoch
        (``{"mixture": {epoch: {source: {"rows", "share"}}}}``), and the
        prefetch depth the ring has (fewer than ``prefetch`` when its
        batches did not fit its share of the memory limit). With padded
        tensors, ``padding_frac`` is the share of their elements that are
        padding (over the passes so far, each pass weighted by its rows); a
        packing feed's ``pack_imbalance`` is its worst step's most costly
        rank (attention cost, Σ len²) ÷ the mean over ranks."""
        reports = list(self._reports)
        if self._pass is not None:
            reports.append(self._pass.report())
        reports = [r for r in reports if r]
        rows = sum(r["rows"] for r in reports)
        wall = sum(r["wall_s"] for r in reports)
        wait = sum(r["wait_s"] for r in reports)
        # Steady state: each pass from its first batch on (the CLI's
        # wait_frac_steady), so start-up does not hide or swell starvation.
        steady_wall = sum(r["wall_s"] - (r["ttfb_s"] or 0.0) for r in reports)
        steady_wait = sum(max(r["wait_s"] - r["first_wait_s"], 0.0) for r in reports)
        return {
            "batches": sum(r["batches"] for r in reports),
            "rows": rows,
            "rows_per_s": rows / wall if wall else 0.0,
            "wait_share": wait / wall if wall else 0.0,
            "wait_share_steady": steady_wait / steady_wall if steady_wall > 0 else 0.0,
            # Running totals (what sqlfeed.metrics takes intervals of).
            "wall_s": wall,
            "wait_s": wait,
            "bytes": sum(r["bytes"] for r in reports),
            "h2d_s": sum(r["h2d_s"] for r in reports),
            "first_batch_s": [r["ttfb_s"] for r in reports],
            "epoch_seconds": [e for r in reports for e in r["epoch_seconds"]],
            # A MIX query: each finished epoch's rows per source and their
            # share of the epoch (all ranks together).
            "mixture": {
                epoch: {
                    source: {"rows": n, "share": n / max(1, sum(m for _, m in given))}
                    for source, n in given
                }
                for r in reports
                for epoch, given in r.get("epoch_mixtures", [])
            },
            "device": reports[-1]["device"] if reports else None,
            # Batches prepared ahead: `prefetch`, or fewer where the ring was
            # fitted to its share of the memory limit (heavy batches).
            "prefetch": reports[-1]["prefetch"] if reports else self._options["prefetch"],
            "padding_frac": _weighted(reports, "padding_frac"),
            "pack_imbalance": max(
                (r["pack_imbalance"] for r in reports if r.get("pack_imbalance") is not None),
                default=None,
            ),
        }

    def __repr__(self) -> str:
        return (
            f"sqlfeed.Feed(batch_size={self._options['batch_size']}, "
            f"shard=({self._rank}, {self._world}), epoch={self.epoch}, step={self.step}, "
            f"format={self._format!r})"
        )


def _importer(format: str) -> tuple[Any, bool, bool, Any] | None:
    """``(importer, by_capsule, host_only, stream)`` with which the extension
    makes a batch's framework tensors itself, in one call per batch
    (``RawFeed._next_dict``); ``None``: the batch goes through
    :func:`_converter`."""
    if format == "torch":
        import torch

        # What torch.from_dlpack does with a producer's capsule, without the
        # Python around it; a torch without it takes the protocol path.
        from_capsule = getattr(torch._C, "_from_dlpack", None)
        if from_capsule is None:
            return None

        def stream(ordinal: int) -> int:
            return torch.cuda.current_stream(ordinal).cuda_stream

        return from_capsule, True, False, stream
    if format == "numpy":
        import numpy

        return numpy.from_dlpack, False, True, None
    return None


def _converter(format: str) -> Any:
    """Batch → dict of framework tensors, through DLPack, without a copy."""
    if format == "dlpack":
        return lambda batch: {t.name: t for t in batch.tensors()}
    if format == "torch":
        import torch

        def to_torch(batch: Any) -> dict[str, Any]:
            return {t.name: torch.from_dlpack(t) for t in batch.tensors()}

        return to_torch
    if format == "numpy":
        import numpy

        def to_numpy(batch: Any) -> dict[str, Any]:
            out = {}
            for t in batch.tensors():
                if t.device != "cpu":
                    raise _sqlfeed.PlanError(
                        f"format='numpy' needs host tensors; '{t.name}' is on {t.device}: "
                        "use device='cpu' or format='torch'/'jax'"
                    )
                out[t.name] = numpy.from_dlpack(t)
            return out

        return to_numpy
    import jax.dlpack

    def to_jax(batch: Any) -> dict[str, Any]:
        # JAX names its "external ready events" stream in the DLPack
        # handshake but reads on its own compute streams, which the feed
        # cannot name: -1 (no stream) makes the feed wait for the whole
        # device before it reuses the memory (a no-op for host tensors).
        out = {}
        for t in batch.tensors():
            t.use_on_stream(-1)
            out[t.name] = jax.dlpack.from_dlpack(t)
        return out

    return to_jax


def _weighted(reports: list[dict[str, Any]], key: str) -> float | None:
    """The passes' ``key`` averaged by their rows (None where none has it)."""
    given = [(r[key], r["rows"]) for r in reports if r.get(key) is not None]
    rows = sum(n for _, n in given)
    if not given:
        return None
    if rows == 0:
        return given[-1][0]
    return sum(value * n for value, n in given) / rows


class EpochDataset:
    """One epoch of a feed shuffled in windows or by position, by position
    (:meth:`Feed.dataset`): a map-style dataset (``len``, ``[i]``, negative
    ``i`` from the end) whose row ``i`` is row ``i`` of the epoch's order, a
    dict of the query's columns. PyTorch's ``DataLoader`` reads it a batch of
    positions per call (``__getitems__``). Windowed: positions in order read
    each window once, random ones read a window per row (use it for
    debugging, or a sampler that keeps to windows). By position: each batch
    of positions reads the row groups its rows fall in once (the last ones
    read are kept, up to 256 MiB). It reads in the process that made it: a
    ``DataLoader`` over it runs with ``num_workers=0``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._pid = os.getpid()

    @property
    def epoch(self) -> int:
        """The epoch."""
        return int(self._inner.epoch)

    def window_rows(self) -> list[int]:
        """Rows per window of the epoch, in order (an error for an epoch
        shuffled by position, which has no windows)."""
        return list(self._here().window_rows())

    def __len__(self) -> int:
        return len(self._here())

    def _here(self) -> Any:
        """The extension's dataset, in the process that made it."""
        if os.getpid() != self._pid:
            raise RuntimeError(
                "an EpochDataset reads in the process that made it, not in a forked worker: "
                "use DataLoader(..., num_workers=0), or make the dataset in the worker"
            )
        return self._inner

    def _positions(self, indexes: list[Any]) -> list[int]:
        """``indexes`` as positions in ``0..len``; an IndexError outside."""
        rows = len(self)
        positions = []
        for index in indexes:
            index = operator.index(index)
            position = index + rows if index < 0 else index
            if not 0 <= position < rows:
                raise IndexError(
                    f"position {index} is outside the epoch: the epoch has {rows} rows"
                )
            positions.append(position)
        return positions

    def __getitem__(self, index: int) -> dict[str, Any]:
        (position,) = self._positions([index])
        return _pylist(self._here()._row(position))[0]

    def __getitems__(self, indexes: list[int]) -> list[dict[str, Any]]:
        """Rows ``indexes`` in one call (PyTorch's DataLoader asks a batch
        of positions at once this way), each window they fall in read once."""
        return _pylist(self._here()._rows(self._positions(indexes)))

    def __reduce__(self) -> Any:
        raise TypeError(
            "an EpochDataset reads in the process that made it and cannot be pickled: "
            "use DataLoader(..., num_workers=0), or make the dataset in the worker"
        )

    def __repr__(self) -> str:
        return f"EpochDataset(epoch={self.epoch})"


def _pylist(result: Any) -> list[dict[str, Any]]:
    """The rows of an extension result as dicts, through pyarrow."""
    try:
        import pyarrow as pa
    except ImportError as e:  # pragma: no cover - pyarrow is a test dependency
        raise ImportError(
            "EpochDataset rows are read through pyarrow: pip install 'sqlfeed[arrow]'"
        ) from e
    return pa.table(result).to_pylist()
