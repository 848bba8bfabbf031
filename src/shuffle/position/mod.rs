//! `SHUFFLE BY POSITION`: an exact uniform shuffle keyed by where each row
//! lives (its Parquet file and row), not by its content.
//!
//! ```sql
//! SELECT … FROM 'data/*.parquet' WHERE … SHUFFLE BY POSITION [SEED s] [EPOCH e];
//! ```
//!
//! # Why
//! `SHUFFLE` orders rows by a hash of their content: after the scan it still
//! hashes every row, places a 16-byte index entry per row in key-range
//! groups and looks for repeated rows before its first batch (20M narrow
//! rows: about 2.5 s to the first batch against a 1.1 s scan, see
//! docs/scaling.md). Keyed by position, the order is known before any row
//! is read: nothing is hashed, no index is built, no row can repeat. The
//! first batch waits for the scan alone, and the rows are held without the
//! index and the key.
//!
//! # Definition of the order
//! The rows that reach the shuffle are ranked by `(file path, row index in
//! the file)` (their *canonical rank*, `0..n`, counted after the query's
//! filters). Position `p` of epoch `e` holds the row of canonical rank
//! `π(p)`, with `π` the [`IndexPermutation`] of `0..n` for `(seed, e)`: a
//! pseudorandom bijection computed one position at a time.
//!
//! # What it keeps and what it trades
//! - The same on any partition count, batch size, number of threads, and
//!   across a resume: ranks come from the files, not from arrival order.
//! - Uniform: a pseudorandom permutation of the rows; copies of a row
//!   (equal content in two places) are spread like any two rows.
//! - Traded: the order follows the files, not the rows' content. The same
//!   rows rewritten into other files, or in another order, or a file
//!   renamed, give another order; appending files changes every position
//!   (`n` changes), and so does the same data under another path.
//!   `SHUFFLE`, keyed by content, gives the same order for
//!   the same rows however they are laid out: keep it where that matters.
//!
//! # Data flow
//! ```text
//!  input partitions (scan with input_file_name(), file_row_index();
//!    p0    p1   …   pN-1                        filters, projections)
//!    │     │        │     one task each: drop the two position columns,
//!    ▼     ▼        ▼     cut the batch into runs (one file, rows rising),
//!  held batches + runs    reserve the batch from the session's pool
//!         │ end of input
//!         ▼
//!  runs sorted by (file, first row) → canonical rank of every held row
//!         │ position p → π(p) → (batch, row)      (no per-row index)
//!         ▼
//!  batches of `batch_size` positions, gathered with `interleave`
//!
//!  (the pool refuses a batch: the epoch is spilled by position range,
//!   see [`spilled`])
//! ```
//!
//! # Memory
//! An epoch that fits is held whole until the output ends (any position
//! may need any row): the held batches are reserved from the session's
//! pool. On top of the rows: about 64 bytes per run (a run is a batch's
//! rows of one file) and 4 bytes per 4,096 rows; a run with holes (a
//! filter's) keeps its row indexes, 8 bytes a row, to be ranked even when
//! partitions interleave rows of one file. Batches are held as the scan
//! gives them until the pool first refuses one; then every held column with
//! more than an eighth of its buffers unused (the Parquet reader grows
//! binary and string buffers by doubling: W2's 3 KB images were charged
//! 4.6 KB a row) is copied to fit, and so is each batch after it, unless
//! the epoch's rows (known when no filter drops any) say it would not fit
//! even so: then it is spilled at once. Only an epoch near the limit pays
//! for the copy, and one that fits without the room is held. An epoch
//! whose first rows (at least 8 batches and a 128th of its rows), fitted
//! and scaled to its rows, take more than twice its room is spilled then,
//! without reading up to the limit first (metric `judged_early`), unless
//! ranges sized by those rows would be too many.
//!
//! An epoch the pool refuses is **spilled by position range** instead (see
//! [`spilled`]): the rows held so far are dropped (or none is held, when
//! the epoch is known not to fit: rows counted by the footers, every column
//! of a fixed width, more bytes than the pool has free), the input is read
//! again
//! and each row, its position known from its rank (`π⁻¹`), is written to
//! the spill file of its range of positions; the ranges are then read back
//! one after another, each a quarter of what fitted. The order is the
//! same; memory stays under the limit; the rows are written and read once
//! more (under a filter, counted first by a read of the filters' columns);
//! the first batch waits for the whole epoch to be spilled.
//!
//! A feed starts its next epoch ahead when the pool has room for a second
//! epoch as large as what the current one holds, or, beside an epoch that
//! spilled (its read-back reserved up front, at most a third of the pool,
//! metric `read_back_bytes`), when as much as that read-back is free: the
//! next epoch then spills beside it with ranges sized from what is free.
//! Else it starts when this one ends.
//!
//! # The epoch cache
//! A cached feed's first epoch `b` stores its rows in its own order; a
//! later epoch `e` reads them through [`StoredOrderExec`], which ranks each
//! stored row by where it comes (row `i` of the entry has rank `π_b(i)`),
//! and the permutation `π_b⁻¹ ∘ π_e`
//! ([`IndexPermutation::over_stored`]): the same rows at the same
//! positions as read from the files, held whole or spilled alike.
//!
//! # Paths
//! Files are ranked by their path as the object store names it: for local
//! files the absolute path. Ranks of one training run must see the data at
//! the same paths (or the same bucket keys) to share one order.
//!
//! # Where it runs
//! The embedded engine, as drawn above. On a Ballista cluster the
//! scheduler places the row groups (from the footers, or under a filter
//! the rows it keeps: counted by a feed's rank once per run and sent with
//! the job, or by the scheduler for a plain query) and keys every row by its position ([`PositionKeyExec`], on the executors
//! as the rows are scanned), and the job sorts key ranges as `SHUFFLE`'s
//! does, without its copy stage (no two rows share a position): the same
//! order, dealt to ranks like any cluster feed's. The scan's row index
//! travels to the executors as `crate::cluster`'s `RowIndexScanExec`. An
//! epoch read from the epoch cache (`StoredOrderExec`) runs where the
//! entry is, on the rank's machine.
//!
//! # Ordering
//! One output partition in the permutation's order.

mod canonical;
mod exec;
mod keyed;
mod permutation;
mod placement;
mod ranks;
mod scan_position;
mod spilled;
mod stored;

pub use exec::PositionShuffleExec;
pub use keyed::{PositionKeyExec, PositionKeys};
pub use permutation::IndexPermutation;
pub use ranks::RankedRowGroups;
pub(crate) use scan_position::with_positions;
pub use stored::StoredOrderExec;
