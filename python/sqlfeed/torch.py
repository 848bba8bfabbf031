"""A ``torch.utils.data.IterableDataset`` over a feed, for code that insists
on a DataLoader. The feed already batches, shuffles, shards and prefetches:
use ``DataLoader(dataset, batch_size=None, num_workers=0)``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch.utils.data

from sqlfeed import _sqlfeed
from sqlfeed.feed import Feed
from sqlfeed.metrics import _meter_for


class FeedDataset(torch.utils.data.IterableDataset):
    """Wraps a :class:`sqlfeed.Feed`; each iteration is one pass of it."""

    def __init__(self, feed: Feed) -> None:
        super().__init__()
        self.feed = feed

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """One pass of the feed; refused in a DataLoader worker process (the
        feed runs its own parallel pipeline)."""
        if torch.utils.data.get_worker_info() is not None:
            raise _sqlfeed.PlanError(
                "sqlfeed feeds run their own parallel pipeline and cannot be split over "
                "DataLoader workers: use DataLoader(dataset, batch_size=None, num_workers=0)"
            )
        return iter(self.feed)

    def __len__(self) -> int:
        """The feed's batches per rank per epoch."""
        return len(self.feed)

    def set_epoch(self, epoch: int) -> None:
        """The feed's :meth:`sqlfeed.Feed.set_epoch`."""
        self.feed.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The feed's :meth:`sqlfeed.Feed.state_dict` (what torchdata's
        ``StatefulDataLoader`` saves)."""
        return self.feed.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """The feed's :meth:`sqlfeed.Feed.load_state_dict`."""
        self.feed.load_state_dict(state)


def log_to_tensorboard(writer: Any, feed: Feed, step: int, prefix: str = "sqlfeed") -> None:
    """Writes what ``feed`` did since this writer's last call
    (:meth:`sqlfeed.metrics.FeedMeter.sample`: rows/s, wait share, MB/s,
    H2D seconds, prefetch depth, epoch, step) as scalars ``prefix/<name>``
    at global step ``step`` of a ``torch.utils.tensorboard.SummaryWriter``
    (or anything with its ``add_scalar``). Call it every N training steps."""
    for name, value in _meter_for(feed, writer).sample().items():
        writer.add_scalar(f"{prefix}/{name}", value, step)
