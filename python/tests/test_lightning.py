"""Feeds under the real trainers that count batches instead of waiting for
StopIteration: PyTorch Lightning, torchdata's StatefulDataLoader, and plain
loops of ``len(feed)`` steps (issue 35). Every epoch they see must be the
feed's epoch of the same number, whole."""

from __future__ import annotations

import itertools
import warnings

import pytest
from conftest import require

BATCH = 64  # 1000 ids: 16 batches per epoch, the last one padded
STEPS = 16


def _feed(session, ids_data, kind="shuffled", **options):
    """A feed of the 1000 ids, shuffled by the feed (by content, or by file
    and row with ``kind="by_position"``) or (``kind="mixture"``) drawn 3:1
    from two halves by a ``MIX`` that takes the feed's epoch."""
    files = f"'{ids_data}/*.parquet'"
    if kind == "mixture":
        query = (
            f"SELECT id FROM (MIX (SELECT id FROM {files} WHERE id < 500) AS low WEIGHT 3, "
            f"(SELECT id FROM {files} WHERE id >= 500) AS high WEIGHT 1 ROWS 1000)"
        )
        defaults = dict(batch_size=BATCH, device="cpu")
    elif kind == "by_position":
        query = f"SELECT id FROM {files}"
        defaults = dict(batch_size=BATCH, shuffle=7, shuffle_by_position=True, device="cpu")
    else:
        query = f"SELECT id FROM {files}"
        defaults = dict(batch_size=BATCH, shuffle=7, device="cpu")
    return session.feed(query, **dict(defaults, **options))


def _reference(session, ids_data, epochs: int, kind="shuffled") -> list[list[list[int]]]:
    """Each epoch's batches as id lists, read with ``set_epoch`` to the end."""
    feed = _feed(session, ids_data, kind)
    out = []
    for epoch in range(epochs):
        feed.set_epoch(epoch)
        out.append([b["id"].tolist() for b in feed])
    assert [len(e) for e in out] == [STEPS] * epochs
    assert out[0] != out[1], "epochs are shuffled differently"
    return out


