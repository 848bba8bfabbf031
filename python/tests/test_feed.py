"""Feeds from Python: tensors and their values, zero copy, the batch
contract, formats, state_dict resume, Ctrl-C, threads."""

from __future__ import annotations

import _thread
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import require

import sqlfeed


def feed_threads() -> int:
    """Threads of sqlfeed feeds alive in this process (Linux)."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                name = comm.read().strip()
        except OSError:
            continue
        if name.startswith("sqlfeed-") and name[len("sqlfeed-") :].isdigit():
            count += 1
    return count


def test_every_column_kind_has_the_dtype_shape_and_values_of_pyarrow(session, gen_data):
    torch = require("torch", "torch")
    np = require("numpy", "numpy")
    require("pyarrow", "arrow")
    files = f"'{gen_data}/*.parquet'"
    query = (
        "SELECT id, label, f0, weight, feature_vector(f0, f1, f2) AS x, "
        "tokens, image_decode(image_png) AS hwc, "
        "image_to_tensor(image_decode(image_png)) AS chw "
        f"FROM {files} WHERE id < 300 ORDER BY id"
    )
    feed = session.feed(
        query,
        batch_size=64,
        device="cpu",
        columns={"weight": {"fill_null": -1.0}, "f0": {"dtype": "bfloat16"}},
    )
    batches = list(feed)
    assert [b["id"].shape[0] for b in batches] == [64, 64, 64, 64, 44]
    got = {k: torch.cat([b[k] for b in batches]) for k in ("id", "label", "f0", "weight", "x")}
    table = session.sql(
        f"SELECT id, label, f0, weight, f1, f2, tokens, image_decode(image_png)['pixels'] AS px "
        f"FROM {files} WHERE id < 300 ORDER BY id"
    ).to_arrow()
    assert got["id"].dtype == torch.int64 and got["id"].tolist() == table["id"].to_pylist()
    assert got["label"].dtype == torch.int64  # ints become int64
    assert got["label"].tolist() == table["label"].to_pylist()
    assert got["f0"].dtype == torch.bfloat16
    f0 = np.asarray(table["f0"].to_pylist(), dtype=np.float32)
    assert np.allclose(got["f0"].float().numpy(), f0, rtol=1e-2, atol=1e-2)
    weights = [-1.0 if w is None else w for w in table["weight"].to_pylist()]
    assert got["weight"].dtype == torch.float32
    assert np.allclose(got["weight"].numpy(), np.asarray(weights, dtype=np.float32))
    x = np.stack([table[c].to_numpy() for c in ("f0", "f1", "f2")], axis=1).astype(np.float32)
    assert got["x"].shape == (300, 3) and np.allclose(got["x"].numpy(), x)
    # Padded token lists with their mask.
    first = batches[0]
    lengths = [len(t) for t in table["tokens"].to_pylist()[:64]]
    assert first["tokens"].shape == (64, max(lengths))
    assert first["tokens_mask"].dtype == torch.bool
    assert first["tokens_mask"].sum(dim=1).tolist() == lengths
    row = table["tokens"].to_pylist()[5]
    assert first["tokens"][5, : len(row)].tolist() == row
    # Images: uint8 NHWC equal to the decoded pixels; float32 NCHW / 255.
    hwc = first["hwc"]
    assert hwc.dtype == torch.uint8 and hwc.dim() == 4 and hwc.shape[0] == 64
    pixels = np.frombuffer(table["px"][0].as_py(), dtype=np.uint8)
    assert np.array_equal(hwc[0].reshape(-1).numpy(), pixels)
    chw = first["chw"]
    assert chw.dtype == torch.float32 and chw.shape[1] == hwc.shape[3]
    assert torch.allclose(chw[0], hwc[0].permute(2, 0, 1).float() / 255)


def test_tensors_arrive_without_a_copy(session, ids_data):
    torch = require("torch", "torch")
    np = require("numpy", "numpy")
    feed = session.feed(
        f"SELECT id FROM '{ids_data}/*.parquet'", batch_size=100, device="cpu", format="dlpack"
    )
    batch = next(iter(feed))
    tensor = batch["id"]
    assert (tensor.dtype, tensor.shape, tensor.device) == ("int64", [100], "cpu")
    assert tensor.__dlpack_device__() == (1, 0)
    as_torch = torch.from_dlpack(tensor)
    assert as_torch.data_ptr() == tensor.data_ptr
    as_numpy = np.from_dlpack(tensor)
    assert as_numpy.ctypes.data == tensor.data_ptr
    assert not as_numpy.flags.writeable, "versioned exports are read-only"
    with pytest.raises(BufferError):
        tensor.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="cuda"):
        tensor.__dlpack__(dl_device=(2, 0))
    feed.close()


def test_torch_and_numpy_batches_are_made_in_one_call_with_the_protocols_result(session, ids_data):
    torch = require("torch", "torch")
    np = require("numpy", "numpy")
    query = f"SELECT id, CAST(id AS FLOAT) / 2 AS half FROM '{ids_data}/*.parquet'"
    options = dict(batch_size=64, shuffle=3, device="cpu")
    direct = session.feed(query, format="torch", **options)
    # torch has _C._from_dlpack: the extension makes the tensors itself.
    assert direct._importer is not None
    protocol = session.feed(query, format="dlpack", **options)
    as_numpy = session.feed(query, format="numpy", **options)
    batches = 0
    for made, raw, array in zip(direct, protocol, as_numpy, strict=True):
        assert list(made) == list(raw) == list(array) == ["id", "half"]
        for name in made:
            assert torch.equal(made[name], torch.from_dlpack(raw[name]))
            assert np.array_equal(array[name], made[name].numpy())
        assert not array["id"].flags.writeable, "versioned exports are read-only"
        batches += 1
    assert batches == 16
    assert direct.state_dict() == protocol.state_dict() == as_numpy.state_dict()


def test_holding_every_batch_of_an_epoch_keeps_each_valid(session, ids_data):
    torch = require("torch", "torch")
    feed = session.feed(
        f"SELECT id FROM '{ids_data}/*.parquet'", batch_size=30, prefetch=1, device="cpu"
    )
    held = list(feed)  # 34 batches on a ring of 2 slots
    assert len(held) == 34 == len(feed)
    ids = torch.cat([b["id"] for b in held]).tolist()
    assert sorted(ids) == list(range(1000))
    again = [b["id"].tolist() for b in feed]  # the next epoch, while the first is held
    assert [b["id"].tolist() for b in held] == again, "unshuffled epochs are equal"


def test_use_on_stream_takes_torch_cupy_and_raw_streams(session, ids_data):
    """The Python face of ``TensorBatch::use_on_stream``: what it accepts and
    refuses is checked here; on a GPU, scripts/gpu_torch_check.py reads
    every batch on a side stream through it."""
    feed = session.feed(
        f"SELECT id FROM '{ids_data}/*.parquet'", batch_size=10, device="cpu", format="dlpack"
    )
    tensor = next(iter(feed))["id"]

    class TorchStream:  # what torch.cuda.Stream / ExternalStream expose
        cuda_stream = 0x5000

    class CupyStream:  # what cupy.cuda.Stream exposes
        ptr = 0x6000

    for stream in (0, 1, 2, -1, 0x7000, TorchStream(), CupyStream()):
        assert tensor.use_on_stream(stream) is None, "a no-op for host tensors"
    with pytest.raises(TypeError, match=r"use_on_stream\('legacy'\).*torch.cuda.Stream"):
        tensor.use_on_stream("legacy")
    feed.close()


def test_generate_writes_the_training_set_of_sqlfeed_gen(session, tmp_path):
    rows, size = sqlfeed.generate(tmp_path / "gen", 300, files=2, image_size=16)
    assert rows == 300 and size > 0
    files = sorted(p.name for p in (tmp_path / "gen").glob("*.parquet"))
    assert len(files) == 2, files
    counted = session.sql(
        f"SELECT count(*) AS n, count(DISTINCT id) AS ids FROM '{tmp_path}/gen/*.parquet'"
    ).to_pylist()
    assert counted == [{"n": 300, "ids": 300}]
    with pytest.raises(sqlfeed.PlanError, match="files must be at least 1"):
        sqlfeed.generate(tmp_path / "none", 10, files=0)


def test_the_h2d_yardstick_needs_a_cuda_device():
    if sqlfeed.cuda_device_count() > 0:
        assert sqlfeed.raw_h2d_bytes_per_s("cuda:0", [4096], 10) > 0
        return
    with pytest.raises(sqlfeed.Error, match="cuda"):
        sqlfeed.raw_h2d_bytes_per_s("cuda:0", [4096], 10)
    with pytest.raises(sqlfeed.PlanError, match="unknown device"):
        sqlfeed.raw_h2d_bytes_per_s("tpu:0", [4096], 10)


def test_formats_numpy_jax_and_dlpack(session, ids_data):
    np = require("numpy", "numpy")
    query = f"SELECT id, CAST(id AS FLOAT) / 2 AS half FROM '{ids_data}/*.parquet'"
    batch = next(iter(session.feed(query, batch_size=8, device="cpu", format="numpy")))
    assert isinstance(batch["id"], np.ndarray) and batch["id"].dtype == np.int64
    assert np.allclose(batch["half"], batch["id"] / 2)
    raw = next(iter(session.feed(query, batch_size=8, device="cpu", format="dlpack")))
    assert isinstance(raw["id"], sqlfeed._sqlfeed.Tensor)
    jax = require("jax", "jax")
    jbatch = next(iter(session.feed(query, batch_size=8, device="cpu", format="jax")))
    assert isinstance(jbatch["id"], jax.Array)
    assert jbatch["half"].tolist() == (batch["id"] / 2).tolist()
    with pytest.raises(sqlfeed.PlanError, match="format"):
        session.feed(query, format="tensorflow")


def test_cuda_without_a_gpu_is_a_clear_error(session, ids_data):
    query = f"SELECT id FROM '{ids_data}/*.parquet'"
    if sqlfeed.cuda_device_count() > 0:
        torch = require("torch", "torch")
        batch = next(iter(session.feed(query, batch_size=8, device="cuda:0")))
        assert batch["id"].device == torch.device("cuda", 0)
        return
    with pytest.raises(sqlfeed.PlanError, match="--device cpu"):
        next(iter(session.feed(query, batch_size=8, device="cuda:0")))


def test_bad_input_raises_sqlfeed_errors_with_rust_messages(session, gen_data, tmp_path):
    with pytest.raises(sqlfeed.PlanError, match="caption"):
        next(iter(session.feed(f"SELECT caption FROM '{gen_data}/*.parquet'", device="cpu")))
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")
    with pytest.raises(sqlfeed.Error, match="bad.parquet"):
        next(iter(session.feed(f"SELECT * FROM '{bad}'", device="cpu")))
    with pytest.raises(sqlfeed.PlanError, match="shard"):
        next(iter(session.feed("SELECT 1 AS a", shard=(2, 2), device="cpu")))


def test_set_epoch_and_len_follow_the_sampler_conventions(session, ids_data):
    torch = require("torch", "torch")
    feed = session.feed(
        f"SELECT id FROM '{ids_data}/*.parquet'", batch_size=64, shuffle=5, device="cpu"
    )
    assert len(feed) == 16
    first = [b["id"] for b in feed]
    assert len(first) == 16 and feed.epoch == 1
    second = [b["id"] for b in feed]
    feed.set_epoch(0)
    again = [b["id"] for b in feed]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    dropped = session.feed(
        f"SELECT id FROM '{ids_data}/*.parquet'", batch_size=64, drop_last=True, shard=(1, 3)
    )
    assert len(dropped) == 1000 // (64 * 3)


def test_state_dict_resumes_in_a_new_process_byte_for_byte(session, ids_data, tmp_path):
    require("torch", "torch")
    query = f"SELECT id, CAST(id AS DOUBLE) * 0.5 AS x FROM '{ids_data}/*.parquet'"
    options = dict(batch_size=48, shuffle=11, epochs=2, device="cpu", format="numpy")
    digests = [(b["id"].tobytes() + b["x"].tobytes()).hex() for b in session.feed(query, **options)]
    feed = session.feed(query, **options)
    it = iter(feed)
    for _ in range(27):  # into the second epoch (21 batches each)
        next(it)
    state = json.loads(json.dumps(feed.state_dict()))
    assert (state["epoch"], state["step"]) == (1, 6)
    feed.close()
    script = textwrap.dedent(
        f"""
        import json, sys, sqlfeed
        session = sqlfeed.Session(memory_limit="1G")
        feed = session.feed({query!r}, **{options!r})
        feed.load_state_dict(json.loads(sys.argv[1]))
        for b in feed:
            print((b["id"].tobytes() + b["x"].tobytes()).hex())
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(state)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    resumed = out.stdout.split()
    # `epochs=2` is the feed's epochs in all: the resumed pass runs the rest
    # of epoch 1 and ends where the uninterrupted run ended.
    assert resumed == digests[27:]
    # A state of another seed is refused.
    other = session.feed(query, **dict(options, shuffle=12))
    with pytest.raises(sqlfeed.PlanError, match="seed"):
        other.load_state_dict(state)


