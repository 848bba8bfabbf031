"""A feed's metrics where trainers look (issue 34): intervals of
``feed.stats()`` for TensorBoard and Lightning, running totals for
Prometheus. The numbers are read back by the tools' own readers."""

from __future__ import annotations

import io
import os
import re
import time

import pytest
from conftest import require

import sqlfeed
from sqlfeed.metrics import FeedMeter, progress, prometheus_text, write_prometheus

BATCH = 64  # 1000 ids: 16 batches per epoch


def _feed(session, ids_data, **options):
    options = dict(dict(batch_size=BATCH, shuffle=3, device="cpu", format="numpy"), **options)
    return session.feed(f"SELECT id FROM '{ids_data}/*.parquet'", **options)


def test_a_meter_reports_each_interval_on_its_own(session, ids_data):
    require("numpy", "numpy")
    feed = _feed(session, ids_data)
    meter = FeedMeter(feed)
    it = iter(feed)
    for _ in range(5):
        next(it)
    first = meter.sample()
    assert first["rows_per_s"] > 0 and first["batches_per_s"] > 0
    assert 0.0 <= first["wait_share"] <= 1.0
    assert (first["epoch"], first["step"]) == (0, 5)
    # Nothing taken since: the pass runs, the interval has no rows.
    idle = meter.sample()
    assert idle["rows_per_s"] == 0.0 and idle["batches_per_s"] == 0.0
    rest = sum(1 for _ in it)
    assert rest == 11
    last = meter.sample()
    assert last["rows_per_s"] > 0 and (last["epoch"], last["step"]) == (1, 0)


def test_the_steady_wait_share_leaves_out_the_first_batch(session, ids_data):
    # A loop slower than the feed waits only for its first batch (the
    # query's start-up): after it, the share must be about nothing, and
    # never below nothing (the GPU check once printed -33.7% from a
    # formula that took the first batch's latency out of the wait).
    require("numpy", "numpy")
    feed = _feed(session, ids_data, prefetch=4)
    for _batch in feed:
        time.sleep(0.02)
    stats = feed.stats()
    assert stats["batches"] == 16
    assert 0.0 <= stats["wait_share_steady"] < 0.25, stats
    assert stats["wait_s"] > 0.0, stats


def test_tensorboard_events_hold_the_intervals(session, ids_data, tmp_path):
    require("numpy", "numpy")
    require("torch", "torch")
    require("tensorboard", "tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from sqlfeed.torch import log_to_tensorboard

    feed = _feed(session, ids_data)
    writer = SummaryWriter(log_dir=str(tmp_path))
    for step, _batch in enumerate(feed):
        if step % 4 == 3:
            log_to_tensorboard(writer, feed, step)
    writer.close()
    accumulator = EventAccumulator(str(tmp_path))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"sqlfeed/rows_per_s", "sqlfeed/wait_share", "sqlfeed/mb_per_s"} <= tags
    rates = accumulator.Scalars("sqlfeed/rows_per_s")
    assert [event.step for event in rates] == [3, 7, 11, 15]
    assert all(event.value > 0 for event in rates)
    steps = accumulator.Scalars("sqlfeed/step")
    assert [event.value for event in steps] == [4, 8, 12, 0], "the next batch's step"


def test_prometheus_text_holds_the_totals(session, ids_data, tmp_path):
    require("numpy", "numpy")
    feed = _feed(session, ids_data, shard=(1, 2))
    it = iter(feed)
    for _ in range(3):
        next(it)
    path = tmp_path / "sqlfeed.prom"
    write_prometheus(feed, path, labels={"job": 'train "a"'})
    text = path.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["sqlfeed.prom"], "written whole, by a rename"
    # Issue 56, item 7: readable by node_exporter's own user (a temporary
    # file's 0600 was kept): the mode a plain open() gives under the umask.
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert "# TYPE sqlfeed_rows_total counter" in text
    sample = re.compile(r'^(\w+)\{rank="1",world="2",job="train \\"a\\""\} (\S+)$')
    values = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            match = sample.match(line)
            assert match, line
            values[match.group(1)] = float(match.group(2))
    assert values["sqlfeed_rows_total"] == 3 * BATCH
    assert values["sqlfeed_batches_total"] == 3
    assert values["sqlfeed_bytes_total"] == 3 * BATCH * 8
    assert values["sqlfeed_step"] == 3
    assert values["sqlfeed_wait_seconds_total"] <= values["sqlfeed_running_seconds_total"]
    assert prometheus_text(feed).count("sqlfeed_epoch{") == 1
    with pytest.raises(sqlfeed.PlanError, match="'job-name' is not a Prometheus label name"):
        prometheus_text(feed, labels={"job-name": "x"})