def _recorder(torch, lightning, *, set_epoch: bool):
    """A LightningModule that records the ids of every batch it trains on,
    per epoch."""

    class Recorder(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: dict[int, list[list[int]]] = {}

        def on_train_epoch_start(self) -> None:
            if set_epoch:
                self.trainer.train_dataloader.dataset.set_epoch(self.current_epoch)

        def training_step(self, batch, batch_idx):
            self.seen.setdefault(self.current_epoch, []).append(batch["id"].tolist())
            return ((self.w - 1.0) ** 2).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Recorder()


def _trainer(lightning, tmp_path, **options):
    defaults = dict(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    return lightning.Trainer(**dict(defaults, **options))


@pytest.mark.parametrize("kind", ["shuffled", "by_position", "mixture"])
@pytest.mark.parametrize("set_epoch", [False, True], ids=["position", "set_epoch"])
def test_lightning_trains_every_epoch_whole(session, ids_data, tmp_path, set_epoch, kind):
    torch = require("torch", "torch")
    lightning = require("lightning", "lightning")
    from sqlfeed.torch import FeedDataset

    reference = _reference(session, ids_data, 3, kind)
    if kind == "by_position":
        assert reference != _reference(session, ids_data, 3), "ordered by content"
    feed = _feed(session, ids_data, kind)
    loader = torch.utils.data.DataLoader(FeedDataset(feed), batch_size=None, num_workers=0)
    model = _recorder(torch, lightning, set_epoch=set_epoch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        _trainer(lightning, tmp_path, max_epochs=3).fit(model, loader)
    counts = [len(model.seen.get(e, [])) for e in range(3)]
    assert counts == [STEPS] * 3, "no empty epoch"
    assert [model.seen[e] for e in range(3)] == reference
    assert (feed.epoch, feed.step) == (3, 0)
    # The timeline of the last pass the trainer ran, as a user would ask
    # for it after fit().
    page = tmp_path / "feed.html"
    verdict = feed.timeline(page)
    assert verdict.startswith(("bound by ", "starting: ")), verdict
    assert f'<p id="verdict">{verdict}</p>' in page.read_text()


@pytest.mark.parametrize("kind", ["shuffled", "by_position", "mixture"])
def test_lightning_resumes_mid_epoch_from_its_own_checkpoint(session, ids_data, tmp_path, kind):
    """Lightning's fault-tolerant path: a run that checkpoints every 21 steps
    (a stateful loader's state_dict is in the checkpoint) is resumed from the
    one taken in epoch 1 with ``fit(ckpt_path=...)``; the resumed run trains
    on exactly the batches the uninterrupted one did from there (also a
    mixture, drawn anew each epoch)."""
    torch = require("torch", "torch")
    lightning = require("lightning", "lightning")
    stateful = require("torchdata.stateful_dataloader", "torchdata")
    from lightning.pytorch.callbacks import ModelCheckpoint

    from sqlfeed.torch import FeedDataset

    reference = _reference(session, ids_data, 3, kind)

    def loader():
        return stateful.StatefulDataLoader(
            FeedDataset(_feed(session, ids_data, kind)), batch_size=None, num_workers=0
        )

    every = STEPS + 5  # the first checkpoint: epoch 1, after step 4
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints",
        every_n_train_steps=every,
        save_top_k=-1,
        filename="{step}",
    )
    uninterrupted = _recorder(torch, lightning, set_epoch=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = _trainer(lightning, tmp_path, max_epochs=3, enable_checkpointing=True)
        trainer.callbacks.append(checkpoints)
        trainer.fit(uninterrupted, loader())
        checkpoint = tmp_path / "checkpoints" / f"step={every}.ckpt"
        assert checkpoint.exists(), sorted(p.name for p in checkpoint.parent.iterdir())
        state = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]["state_dict"]
        (loader_state,) = state["combined_loader"]
        assert (loader_state["dataset_state"]["epoch"], loader_state["dataset_state"]["step"]) == (
            1,
            5,
        )
        resumed = _recorder(torch, lightning, set_epoch=False)
        _trainer(lightning, tmp_path, max_epochs=3).fit(
            resumed, loader(), ckpt_path=str(checkpoint)
        )
    assert [uninterrupted.seen[e] for e in range(3)] == reference
    assert resumed.seen == {1: reference[1][5:], 2: reference[2]}


@pytest.mark.parametrize("kind", ["shuffled", "by_position"])
def test_stateful_dataloader_state_at_an_epoch_end_is_the_next_epoch(session, ids_data, kind):
    torch = require("torch", "torch")
    stateful = require("torchdata.stateful_dataloader", "torchdata")
    from sqlfeed.torch import FeedDataset

    reference = _reference(session, ids_data, 3, kind)
    loader = stateful.StatefulDataLoader(
        FeedDataset(_feed(session, ids_data, kind)), batch_size=None, num_workers=0
    )
    assert len(loader) == STEPS
    epoch0 = [b["id"].tolist() for b in loader]
    mid = iter(loader)
    epoch1 = [next(mid)["id"].tolist() for _ in range(3)]
    state = loader.state_dict()
    # A new process's loader from the mid-epoch state: the rest of epoch 1,
    # then epoch 2 whole.
    again = stateful.StatefulDataLoader(
        FeedDataset(_feed(session, ids_data, kind)), batch_size=None, num_workers=0
    )
    again.load_state_dict(state)
    rest = [b["id"].tolist() for b in again]
    assert [epoch0, epoch1 + rest] == reference[:2]
    # At the end of epoch 1 the state is epoch 2's start.
    at_end = again.state_dict()
    third = stateful.StatefulDataLoader(
        FeedDataset(_feed(session, ids_data, kind)), batch_size=None, num_workers=0
    )
    third.load_state_dict(at_end)
    assert [b["id"].tolist() for b in third] == reference[2]
    assert torch.utils.data.get_worker_info() is None


@pytest.mark.parametrize("kind", ["shuffled", "by_position"])
def test_loops_that_stop_at_len_batches_see_every_epoch(session, ids_data, kind):
    """``zip(range(len(feed)), feed)`` and ``islice`` never ask for the batch
    after the last: the position after it is already the next epoch."""
    require("torch", "torch")
    reference = _reference(session, ids_data, 4, kind)
    feed = _feed(session, ids_data, kind)
    n = len(feed)
    assert n == STEPS
    seen = []
    for _ in range(2):
        seen.append([b["id"].tolist() for _, b in zip(range(n), feed, strict=False)])
        assert (feed.epoch, feed.step) == (len(seen), 0)
    for _ in range(2):
        seen.append([b["id"].tolist() for b in itertools.islice(feed, n)])
    assert seen == reference
    state = feed.state_dict()
    assert (state["epoch"], state["step"]) == (4, 0)


def test_epochs_is_the_feeds_epochs_in_all(session, ids_data):
    require("torch", "torch")
    reference = _reference(session, ids_data, 2)
    feed = _feed(session, ids_data, epochs=2)
    everything = [b["id"].tolist() for b in feed]
    assert everything == reference[0] + reference[1]
    assert list(feed) == [], "a feed at its end yields nothing"
    resumed = _feed(session, ids_data, epochs=2)
    resumed.load_state_dict(dict(feed.state_dict(), epoch=1, step=5, rows=5 * BATCH))
    assert [b["id"].tolist() for b in resumed] == reference[1][5:], "not three epochs"
    with pytest.raises(Exception, match="epochs=0: must be at least 1"):
        _feed(session, ids_data, epochs=0)


def test_batches_know_their_epochs_end(session, ids_data):
    require("torch", "torch")
    for drop_last in (False, True):
        feed = _feed(session, ids_data, drop_last=drop_last, format="dlpack")
        raw = feed._session._inner._start_feed(
            dict(feed._options, first_epoch=0, end_epoch=2, first_step=0)
            | dict(first_row=0, skip_steps=[], appended=None)
        )
        marks = [(b.epoch, b.step, b.last_in_epoch, b.next_position) for b in raw]
        steps = 1000 // BATCH if drop_last else STEPS
        assert len(marks) == 2 * steps
        for epoch, step, last, after in marks:
            assert last == (step == steps - 1)
            assert after == ((epoch + 1, 0) if last else (epoch, step + 1))
