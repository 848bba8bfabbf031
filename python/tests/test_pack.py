"""Sequence packing (issue 58): documents packed into sequences of at most
``pack`` tokens, every document's tokens fed once per epoch, the same number
of sequences on every rank, and a language model that sees nothing across
documents: its loss on packed batches equals the loss of each document run
alone."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, require

import sqlfeed

TOKENIZER = REPO / "udfs" / "tests" / "data" / "all-MiniLM-L6-v2.tokenizer.json"
WORDS = (
    "the a river stone light morning field old new house wind quiet city road "
    "bright cold garden long story under over across between small great"
).split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """600 documents of 1 to 120 words in 3 files, every text different."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = random.Random(11)
    out = tmp_path_factory.mktemp("corpus")
    for part in range(3):
        texts = [
            f"document {part * 200 + i} " + " ".join(rng.choices(WORDS, k=rng.randint(1, 120)))
            for i in range(200)
        ]
        pq.write_table(pa.table({"text": texts}), out / f"part-{part}.parquet")
    return out


def query(corpus: Path) -> str:
    return f"SELECT tokenize(text, '{TOKENIZER}') AS tokens FROM '{corpus}/*.parquet'"


def documents(session: sqlfeed.Session, corpus: Path) -> list[tuple[int, ...]]:
    rows = session.sql(query(corpus)).to_pylist()
    return [tuple(row["tokens"]) for row in rows]


def packed_documents(batch) -> list[list[tuple[int, ...]]]:
    """Each sequence's documents, from input_ids and cu_seqlens. Padding
    segments (pad id 0, which the tokenizer never yields, labels -100) are
    left out."""
    ids = batch["input_ids"].reshape(-1).tolist()
    labels = batch["labels"].reshape(-1).tolist()
    width = batch["input_ids"].shape[-1] if batch["input_ids"].dim() == 2 else None
    cu = batch["cu_seqlens"].tolist()
    sequences: dict[int, list[tuple[int, ...]]] = {}
    for start, end in zip(cu, cu[1:], strict=False):
        padding = all(i == 0 for i in ids[start:end])
        if padding:
            assert all(label == -100 for label in labels[start:end])
            continue
        row = 0 if width is None else start // width
        sequences.setdefault(row, []).append(tuple(ids[start:end]))
    return [sequences[row] for row in sorted(sequences)]


def test_every_documents_tokens_are_fed_once_within_max_tokens(session, corpus):
    torch = require("torch", "torch")
    expected = documents(session, corpus)
    feed = session.feed(
        query(corpus), batch_size=4, shuffle=3, pack=128, pack_window=100, device="cpu"
    )
    seen = []
    batches = list(feed)
    for step, batch in enumerate(batches):
        rows = batch["input_ids"].shape[0]
        # 4 sequences; the epoch's last step shares what is left.
        assert rows == 4 or (step == len(batches) - 1 and 1 <= rows <= 4)
        assert batch["input_ids"].shape[1] == 128
        assert batch["input_ids"].dtype == torch.int64
        assert batch["position_ids"].shape == (rows, 128)
        assert batch["labels"].dtype == torch.int64
        assert batch["cu_seqlens"].dtype == torch.int32
        cu = batch["cu_seqlens"].tolist()
        assert cu[0] == 0 and cu[-1] == rows * 128
        positions = batch["position_ids"].reshape(-1).tolist()
        labels = batch["labels"].reshape(-1).tolist()
        ids = batch["input_ids"].reshape(-1).tolist()
        for start, end in zip(cu, cu[1:], strict=False):
            if ids[start] == 0:
                continue  # padding
            # Positions restart and the first token predicts nothing across.
            assert positions[start:end] == list(range(end - start))
            assert labels[start] == -100
            assert labels[start + 1 : end] == ids[start + 1 : end]
        for sequence in packed_documents(batch):
            assert sum(len(d) for d in sequence) <= 128
            seen.extend(sequence)
    # Every token once; every document of at most 128 tokens whole, once
    # (longer ones come as pieces of 128).
    assert sum(len(d) for d in seen) == sum(len(d) for d in expected)
    short = Counter(d for d in expected if len(d) <= 128)
    assert Counter(d for d in seen if d in short) == short
    stats = feed.stats()
    assert stats["padding_frac"] < 0.10, stats
    assert 1.0 <= stats["pack_imbalance"] < 1.5, stats


def test_ranks_get_equal_steps_and_together_every_token(session, corpus):
    require("torch", "torch")
    world = 3
    per_rank = []
    for rank in range(world):
        feed = session.feed(
            query(corpus),
            batch_size=2,
            shuffle=5,
            pack=96,
            pack_window=150,
            shard=(rank, world),
            device="cpu",
        )
        per_rank.append([packed_documents(batch) for batch in feed])
    assert len({len(batches) for batches in per_rank}) == 1, [len(b) for b in per_rank]
    fed = [d for batches in per_rank for batch in batches for seq in batch for d in seq]
    assert sum(map(len, fed)) == sum(len(d) for d in documents(session, corpus))