def windowed_ids(folder) -> str:
    """A query over 4 files of 500 ids in row groups of 100 (windows of
    400 rows hold four whole row groups each)."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    for part in range(4):
        ids = pa.array(range(part * 500, (part + 1) * 500), pa.int64())
        pq.write_table(pa.table({"id": ids}), folder / f"part-{part}.parquet", row_group_size=100)
    return f"SELECT id FROM '{folder}/*.parquet'"


WINDOWED = dict(batch_size=100, shuffle=3, shuffle_window=400, device="cpu")


def test_a_windowed_feed_gives_row_i_of_an_epoch_by_position_to_a_map_style_loader(
    session, tmp_path
):
    query = windowed_ids(tmp_path)
    feed = session.feed(query, **dict(WINDOWED, format="numpy"))
    feed.set_epoch(1)
    epoch1 = [int(i) for b in feed for i in b["id"]]
    # The position rolled over to epoch 2's start: epoch 1 by number.
    assert feed.epoch == 2
    data = feed.dataset(1)
    assert data.epoch == 1 and len(data) == 2000
    assert data.window_rows() == [400] * 5
    assert [data[i]["id"] for i in range(0, 2000, 97)] == epoch1[::97]
    assert data[-1] == {"id": epoch1[-1]}
    with pytest.raises(IndexError, match="the epoch has 2000 rows"):
        data[2000]
    with pytest.raises(IndexError, match="the epoch has 2000 rows"):
        data[-2001]
    assert data.__getitems__([5, 1999, 0]) == [data[5], data[1999], data[0]]
    np = pytest.importorskip("numpy")
    assert data[np.int64(7)] == data[7]
    with pytest.raises(TypeError, match="cannot be pickled"):
        import pickle

        pickle.dumps(data)
    # A map-style DataLoader over it (a batch of positions per call): in
    # order, the feed's batches.
    torch = pytest.importorskip("torch")
    loader = torch.utils.data.DataLoader(data, batch_size=100, shuffle=False)
    assert [int(i) for b in loader for i in b["id"]] == epoch1
    assert feed.dataset(0)[0]["id"] != data[0]["id"]
    exact = session.feed(query, **dict(WINDOWED, shuffle_window=None))
    with pytest.raises(sqlfeed.PlanError, match="shuffle_window=n"):
        exact.dataset()


def test_a_windowed_shuffle_feeds_every_row_once_and_resumes_from_its_state(session, tmp_path):
    query = windowed_ids(tmp_path)
    options = dict(WINDOWED, format="numpy")
    epoch = [b["id"] for b in session.feed(query, **options)]
    order = [int(i) for batch in epoch for i in batch]
    assert sorted(order) == list(range(2000))
    # Each window is four whole row groups, shuffled within.
    for start in range(0, 2000, 400):
        window = order[start : start + 400]
        assert len({i // 100 for i in window}) == 4
        assert window != sorted(window)
    exact = [
        int(i) for b in session.feed(query, **dict(options, shuffle_window=None)) for i in b["id"]
    ]
    assert exact != order
    feed = session.feed(query, **options)
    it = iter(feed)
    for _ in range(7):
        next(it)
    state = feed.state_dict()
    feed.close()
    resumed = session.feed(query, **options)
    resumed.load_state_dict(state)
    assert [int(i) for b in resumed for i in b["id"]] == order[700:]
    with pytest.raises(sqlfeed.PlanError, match="shuffle_window"):
        session.feed(query, **dict(options, shuffle_window=300)).load_state_dict(state)


def two_epochs(feed):
    """The ids of epochs 0 and 1 of ``feed``, a batch a list, as a plain
    loop reads them; the two epochs differ."""
    epochs = []
    for epoch in range(2):
        feed.set_epoch(epoch)
        epochs.append([b["id"].tolist() for b in feed])
    assert epochs[0] != epochs[1]
    return epochs


def resumed_in_epoch_1(loader, before_resume=None):
    """Epochs 0 and 1 through ``loader()`` (a ``StatefulDataLoader``), the
    second stopped after 7 batches and finished by a new loader from the
    first's state: the ids a batch a list, as :func:`two_epochs` gives
    them."""
    first = loader()
    epoch0 = [b["id"].tolist() for b in first]
    mid = iter(first)
    epoch1 = [next(mid)["id"].tolist() for _ in range(7)]
    if before_resume is not None:
        before_resume()
    again = loader()
    again.load_state_dict(first.state_dict())
    rest = [b["id"].tolist() for b in again]
    return [epoch0, epoch1 + rest]


def test_stateful_dataloader_resumes_a_windowed_feed_mid_epoch(session, tmp_path):
    """torchdata's ``StatefulDataLoader`` over a windowed feed: its state
    mid-epoch, loaded by a new loader, gives the rest of that epoch as a
    plain loop reads it."""
    require("torch", "torch")
    stateful = require("torchdata.stateful_dataloader", "torchdata")
    from sqlfeed.torch import FeedDataset

    query = windowed_ids(tmp_path)
    reference = two_epochs(session.feed(query, **WINDOWED))

    def loader():
        return stateful.StatefulDataLoader(
            FeedDataset(session.feed(query, **WINDOWED)), batch_size=None, num_workers=0
        )

    assert resumed_in_epoch_1(loader) == reference


def test_ctrl_c_stops_the_feed_within_a_second_and_leaves_no_thread(session, ctrl_c_raises):
    # A first batch that takes many seconds: a large sort.
    feed = session.feed(
        "SELECT value AS v FROM generate_series(1, 30000000) ORDER BY value DESC",
        batch_size=8,
        device="cpu",
        format="dlpack",
    )
    it = iter(feed)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        next(it)
    stopped = time.monotonic() - started
    timer.cancel()
    assert stopped < 0.5 + 1.0, f"took {stopped:.2f} s"
    deadline = time.monotonic() + 10
    while feed_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert feed_threads() == 0


def test_no_thread_is_left_after_del(session, ids_data):
    feed = session.feed(f"SELECT id FROM '{ids_data}/*.parquet'", batch_size=10, device="cpu")
    it = iter(feed)
    next(it)
    assert feed_threads() > 0
    del it, feed
    gc.collect()
    assert feed_threads() == 0


def test_the_gil_is_released_while_the_loop_waits_for_a_batch(session):
    feed = session.feed(
        "SELECT value AS v FROM generate_series(1, 3000000) ORDER BY value DESC",
        batch_size=8,
        device="cpu",
        format="dlpack",
    )
    ticks = 0
    done = threading.Event()

    def count() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    started = time.monotonic()
    batch = next(iter(feed))  # a sort of 3M rows: the first batch takes a while
    waited = time.monotonic() - started
    done.set()
    counter.join()
    assert batch["v"].shape == [8]
    # The other thread ran during most of the wait (1 ms sleeps).
    assert ticks > 0.3 * waited * 1000, f"{ticks} ticks in {waited:.2f} s"
    feed.close()


def test_timestamp_dates_and_durations_feed_as_epoch_counts_or_float_seconds(session, tmp_path):
    """Issue 35: int64 counts of the column's own unit by default (UTC epoch
    time whatever the zone); ``unit`` converts, with the fraction in floats."""
    np = require("numpy", "numpy")
    pa = require("pyarrow", "arrow")
    import pyarrow.parquet as pq

    micros = [1_700_000_000_123_456, -1_500_001, 0, -1]
    table = pa.table(
        {
            "t": pa.array(micros, pa.timestamp("us", tz="UTC")),
            "tokyo": pa.array(micros, pa.timestamp("us", tz="Asia/Tokyo")),
            "d": pa.array([19_675, -1, 0, 1], pa.date32()),
            "dur": pa.array([1_500, -250, 0, 86_400_000], pa.duration("ms")),
        }
    )
    pq.write_table(table, tmp_path / "time.parquet")
    query = f"SELECT t, tokyo, d, dur, t AS secs, t AS t_ms FROM '{tmp_path}/time.parquet'"
    feed = session.feed(
        query,
        batch_size=4,
        device="cpu",
        format="numpy",
        columns={
            "secs": {"dtype": "float64", "unit": "s"},
            "t_ms": {"unit": "ms"},
            "dur": {"dtype": "float64", "unit": "s"},
        },
    )
    (batch,) = list(feed)
    assert batch["t"].dtype == np.int64 and batch["t"].tolist() == micros
    assert batch["tokyo"].tolist() == micros
    assert batch["d"].dtype == np.int64 and batch["d"].tolist() == [19_675, -1, 0, 1]
    assert batch["secs"].dtype == np.float64
    assert batch["secs"].tolist() == [1_700_000_000.123456, -1.500001, 0.0, -0.000001]
    assert batch["t_ms"].tolist() == [1_700_000_000_123, -1_501, 0, -1]  # floor
    assert batch["dur"].dtype == np.float64
    assert batch["dur"].tolist() == [1.5, -0.25, 0.0, 86_400.0]
    with pytest.raises(sqlfeed.PlanError, match="column 'x'.*unit=s"):
        next(iter(session.feed("SELECT 1 AS x", device="cpu", columns={"x": {"unit": "s"}})))
    with pytest.raises(sqlfeed.PlanError, match="unit 'h' of column 't'"):
        next(iter(session.feed(query, device="cpu", columns={"t": {"unit": "h"}})))


def test_a_feed_shuffled_by_position_is_an_exact_reproducible_order(session, tmp_path):
    query = windowed_ids(tmp_path)
    options = dict(batch_size=100, shuffle=3, shuffle_by_position=True, device="cpu")

    def epoch_ids(**extra):
        return [int(i) for b in session.feed(query, **dict(options, **extra)) for i in b["id"]]

    by_position = epoch_ids(format="numpy")
    assert sorted(by_position) == list(range(2000))
    assert by_position != list(range(2000))
    assert epoch_ids(format="numpy") == by_position
    by_content = epoch_ids(format="numpy", shuffle_by_position=False)
    assert sorted(by_content) == list(range(2000)) and by_content != by_position
    with pytest.raises(sqlfeed.PlanError, match="shuffle_by_position.*not both"):
        next(iter(session.feed(query, **dict(options, shuffle_window=400))))


def test_a_feed_by_position_that_does_not_fit_its_memory_limit_gives_the_same_batches(
    tmp_path,
):
    """An epoch shuffled by position that does not fit ``memory_limit``
    (300k rows of two int64 columns, about 4.8 MB, in 2 MB) is spilled by
    position range: two epochs give the batches a roomy session gives."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    for part in range(2):
        ids = pa.array(range(part * 150_000, (part + 1) * 150_000), pa.int64())
        v = pa.array(range(part * 450_000, (part + 1) * 450_000, 3), pa.int64())
        table = pa.table({"id": ids, "v": v})
        pq.write_table(table, tmp_path / f"part-{part}.parquet", row_group_size=50_000)
    query = f"SELECT id, v FROM '{tmp_path}/*.parquet'"

    def epochs(memory_limit):
        session = sqlfeed.Session(memory_limit=memory_limit, target_partitions=2)
        feed = session.feed(
            query,
            batch_size=4096,
            shuffle=5,
            shuffle_by_position=True,
            epochs=2,
            device="cpu",
            format="numpy",
        )
        return [b["id"].tolist() for b in feed]

    roomy = epochs("256M")
    assert sum(len(b) for b in roomy) == 600_000
    assert roomy[0] != sorted(roomy[0])
    assert epochs("2M") == roomy


