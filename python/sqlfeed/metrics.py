"""A feed's metrics where trainers look: per interval for TensorBoard and
Lightning, as running totals for Prometheus.

``feed.stats()`` gives totals over the passes so far. A long run wants the
last minutes instead — did the loop start waiting after epoch 3? —
so :class:`FeedMeter` takes the difference between two of them::

    meter = FeedMeter(feed)
    for step, batch in enumerate(feed):
        ...
        if step % 100 == 0:
            print(meter.sample())  # rows/s, wait share, MB/s since the last sample

``sqlfeed.torch.log_to_tensorboard(writer, feed, step)`` writes the same
numbers to a ``SummaryWriter``, ``sqlfeed.lightning.FeedMetrics`` logs them
from a Lightning ``Trainer``, :func:`write_prometheus` writes the totals
in Prometheus' text format for node_exporter's textfile collector, and
:func:`progress` iterates a feed under a tqdm bar with its rows/s and wait.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from sqlfeed import _sqlfeed
from sqlfeed.feed import Feed

#: The running totals an interval is the difference of.
_TOTALS = ("rows", "batches", "bytes", "wall_s", "wait_s", "h2d_s")


class FeedMeter:
    """What a feed did between two calls of :meth:`sample`. The first
    sample covers everything since the meter was made, or with
    ``from_start`` everything the feed did before too."""

    def __init__(self, feed: Feed, from_start: bool = False) -> None:
        self._feed = feed
        self._last = dict.fromkeys(_TOTALS, 0.0) if from_start else self._totals()

    def _totals(self, stats: dict[str, Any] | None = None) -> dict[str, float]:
        stats = self._feed.stats() if stats is None else stats
        return {key: float(stats[key]) for key in _TOTALS}

    def sample(self) -> dict[str, float]:
        """Since the last sample: ``rows_per_s``, ``batches_per_s``,
        ``mb_per_s`` (of tensors), ``wait_share`` (of the feed's running
        time, the share the loop waited for a batch: near 0 when the feed
        keeps up), ``h2d_s`` (seconds of host-to-device copies), and now:
        ``prefetch`` (the ring's depth), ``epoch`` and ``step`` (of the next
        batch). Rates are 0 over an interval in which no pass ran."""
        stats = self._feed.stats()
        now = self._totals(stats)
        delta = {key: now[key] - self._last[key] for key in _TOTALS}
        self._last = now
        wall = delta["wall_s"]

        def rate(value: float) -> float:
            return value / wall if wall > 0 else 0.0

        return {
            "rows_per_s": rate(delta["rows"]),
            "batches_per_s": rate(delta["batches"]),
            "mb_per_s": rate(delta["bytes"]) / 1e6,
            "wait_share": rate(delta["wait_s"]),
            "h2d_s": delta["h2d_s"],
            "prefetch": float(stats["prefetch"]),
            "epoch": float(self._feed.epoch),
            "step": float(self._feed.step),
        }


def prometheus_text(feed: Feed, labels: Mapping[str, object] | None = None) -> str:
    """The feed's running totals in Prometheus' text exposition format,
    labelled with its ``rank`` and ``world`` and ``labels`` (the metrics of
    the CLI's ``--prometheus``, from the same formatter). A label name that
    Prometheus refuses is a :class:`sqlfeed.PlanError` naming it."""
    stats = feed.stats()
    all_labels: dict[str, object] = {"rank": feed.rank, "world": feed.world}
    all_labels.update(labels or {})
    return _sqlfeed.prometheus_text(
        rows=stats["rows"],
        batches=stats["batches"],
        bytes=stats["bytes"],
        wall_s=stats["wall_s"],
        wait_s=stats["wait_s"],
        h2d_s=stats["h2d_s"],
        prefetch=stats["prefetch"],
        epoch=feed.epoch,
        step=feed.step,
        labels=[(str(name), str(value)) for name, value in all_labels.items()],
    )


def write_prometheus(
    feed: Feed, path: str | os.PathLike[str], labels: Mapping[str, object] | None = None
) -> None:
    """Writes :func:`prometheus_text` to ``path`` whole (a temporary file
    renamed over it), as node_exporter's textfile collector wants: call it
    every few hundred steps of a long run. The file gets the mode a plain
    ``open()`` gives under the process's umask (0644 under the usual 022),
    so that the collector, running as a user of its own, can read it."""
    _sqlfeed.write_whole(os.fspath(path), prometheus_text(feed, labels))


def _meter_for(feed: Feed, owner: Any) -> FeedMeter:
    """The meter ``owner`` (a writer, a callback) samples ``feed`` with:
    each owner sees its own intervals, the first from the feed's start."""
    meters: dict[int, tuple[Any, FeedMeter]] = feed.__dict__.setdefault("_meters", {})
    kept = meters.get(id(owner))
    if kept is None or kept[0] is not owner:
        kept = (owner, FeedMeter(feed, from_start=True))
        meters[id(owner)] = kept
    return kept[1]


def progress(feed: Feed, *, every: int = 10, **tqdm_options: Any) -> Iterator[Any]:
    """Iterates one pass of ``feed`` (as ``for batch in feed`` does) under
    a tqdm progress bar: its total the pass's batches on this rank (from
    ``len(feed)``, which counts the query's rows; none under
    ``batch_tokens``), its postfix the rows/s and the share of time the
    loop waited for a batch, over the last ``every`` batches. As tqdm's
    bars are, it is off when its output is not a terminal; ``tqdm_options``
    go to ``tqdm.auto.tqdm`` (``desc``, ``file``, ``disable``, ``leave`` …).
    Needs tqdm (Lightning installs it)."""
    from tqdm.auto import tqdm

    if every < 1:
        raise ValueError(f"every={every}: must be at least 1 batch")
    options: dict[str, Any] = {"unit": "batch", "disable": None}
    options.update(tqdm_options)
    if "total" not in options:
        options["total"] = _pass_batches(feed)
    meter = FeedMeter(feed)
    with tqdm(**options) as bar:
        for taken, batch in enumerate(feed, start=1):
            if taken % every == 0:
                interval = meter.sample()
                bar.set_postfix(
                    {
                        "rows/s": f"{interval['rows_per_s']:.0f}",
                        "waited": f"{100 * interval['wait_share']:.1f}%",
                    },
                    refresh=False,
                )
            bar.update()
            yield batch


def _pass_batches(feed: Feed) -> int | None:
    """This rank's batches in the feed's next pass: the rest of the current
    epoch, then whole ones to the feed's last; ``None`` when unknown."""
    try:
        per_epoch = len(feed)
    except TypeError:  # a token budget: batch sizes depend on the rows
        return None
    epochs = 1 if feed.epochs is None else max(feed.epochs - feed.epoch, 0)
    return max(per_epoch * epochs - feed.step, 0)