def test_a_resume_gives_the_uninterrupted_runs_batches(session, corpus):
    require("torch", "torch")
    options = dict(batch_size=2, shuffle=9, pack=64, pack_window=120, device="cpu", epochs=2)
    whole = [b["input_ids"].clone() for b in session.feed(query(corpus), **options)]
    feed = session.feed(query(corpus), **options)
    taken = []
    for batch in feed:
        taken.append(batch["input_ids"].clone())
        if len(taken) == len(whole) // 2 + 3:
            break
    state = feed.state_dict()
    feed.close()
    resumed = session.feed(query(corpus), **options)
    resumed.load_state_dict(state)
    rest = [b["input_ids"].clone() for b in resumed]
    assert len(taken) + len(rest) == len(whole)
    for a, b in zip(taken + rest, whole, strict=True):
        assert (a == b).all()
    # Another packing is another plan: refused.
    other = session.feed(query(corpus), **dict(options, pack=80))
    with pytest.raises(sqlfeed.PlanError, match="packing feed resumes only under its own"):
        other.load_state_dict(state)
        next(iter(other))


def test_a_resume_on_another_world_size_feeds_every_piece_once(session, corpus):
    """2 ranks take 4 steps; 3 ranks of 3 sequences go on to the epoch's end:
    together they feed the pieces an uninterrupted run feeds, each once."""
    require("torch", "torch")
    options = dict(shuffle=4, pack=64, pack_window=120, device="cpu", epochs=1)
    whole = Counter(
        piece
        for batch in session.feed(query(corpus), batch_size=2, **options)
        for sequence in packed_documents(batch)
        for piece in sequence
    )
    fed: Counter = Counter()
    state = None
    for rank in range(2):
        feed = session.feed(query(corpus), batch_size=2, shard=(rank, 2), **options)
        for step, batch in enumerate(feed):
            fed.update(piece for sequence in packed_documents(batch) for piece in sequence)
            if step == 3:
                break
        state = feed.state_dict()
        feed.close()
    steps = []
    for rank in range(3):
        feed = session.feed(query(corpus), batch_size=3, shard=(rank, 3), **options)
        feed.load_state_dict(state)
        batches = list(feed)
        steps.append(len(batches))
        for batch in batches:
            fed.update(piece for sequence in packed_documents(batch) for piece in sequence)
    assert len(set(steps)) == 1 and steps[0] > 0, steps
    assert fed == whole


def test_a_long_document_is_split_truncated_or_named(session, corpus):
    torch = require("torch", "torch")
    longest = max(len(d) for d in documents(session, corpus))
    assert longest > 40
    failing = session.feed(query(corpus), batch_size=2, pack=40, pack_long="fail", device="cpu")
    with pytest.raises(sqlfeed.ExecutionError, match=r"tokens, more than pack=40"):
        list(failing)
    truncated = session.feed(
        query(corpus), batch_size=2, pack=40, pack_long="truncate", device="cpu"
    )
    fed = sum(int((b["labels"] != -100).sum()) for b in truncated)
    split = session.feed(query(corpus), batch_size=2, pack=40, device="cpu")
    fed_split = sum(int((b["labels"] != -100).sum()) for b in split)
    assert fed < fed_split
    flat = session.feed(query(corpus), batch_size=2, pack=40, pack_flat=True, device="cpu")
    for batch in flat:
        assert batch["input_ids"].dim() == 1
        assert int(batch["cu_seqlens"][-1]) == batch["input_ids"].shape[0]
        assert bool((batch["input_ids"] != 0).all()), "no padding in the flat stream"
        break
    with pytest.raises(sqlfeed.PlanError, match="packs one column of token ids"):
        list(session.feed("SELECT 1 AS a, 2 AS b", pack=40, device="cpu"))
    del torch


class TinyCausalLM:
    """A one-layer transformer whose attention is causal within each
    segment of ``cu_seqlens`` and blind across them."""

    def __init__(self, torch, vocab: int, dim: int = 32, positions: int = 512):
        torch.manual_seed(0)
        nn = torch.nn
        self.torch = torch
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(positions, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, vocab)
        self.modules = nn.ModuleList([self.embed, self.position, self.qkv, self.mlp, self.head])

    def token_losses(self, ids, positions, labels, cu_seqlens):
        """Per-token losses of a flat stream ``[T]`` (Hugging Face's shift:
        logit t is scored against label t + 1)."""
        torch = self.torch
        t = ids.shape[0]
        segment = torch.zeros(t, dtype=torch.long)
        for start in cu_seqlens[1:-1].tolist():
            segment[start:] += 1
        order = torch.arange(t)
        mask = (segment[:, None] == segment[None, :]) & (order[None, :] <= order[:, None])
        x = self.embed(ids) + self.position(positions)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attention = torch.nn.functional.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=mask[None]
        )[0]
        x = x + attention
        x = x + self.mlp(x)
        logits = self.head(x)
        losses = torch.nn.functional.cross_entropy(
            logits[:-1], labels[1:], ignore_index=-100, reduction="none"
        )
        return losses

    def document_loss(self, document: tuple[int, ...]):
        torch = self.torch
        ids = torch.tensor(document)
        labels = ids.clone()
        labels[0] = -100
        losses = self.token_losses(
            ids, torch.arange(len(document)), labels, torch.tensor([0, len(document)])
        )
        return losses.sum()