def test_a_lightning_callback_logs_through_the_trainers_logger(session, ids_data, tmp_path):
    torch = require("torch", "torch")
    lightning = require("lightning", "lightning")
    import csv

    from sqlfeed.lightning import FeedMetrics
    from sqlfeed.torch import FeedDataset

    class Model(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            return ((self.w - 1.0) ** 2).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    feed = _feed(session, ids_data, format="torch")
    logger = lightning.pytorch.loggers.CSVLogger(str(tmp_path), name="run")
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=logger,
        log_every_n_steps=1,
        callbacks=[FeedMetrics(feed, every_n_steps=4)],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    loader = torch.utils.data.DataLoader(FeedDataset(feed), batch_size=None)
    trainer.fit(Model(), loader)
    with open(f"{logger.log_dir}/metrics.csv") as rows:
        logged = [row for row in csv.DictReader(rows) if row.get("sqlfeed/rows_per_s")]
    assert [int(row["step"]) for row in logged] == [4, 8, 12, 16], "once per 4 steps"
    assert all(float(row["sqlfeed/rows_per_s"]) > 0 for row in logged)


def test_the_timeline_names_a_slow_loop_and_writes_one_page(session, ids_data, tmp_path):
    feed = _feed(session, ids_data, format="dlpack")
    try:
        feed.timeline()
        raise AssertionError("a timeline before any pass should be refused")
    except RuntimeError as refused:
        assert "no pass has started yet" in str(refused)
    for _batch in feed:
        time.sleep(0.05)  # a training step far slower than reading 64 ids
    page = tmp_path / "feed.html"
    verdict = feed.timeline(page)
    assert verdict.startswith("bound by the training loop"), verdict
    html = page.read_text()
    assert f'<p id="verdict">{verdict}</p>' in html
    assert html.count("<svg") == 5 and "<script" not in html
    # The pass is over: the verdict stays what it was.
    time.sleep(0.2)
    assert feed.timeline() == verdict


def test_progress_counts_the_pass_and_shows_rows_per_s_and_the_wait(session, ids_data):
    require("numpy", "numpy")
    require("tqdm", "tqdm")
    feed = _feed(session, ids_data, epochs=2)
    out = io.StringIO()
    # Off when the output is not a terminal, as tqdm's bars are.
    assert len(list(progress(feed, file=out))) == 32
    assert out.getvalue() == ""
    # Shown: a pass of two epochs of 16 batches, resumed at epoch 0 step 5.
    feed = _feed(session, ids_data, epochs=2)
    it = iter(feed)
    for _ in range(5):
        next(it)
    state = feed.state_dict()
    resumed = _feed(session, ids_data, epochs=2)
    resumed.load_state_dict(state)
    batches = list(progress(resumed, file=out, disable=False, every=4, mininterval=0, ascii=True))
    assert len(batches) == 27
    last = out.getvalue().replace("\r", "\n").strip().splitlines()[-1]
    assert re.search(r"27/27 \[", last), last
    assert re.search(r"rows/s=[0-9]+, waited=[0-9.]+%", last), last
    # A token budget has no total: a count, no bar.
    tokens = session.feed(
        f"SELECT [id] AS tokens FROM '{ids_data}/*.parquet'",
        batch_tokens=256,
        device="cpu",
        format="numpy",
    )
    out = io.StringIO()
    assert sum(1 for _ in progress(tokens, file=out, disable=False, mininterval=0)) > 0
    assert "/" not in out.getvalue().replace("rows/s", "").replace("batch/s", "")