def test_a_cached_feed_by_position_gives_the_uncached_batches(tmp_path):
    """``cache=True`` with ``shuffle_by_position=True``: the first epoch
    stores its rows in its order, later epochs read them in theirs; every
    epoch is the uncached feed's, and another session's feed is served from
    the entry."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    for part in range(2):
        rows = range(part * 3_000, (part + 1) * 3_000)
        table = pa.table(
            {"id": pa.array(rows, pa.int64()), "v": pa.array([i * 3 for i in rows], pa.int64())}
        )
        pq.write_table(table, tmp_path / f"part-{part}.parquet", row_group_size=1_000)
    query = f"SELECT id, v FROM '{tmp_path}/*.parquet' WHERE v % 7 <> 3"

    def epochs(cache):
        session = sqlfeed.Session(target_partitions=2, cache_dir=tmp_path / "cache")
        feed = session.feed(
            query,
            batch_size=256,
            shuffle=5,
            shuffle_by_position=True,
            epochs=3,
            cache=cache,
            device="cpu",
            format="numpy",
        )
        return [b["id"].tolist() for b in feed]

    plain = epochs(False)
    assert sum(len(b) for b in plain) == 3 * sum(1 for i in range(6_000) if i * 3 % 7 != 3)
    assert epochs(True) == plain
    assert list((tmp_path / "cache" / "entries").iterdir()), "no entry was written"
    assert epochs(True) == plain


def test_stateful_dataloader_resumes_a_cached_feed_by_position_from_the_entry(tmp_path):
    """torchdata's ``StatefulDataLoader`` over a cached feed by position: its
    state in epoch 1, loaded by a loader of another session (served from the
    entry the first filled), gives the rest of that epoch as the uncached
    feed has it."""
    require("torch", "torch")
    stateful = require("torchdata.stateful_dataloader", "torchdata")
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from sqlfeed.torch import FeedDataset

    for part in range(2):
        rows = range(part * 2_000, (part + 1) * 2_000)
        table = pa.table({"id": pa.array(rows, pa.int64())})
        pq.write_table(table, tmp_path / f"part-{part}.parquet", row_group_size=500)
    query = f"SELECT id FROM '{tmp_path}/*.parquet'"
    options = dict(
        batch_size=128, shuffle=9, shuffle_by_position=True, device="cpu", format="numpy"
    )

    def feed(cache):
        session = sqlfeed.Session(target_partitions=2, cache_dir=tmp_path / "cache")
        return session.feed(query, cache=cache, **options)

    reference = two_epochs(feed(False))

    def loader():
        return stateful.StatefulDataLoader(FeedDataset(feed(True)), batch_size=None, num_workers=0)

    def entry_written():
        assert list((tmp_path / "cache" / "entries").iterdir()), "no entry was written"

    assert resumed_in_epoch_1(loader, before_resume=entry_written) == reference


def test_a_feed_shuffled_by_position_gives_row_i_to_a_sampled_map_style_loader(session, tmp_path):
    """``dataset(epoch)`` of a feed shuffled by position: row ``i`` is the
    feed's ``i``-th row of that epoch, also for a ``DataLoader`` that draws
    its positions at random (each batch reads its row groups once)."""
    torch = require("torch", "torch")
    query = windowed_ids(tmp_path)
    feed = session.feed(
        query, batch_size=100, shuffle=3, shuffle_by_position=True, device="cpu", format="numpy"
    )
    feed.set_epoch(1)
    epoch1 = [int(i) for b in feed for i in b["id"]]
    data = feed.dataset(1)
    assert len(data) == 2000
    assert [data[i]["id"] for i in range(0, 2000, 131)] == epoch1[::131]
    assert data[-1] == {"id": epoch1[-1]}
    with pytest.raises(IndexError, match="the epoch has 2000 rows"):
        data[2000]
    with pytest.raises(sqlfeed.PlanError, match="shuffled by position"):
        data.window_rows()

    def sampler():
        return torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(0))

    loader = torch.utils.data.DataLoader(data, batch_size=250, sampler=sampler())
    drawn = list(sampler())
    assert [int(i) for b in loader for i in b["id"]] == [epoch1[i] for i in drawn]