def test_a_causal_lm_trained_on_packed_batches_sees_each_document_alone(session, corpus):
    torch = require("torch", "torch")
    vocab = 30522
    model = TinyCausalLM(torch, vocab)
    optimizer = torch.optim.SGD(model.modules.parameters(), lr=0.05)
    feed = session.feed(
        query(corpus), batch_size=2, shuffle=1, pack=128, pack_flat=True, device="cpu"
    )
    compared = 0
    for step, batch in enumerate(feed):
        if step == 6:
            break
        ids, positions = batch["input_ids"], batch["position_ids"]
        labels, cu = batch["labels"], batch["cu_seqlens"]
        losses = model.token_losses(ids, positions, labels, cu)
        # Per document: the losses of its tokens (the shifted label of token
        # t + 1 belongs to token t's document; a document's first label is
        # -100, so nothing is scored across the boundary).
        bounds = cu.tolist()
        with torch.no_grad():
            for start, end in zip(bounds, bounds[1:], strict=False):
                document = tuple(ids[start:end].tolist())
                packed = losses[start : end - 1].sum()
                alone = model.document_loss(document)
                assert torch.allclose(packed, alone, rtol=1e-4, atol=1e-4), (
                    step,
                    float(packed),
                    float(alone),
                )
                compared += 1
        loss = losses.sum() / (labels != -100).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert compared > 20


# The packing feed the trainer tests read: a few steps per epoch.
TRAINER_OPTIONS = dict(batch_size=2, shuffle=6, pack=96, pack_window=150, device="cpu")


def packed_epochs(session: sqlfeed.Session, corpus: Path, epochs: int) -> list[list[list]]:
    """Each epoch's ``input_ids`` batches of the trainer tests' feed, read by a
    plain loop with ``set_epoch``."""
    feed = session.feed(query(corpus), **TRAINER_OPTIONS)
    out = []
    for epoch in range(epochs):
        feed.set_epoch(epoch)
        out.append([b["input_ids"].tolist() for b in feed])
    return out


def test_lightning_trains_two_epochs_of_packed_batches(session, corpus, tmp_path):
    """A packing feed under a real ``lightning.Trainer``: its ``len()`` is
    unknown (a TypeError Lightning takes as an iterable without a length),
    and each epoch is the packed epoch a plain loop reads, every token once."""
    import warnings

    torch = require("torch", "torch")
    lightning = require("lightning", "lightning")
    from sqlfeed.torch import FeedDataset

    reference = packed_epochs(session, corpus, 2)
    assert reference[0] != reference[1], "epochs pack other orders"

    class Recorder(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: dict[int, list] = {}

        def training_step(self, batch, batch_idx):
            self.seen.setdefault(self.current_epoch, []).append(batch["input_ids"].tolist())
            return ((self.w - 1.0) ** 2).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    feed = session.feed(query(corpus), **TRAINER_OPTIONS)
    loader = torch.utils.data.DataLoader(FeedDataset(feed), batch_size=None, num_workers=0)
    model = Recorder()
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging
        trainer.fit(model, loader)
    assert [model.seen[e] for e in range(2)] == reference
    total = sum(len(d) for d in documents(session, corpus))
    for epoch in range(2):
        fed = sum(int((torch.tensor(ids) != 0).sum()) for ids in model.seen[epoch])
        assert fed == total, f"epoch {epoch}: every token once"


def test_stateful_dataloader_resumes_a_packing_feed_mid_epoch(session, corpus):
    """torchdata's ``StatefulDataLoader`` over a packing feed (no ``len()``):
    its state mid-epoch, loaded by a new loader, gives the rest of that
    packed epoch, and its state at the epoch's end the next epoch whole."""
    require("torch", "torch")
    stateful = require("torchdata.stateful_dataloader", "torchdata")
    from sqlfeed.torch import FeedDataset

    reference = packed_epochs(session, corpus, 3)
    assert len(reference[1]) > 3

    def loader():
        return stateful.StatefulDataLoader(
            FeedDataset(session.feed(query(corpus), **TRAINER_OPTIONS)),
            batch_size=None,
            num_workers=0,
        )

    first = loader()
    epoch0 = [b["input_ids"].tolist() for b in first]
    mid = iter(first)
    epoch1 = [next(mid)["input_ids"].tolist() for _ in range(3)]
    state = first.state_dict()
    again = loader()
    again.load_state_dict(state)
    rest = [b["input_ids"].tolist() for b in again]
    assert [epoch0, epoch1 + rest] == reference[:2]
    third = loader()
    third.load_state_dict(again.state_dict())
    assert [b["input_ids"].tolist() for b in third] == reference[2]
