"""A PyTorch Lightning callback that logs a feed's metrics where the rest of
the run's metrics go (TensorBoard, CSV, W&B: the trainer's loggers)."""

from __future__ import annotations

from typing import Any

import lightning

from sqlfeed.feed import Feed
from sqlfeed.metrics import _meter_for


class FeedMetrics(lightning.pytorch.Callback):
    """Every ``every_n_steps`` optimizer steps, logs what ``feed`` did since
    the last time (:meth:`sqlfeed.metrics.FeedMeter.sample`) as
    ``prefix/<name>`` to each of the trainer's loggers, at the trainer's
    global step, once (values logged through ``LightningModule.log`` would
    be repeated at every step until the next)::

        trainer = lightning.Trainer(callbacks=[FeedMetrics(feed, every_n_steps=50)])
    """

    def __init__(self, feed: Feed, every_n_steps: int = 50, prefix: str = "sqlfeed") -> None:
        super().__init__()
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps={every_n_steps}: log at least every step (1)")
        self.feed = feed
        self.every_n_steps = every_n_steps
        self.prefix = prefix

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step % self.every_n_steps != 0:
            return
        sample = _meter_for(self.feed, self).sample()
        metrics = {f"{self.prefix}/{name}": value for name, value in sample.items()}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
