//! The wire format of sqlfeed's plan nodes: protobuf messages (prost), with
//! fixed field numbers and a format version checked on decoding.
//!
//! ```text
//!  payload = "sqlfeed" ‖ format byte (WIRE_FORMAT) ‖ protobuf Envelope
//!  Envelope { version = 1; oneof node { shuffle = 2; shuffle_key = 3;
//!             shuffle_root = 4; local_shuffle = 5; permute = 6; function = 7;
//!             range_bucket = 8; deal = 9; rank_shard = 10;
//!             shared_entry_write = 11; user_function = 12; mix = 13;
//!             mix_exec = 14; mix_window = 15; parallel_projection = 16;
//!             position_key = 17; row_index_scan = 18 } }
//! ```
//!
//! # Compatibility
//! Field numbers are never reused: a new field gets a new number and
//! decoders of this version ignore it (protobuf's rule), so adding optional
//! information needs no version change. A change that an older decoder would
//! misread (a changed meaning, a removed field) raises
//! [`WIRE_VERSION`]; a process receiving another version fails with an error
//! naming both versions instead of running a plan it does not understand.
//! The format byte after the prefix tells this format (2) from the JSON
//! payloads of earlier builds (1), which are refused by name.

use datafusion::common::plan_datafusion_err;
use datafusion::error::Result;
use prost::Message;
use sqlfeed_udfs::user::{volatility_name, volatility_named};

mod messages;
use messages::*;

use crate::shuffle::mix::MixSpec;
use crate::shuffle::mix::pattern::{TurnsOrigin, Window};
use crate::shuffle::{
    CopyIdentity, Deal, KeySource, PositionKeys, ShuffleKey, ShuffleSpec,
};

/// What a sqlfeed payload holds: the nodes of sqlfeed's codecs
/// (`super::codec`), as the messages below carry them.
#[derive(Debug, Clone, PartialEq)]
pub enum WireNode {
    /// `ShuffleNode`.
    Shuffle {
        /// How.
        spec: ShuffleSpec,
        /// What the content hash is computed from.
        key: ShuffleKey,
    },
    /// `ShuffleKeyExec`.
    ShuffleKey {
        /// The seed.
        seed: u64,
        /// The epoch.
        epoch: u64,
        /// Where the content hash comes from.
        source: KeySource,
    },
    /// `ShuffleMergeExec`.
    ShuffleRoot {
        /// The seed.
        seed: u64,
        /// The epoch.
        epoch: u64,
        /// Batch size of its subtree.
        batch_rows: usize,
        /// Over key ranges, one per partition (`ShuffleMergeExec::ranged`).
        ranged: bool,
        /// Planned for unique rows: a repeated row fails the task
        /// (`ShuffleMergeExec::unique_rows`).
        unique_rows: bool,
        /// Which columns make two rows copies (`ShuffleMergeExec::copies`).
        copies: CopyIdentity,
    },
    /// `RowIndexScanExec`.
    RowIndexScan {
        /// Each projected expression as DataFusion's encoded
        /// `PhysicalExprNode`, `file_row_index()` in place of the row index.
        exprs: Vec<Vec<u8>>,
        /// Each projected column's name.
        names: Vec<String>,
    },
    /// `PositionKeyExec`.
    PositionKey {
        /// Where it places every row.
        keys: PositionKeys,
    },
    /// `RangeBucketExec`.
    RangeBucket {
        /// The number of key ranges.
        ranges: usize,
        /// Whether tasks end with count rows.
        counted: bool,
    },
    /// `DealExec`.
    Deal {
        /// The feed's batching.
        deal: Deal,
        /// The key ranges it reads.
        ranges: usize,
    },
    /// `RankShardExec`.
    RankShard,
    /// `ParallelProjectionExec`.
    ParallelProjection {
        /// Each expression as DataFusion's encoded `PhysicalExprNode`.
        exprs: Vec<Vec<u8>>,
        /// The output names.
        names: Vec<String>,
        /// Morsels evaluated at once per partition.
        workers: usize,
        /// Target output bytes per morsel.
        batch_bytes: usize,
        /// Failing rows marked rather than fatal.
        isolate_row_errors: bool,
    },
    /// `SharedEntryWriteNode` (logical) and `SharedEntryWriteExec`.
    SharedEntryWrite {
        /// The entry folder.
        dir: String,
    },
    /// `LocalShuffleExec`.
    LocalShuffle {
        /// Rows held per partition.
        buffer_rows: usize,
        /// The seed.
        seed: u64,
    },
    /// `PermuteExec`.
    Permute {
        /// `PermuteMode::PerPartition` (the stage-shaped plan) rather than
        /// `PermuteMode::Gather`.
        per_partition: bool,
        /// `PermuteMode::Ranged` (overrides `per_partition`).
        ranged: bool,
        /// Which columns make two rows copies (`PermuteExec::copies`).
        copies: CopyIdentity,
    },

    /// `MixNode` (logical).
    Mix {
        /// Sources, weights, rows, seed, epoch and schedules.
        spec: MixSpec,
    },
    /// `MixExec`.
    MixExec {
        /// Each source's name and the rows the epoch takes from it, in the
        /// order of the node's inputs.
        sources: Vec<(String, u64)>,
        /// What its turns are built from.
        turns: TurnsOrigin,
        /// Which of its columns are nullable (the sources' may differ).
        nullable: Vec<bool>,
    },
    /// `MixWindowExec`.
    MixWindow {
        /// The source's name.
        source: String,
        /// The rows of its passes the epoch takes.
        window: Window,
    },

    /// A sqlfeed function, resolved by name where it is decoded.
    Function,
    /// A plugin's or a Python function, resolved by name where it is
    /// decoded and checked to be the same code there (content hash of the
    /// library, or of the Python function's code).
    UserFunction {
        /// `sqlfeed_udfs::user::UserFunction::identity` on the sender.
        identity: String,
        /// Where it came from on the sender, for messages.
        origin: String,
        /// A Python function's declaration, which a scheduler plans with
        /// (see `super::declared`); `None` for a plugin's function.
        python: Option<crate::cluster::PythonDeclaration>,
    },
}

/// Prefix of every payload sqlfeed's codecs write.
pub const PREFIX: &[u8] = b"sqlfeed";

/// The byte after [`PREFIX`]: 1 was JSON, 2 is protobuf.
pub const WIRE_FORMAT: u8 = 2;

/// The version of the messages below; see the module docs.
pub const WIRE_VERSION: u32 = 4;

fn to_points(schedules: &[Vec<(u64, f64)>]) -> Vec<SchedulePoints> {
    schedules
        .iter()
        .map(|points| SchedulePoints {
            steps: points.iter().map(|(step, _)| *step).collect(),
            weights: points.iter().map(|(_, weight)| *weight).collect(),
        })
        .collect()
}

fn from_points(
    schedules: Vec<SchedulePoints>,
) -> std::result::Result<Vec<Vec<(u64, f64)>>, String> {
    schedules
        .into_iter()
        .map(|points| {
            if points.steps.len() != points.weights.len() {
                return Err(format!(
                    "a schedule has {} steps and {} weights",
                    points.steps.len(),
                    points.weights.len()
                ));
            }
            Ok(points.steps.into_iter().zip(points.weights).collect())
        })
        .collect()
}

/// `node` as a payload, appended to `buf`.
pub fn encode(node: &WireNode, buf: &mut Vec<u8>) -> Result<()> {
    let message = to_message(node)?;
    buf.extend_from_slice(PREFIX);
    buf.push(WIRE_FORMAT);
    buf.extend(
        Envelope {
            version: WIRE_VERSION,
            node: Some(message),
        }
        .encode_to_vec(),
    );
    Ok(())
}

/// The node in `buf`, or `None` when the payload is not sqlfeed's.
pub fn decode(buf: &[u8]) -> Result<Option<WireNode>> {
    let Some(rest) = buf.strip_prefix(PREFIX) else {
        return Ok(None);
    };
    let mismatch = |what: String| {
        plan_datafusion_err!(
            "cannot decode a sqlfeed plan node: {what}; this process is sqlfeed {} \
             (wire format {WIRE_FORMAT}, version {WIRE_VERSION}): run the same sqlfeed \
             version on client, scheduler and executors",
            env!("CARGO_PKG_VERSION")
        )
    };
    let Some((&format, message)) = rest.split_first() else {
        return Err(mismatch("the payload is empty".into()));
    };
    if format != WIRE_FORMAT {
        return Err(mismatch(format!("it is in wire format {format}")));
    }
    let envelope = Envelope::decode(message)
        .map_err(|e| mismatch(format!("invalid protobuf ({e})")))?;
    if envelope.version != WIRE_VERSION {
        return Err(mismatch(format!(
            "it is of wire version {}",
            envelope.version
        )));
    }
    let node = envelope
        .node
        .ok_or_else(|| mismatch("it holds no node this version knows".into()))?;
    from_message(node).map(Some).map_err(mismatch)
}

fn to_message(node: &WireNode) -> Result<Node> {
    Ok(match node {
        WireNode::Shuffle { spec, key } => Node::Shuffle(Shuffle {
            spec: Some(Spec {
                kind: Some(match *spec {
                    ShuffleSpec::Global { seed, epoch } => {
                        SpecKind::Global(Global { seed, epoch })
                    }
                    ShuffleSpec::Windowed {
                        seed,
                        epoch,
                        window_rows,
                        only_window,
                    } => SpecKind::Windowed(Windowed {
                        seed,
                        epoch,
                        window_rows,
                        only_window,
                    }),
                    ShuffleSpec::Positional { seed, epoch } => {
                        SpecKind::Positional(Global { seed, epoch })
                    }
                    ShuffleSpec::Local { buffer_rows, seed } => {
                        SpecKind::Local(LocalShuffle {
                            buffer_rows: buffer_rows as u64,
                            seed,
                        })
                    }
                }),
            }),
            key: Some(Key {
                kind: Some(match key {
                    ShuffleKey::AllColumns => KeyKind::AllColumns(Empty {}),
                    ShuffleKey::Columns(names) => KeyKind::Columns(Names {
                        names: names.clone(),
                    }),
                    ShuffleKey::ContentHash(name) => KeyKind::ContentHash(name.clone()),
                    ShuffleKey::StoredOrder(_) => {
                        return Err(crate::shuffle::refused_by_position_on_a_cluster());
                    }
                }),
            }),
        }),
        WireNode::ShuffleKey {
            seed,
            epoch,
            source,
        } => Node::ShuffleKey(ShuffleKeyNode {
            seed: *seed,
            epoch: *epoch,
            source: Some(Source {
                kind: Some(match source {
                    KeySource::AllColumns => SourceKind::AllColumns(Empty {}),
                    KeySource::Columns(positions) => SourceKind::Columns(Positions {
                        positions: positions.iter().map(|&p| p as u64).collect(),
                    }),
                    KeySource::ContentHash(position) => {
                        SourceKind::ContentHash(*position as u64)
                    }
                }),
            }),
        }),
        WireNode::ShuffleRoot {
            seed,
            epoch,
            batch_rows,
            ranged,
            unique_rows,
            copies,
        } => Node::ShuffleRoot(ShuffleRoot {
            seed: *seed,
            epoch: *epoch,
            batch_rows: *batch_rows as u64,
            ranged: *ranged,
            unique_rows: *unique_rows,
            copies_by_column: copies_by_column(*copies),
        }),
        WireNode::ParallelProjection {
            exprs,
            names,
            workers,
            batch_bytes,
            isolate_row_errors,
        } => Node::ParallelProjection(ParallelProjectionNode {
            exprs: exprs.clone(),
            names: names.clone(),
            workers: *workers as u64,
            batch_bytes: *batch_bytes as u64,
            isolate_row_errors: *isolate_row_errors,
        }),
        WireNode::RowIndexScan { exprs, names } => Node::RowIndexScan(RowIndexScanNode {
            exprs: exprs.clone(),
            names: names.clone(),
        }),
        WireNode::PositionKey { keys } => Node::PositionKey(PositionKeyNode {
            seed: keys.seed,
            epoch: keys.epoch,
            ranges: keys.ranges as u64,
            counted: keys.counted,
            starts: keys.starts.clone(),
            files: keys
                .files
                .iter()
                .map(|(path, groups)| PositionFile {
                    path: path.clone(),
                    first_rows: groups.iter().map(|&(first, _)| first).collect(),
                    groups: groups.iter().map(|&(_, group)| group as u64).collect(),
                })
                .collect(),
        }),
        WireNode::RangeBucket { ranges, counted } => Node::RangeBucket(RangeBucket {
            ranges: *ranges as u64,
            counted: *counted,
        }),
        WireNode::Deal { deal, ranges } => Node::Deal(DealNode {
            batch_rows: deal.batch_rows as u64,
            world: deal.world as u64,
            drop_last: deal.drop_last,
            ranges: *ranges as u64,
            span: deal.span.map(|span| EpochSpanNode {
                offset: span.offset,
                window_rows: span.window_rows,
                rows: span.rows,
            }),
        }),
        WireNode::RankShard => Node::RankShard(Empty {}),
        WireNode::SharedEntryWrite { dir } => {
            Node::SharedEntryWrite(SharedEntryWrite { dir: dir.clone() })
        }
        WireNode::LocalShuffle { buffer_rows, seed } => {
            Node::LocalShuffle(LocalShuffle {
                buffer_rows: *buffer_rows as u64,
                seed: *seed,
            })
        }
        WireNode::Permute {
            per_partition,
            ranged,
            copies,
        } => Node::Permute(Permute {
            per_partition: *per_partition,
            ranged: *ranged,
            copies_by_column: copies_by_column(*copies),
        }),
        WireNode::Mix { spec } => Node::Mix(MixSpecNode {
            names: spec.names.clone(),
            weights: spec.weights(),
            rows: spec.rows,
            seed: spec.seed,
            epoch: spec.epoch,
            schedules: to_points(&spec.schedule_points()),
            step_rows: spec.step_rows,
        }),
        WireNode::MixExec {
            sources,
            turns,
            nullable,
        } => Node::MixExec(MixExecNode {
            nullable: nullable.clone(),
            names: sources.iter().map(|(name, _)| name.clone()).collect(),
            takes: sources.iter().map(|(_, take)| *take).collect(),
            turns: Some(match turns {
                TurnsOrigin::Fixed { quotas } => TurnsKind::Fixed(Positions {
                    positions: quotas.clone(),
                }),
                TurnsOrigin::Scheduled {
                    schedules,
                    step_rows,
                    epoch,
                    rows,
                } => TurnsKind::Scheduled(ScheduledTurnsNode {
                    schedules: to_points(schedules),
                    step_rows: *step_rows,
                    epoch: *epoch,
                    rows: *rows,
                }),
            }),
        }),
        WireNode::MixWindow { source, window } => Node::MixWindow(MixWindowNode {
            source: source.clone(),
            first_pass: window.first_pass,
            passes: window.passes,
            skip: window.skip,
            take: window.take,
        }),
        WireNode::Function => Node::Function(Empty {}),
        WireNode::UserFunction {
            identity,
            origin,
            python,
        } => Node::UserFunction(UserFunctionNode {
            identity: identity.clone(),
            origin: origin.clone(),
            python: python
                .as_ref()
                .map(python_declaration_to_message)
                .transpose()?,
        }),
    })
}

/// A message field that must be set, or what is missing.
fn required<T>(value: Option<T>, what: &str) -> std::result::Result<T, String> {
    value.ok_or_else(|| format!("its {what} is missing"))
}

/// An error unless a mixture of the sources `names` has one of `what` per
/// source (`count` in all).
fn one_per_source(
    names: &[String],
    count: usize,
    what: &str,
) -> std::result::Result<(), String> {
    if count != names.len() {
        return Err(format!(
            "its mixture has {} sources and {count} {what}",
            names.len()
        ));
    }
    Ok(())
}

/// A [`CopyIdentity`] as its message field: the content hash column's
/// position, absent for [`CopyIdentity::Values`].
fn copies_by_column(copies: CopyIdentity) -> Option<u64> {
    match copies {
        CopyIdentity::Values => None,
        CopyIdentity::ContentHash(index) => Some(index as u64),
    }
}

/// The [`CopyIdentity`] of a message field written by [`copies_by_column`].
fn python_declaration_to_message(
    declaration: &crate::cluster::PythonDeclaration,
) -> Result<PythonDeclarationNode> {
    use crate::cluster::DeclaredArgs;
    use crate::cluster::declared::types_to_ipc;
    let (exact_args, any_args) = match &declaration.args {
        DeclaredArgs::Exact(types) => (Some(types_to_ipc(types)?), None),
        DeclaredArgs::Any(n) => (None, Some(*n as u64)),
        DeclaredArgs::Variadic => (None, None),
    };
    Ok(PythonDeclarationNode {
        qualname: declaration.qualname.clone(),
        exact_args,
        any_args,
        return_type: types_to_ipc(std::slice::from_ref(&declaration.return_type))?,
        volatility: volatility_name(declaration.volatility).into(),
        costly: declaration.costly,
    })
}

fn python_declaration_from_message(
    node: PythonDeclarationNode,
) -> Result<crate::cluster::PythonDeclaration> {
    use crate::cluster::DeclaredArgs;
    use crate::cluster::declared::types_from_ipc;
    let args =
        match (node.exact_args, node.any_args) {
            (Some(bytes), _) => DeclaredArgs::Exact(types_from_ipc(&bytes)?),
            (None, Some(n)) => DeclaredArgs::Any(usize::try_from(n).map_err(|_| {
                plan_datafusion_err!("a Python function with {n} arguments")
            })?),
            (None, None) => DeclaredArgs::Variadic,
        };
    let [return_type] = &types_from_ipc(&node.return_type)?[..] else {
        return Err(plan_datafusion_err!(
            "Python function '{}': its declared return type is not one type",
            node.qualname
        ));
    };
    let Some(volatility) = volatility_named(&node.volatility) else {
        return Err(plan_datafusion_err!(
            "Python function '{}': unknown volatility '{}'",
            node.qualname,
            node.volatility
        ));
    };
    Ok(crate::cluster::PythonDeclaration {
        qualname: node.qualname,
        args,
        return_type: return_type.clone(),
        volatility,
        costly: node.costly,
    })
}

fn copy_identity(column: Option<u64>) -> std::result::Result<CopyIdentity, String> {
    Ok(match column {
        None => CopyIdentity::Values,
        Some(index) => CopyIdentity::ContentHash(usize_of(index, "content hash column")?),
    })
}

fn usize_of(value: u64, what: &str) -> std::result::Result<usize, String> {
    usize::try_from(value)
        .map_err(|_| format!("its {what} {value} does not fit this machine"))
}

fn from_message(node: Node) -> std::result::Result<WireNode, String> {
    Ok(match node {
        Node::Shuffle(shuffle) => {
            let spec = match required(
                required(shuffle.spec, "shuffle spec")?.kind,
                "shuffle kind",
            )? {
                SpecKind::Global(Global { seed, epoch }) => {
                    ShuffleSpec::Global { seed, epoch }
                }
                SpecKind::Local(local) => ShuffleSpec::Local {
                    buffer_rows: usize_of(local.buffer_rows, "buffer rows")?,
                    seed: local.seed,
                },
                SpecKind::Positional(Global { seed, epoch }) => {
                    ShuffleSpec::Positional { seed, epoch }
                }
                SpecKind::Windowed(windowed) => ShuffleSpec::Windowed {
                    seed: windowed.seed,
                    epoch: windowed.epoch,
                    window_rows: windowed.window_rows,
                    only_window: windowed.only_window,
                },
            };
            let key =
                match required(required(shuffle.key, "shuffle key")?.kind, "key kind")? {
                    KeyKind::AllColumns(_) => ShuffleKey::AllColumns,
                    KeyKind::Columns(names) => ShuffleKey::Columns(names.names),
                    KeyKind::ContentHash(name) => ShuffleKey::ContentHash(name),
                };
            WireNode::Shuffle { spec, key }
        }
        Node::ShuffleKey(node) => {
            let source =
                match required(required(node.source, "key source")?.kind, "source kind")?
                {
                    SourceKind::AllColumns(_) => KeySource::AllColumns,
                    SourceKind::Columns(positions) => KeySource::Columns(
                        positions
                            .positions
                            .into_iter()
                            .map(|p| usize_of(p, "key column"))
                            .collect::<std::result::Result<_, _>>()?,
                    ),
                    SourceKind::ContentHash(position) => {
                        KeySource::ContentHash(usize_of(position, "content hash column")?)
                    }
                };
            WireNode::ShuffleKey {
                seed: node.seed,
                epoch: node.epoch,
                source,
            }
        }
        Node::ShuffleRoot(root) => WireNode::ShuffleRoot {
            seed: root.seed,
            epoch: root.epoch,
            batch_rows: usize_of(root.batch_rows, "batch rows")?,
            ranged: root.ranged,
            unique_rows: root.unique_rows,
            copies: copy_identity(root.copies_by_column)?,
        },
        Node::ParallelProjection(projection) => WireNode::ParallelProjection {
            exprs: projection.exprs,
            names: projection.names,
            workers: usize_of(projection.workers, "workers")?,
            batch_bytes: usize_of(projection.batch_bytes, "batch bytes")?,
            isolate_row_errors: projection.isolate_row_errors,
        },
        Node::RowIndexScan(node) => {
            // Empty: a message of the retired form (tags 1 and 2), or
            // damaged; a scan reading a row index projects at least it.
            if node.exprs.len() != node.names.len() || node.exprs.is_empty() {
                return Err("its projection is damaged".to_string());
            }
            WireNode::RowIndexScan {
                exprs: node.exprs,
                names: node.names,
            }
        }
        Node::PositionKey(node) => WireNode::PositionKey {
            keys: PositionKeys {
                seed: node.seed,
                epoch: node.epoch,
                ranges: usize_of(node.ranges, "range count")?,
                counted: node.counted,
                starts: node.starts,
                files: node
                    .files
                    .into_iter()
                    .map(|file| {
                        if file.first_rows.len() != file.groups.len() {
                            return Err(format!(
                                "its row groups of {} are damaged",
                                file.path
                            ));
                        }
                        let groups = file
                            .first_rows
                            .into_iter()
                            .zip(file.groups)
                            .map(|(first, group)| {
                                Ok((first, usize_of(group, "row group")?))
                            })
                            .collect::<std::result::Result<Vec<_>, String>>()?;
                        Ok((file.path, groups))
                    })
                    .collect::<std::result::Result<Vec<_>, String>>()?,
            },
        },
        Node::RangeBucket(bucket) => WireNode::RangeBucket {
            ranges: usize_of(bucket.ranges, "range count")?,
            counted: bucket.counted,
        },
        Node::Deal(deal) => WireNode::Deal {
            deal: crate::shuffle::Deal {
                batch_rows: usize_of(deal.batch_rows, "batch rows")?,
                world: usize_of(deal.world, "world size")?,
                drop_last: deal.drop_last,
                span: deal.span.map(|span| crate::shuffle::EpochSpan {
                    offset: span.offset,
                    window_rows: span.window_rows,
                    rows: span.rows,
                }),
            },
            ranges: usize_of(deal.ranges, "range count")?,
        },
        Node::RankShard(_) => WireNode::RankShard,
        Node::SharedEntryWrite(write) => WireNode::SharedEntryWrite { dir: write.dir },
        Node::LocalShuffle(local) => WireNode::LocalShuffle {
            buffer_rows: usize_of(local.buffer_rows, "buffer rows")?,
            seed: local.seed,
        },
        Node::Permute(permute) => WireNode::Permute {
            per_partition: permute.per_partition,
            ranged: permute.ranged,
            copies: copy_identity(permute.copies_by_column)?,
        },
        Node::Mix(mix) => {
            one_per_source(&mix.names, mix.weights.len(), "weights")?;
            WireNode::Mix {
                spec: MixSpec::new(
                    mix.names,
                    &mix.weights,
                    mix.rows,
                    mix.seed,
                    mix.epoch,
                )
                .with_schedules(&from_points(mix.schedules)?, mix.step_rows),
            }
        }
        Node::MixExec(mix) => {
            one_per_source(&mix.names, mix.takes.len(), "shares")?;
            let turns = match required(mix.turns, "mixture turns")? {
                TurnsKind::Fixed(quotas) => TurnsOrigin::Fixed {
                    quotas: quotas.positions,
                },
                TurnsKind::Scheduled(turns) => TurnsOrigin::Scheduled {
                    schedules: from_points(turns.schedules)?,
                    step_rows: turns.step_rows,
                    epoch: turns.epoch,
                    rows: turns.rows,
                },
            };
            WireNode::MixExec {
                sources: mix.names.into_iter().zip(mix.takes).collect(),
                turns,
                nullable: mix.nullable,
            }
        }
        Node::MixWindow(window) => WireNode::MixWindow {
            source: window.source,
            window: Window {
                first_pass: window.first_pass,
                passes: window.passes,
                skip: window.skip,
                take: window.take,
            },
        },
        Node::Function(_) => WireNode::Function,
        Node::UserFunction(f) => WireNode::UserFunction {
            identity: f.identity,
            origin: f.origin,
            python: f
                .python
                .map(python_declaration_from_message)
                .transpose()
                .map_err(|e| e.to_string())?,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every node, with every variant of what it holds.
    fn every_node() -> Vec<WireNode> {
        let specs = [
            ShuffleSpec::Global {
                seed: u64::MAX,
                epoch: 3,
            },
            ShuffleSpec::Local {
                buffer_rows: 4096,
                seed: 0,
            },
            ShuffleSpec::Windowed {
                seed: 5,
                epoch: 1,
                window_rows: 65_536,
                only_window: None,
            },
            ShuffleSpec::Windowed {
                seed: 5,
                epoch: 1,
                window_rows: 65_536,
                only_window: Some(0),
            },
            ShuffleSpec::Positional { seed: 9, epoch: 4 },
        ];
        let keys = [
            ShuffleKey::AllColumns,
            ShuffleKey::Columns(vec!["label".into(), "__sqlfeed_row_0".into()]),
            ShuffleKey::ContentHash("__sqlfeed_content_hash".into()),
        ];
        let mut nodes = vec![];
        for spec in specs {
            for key in &keys {
                nodes.push(WireNode::Shuffle {
                    spec,
                    key: key.clone(),
                });
            }
        }
        for source in [
            KeySource::AllColumns,
            KeySource::Columns(vec![2, 0]),
            KeySource::ContentHash(5),
        ] {
            nodes.push(WireNode::ShuffleKey {
                seed: 7,
                epoch: 1,
                source,
            });
        }
        nodes.extend([
            WireNode::ShuffleRoot {
                seed: 7,
                epoch: 2,
                batch_rows: 8192,
                ranged: false,
                unique_rows: false,
                copies: CopyIdentity::Values,
            },
            WireNode::ShuffleRoot {
                seed: 7,
                epoch: 2,
                batch_rows: 64,
                ranged: true,
                unique_rows: true,
                copies: CopyIdentity::ContentHash(0),
            },
            WireNode::PositionKey {
                keys: PositionKeys {
                    seed: 3,
                    epoch: 2,
                    ranges: 4,
                    counted: true,
                    starts: vec![0, 10, 25, 31],
                    files: vec![
                        ("/data/a.parquet".into(), vec![(0, 0), (16, 1)]),
                        ("/data/b.parquet".into(), vec![(0, 2)]),
                    ],
                },
            },
            WireNode::RowIndexScan {
                exprs: vec![vec![1, 2, 3], vec![]],
                names: vec!["x".into(), "__sqlfeed_position_row".into()],
            },
            WireNode::RangeBucket {
                ranges: 4,
                counted: false,
            },
            WireNode::RangeBucket {
                ranges: 3,
                counted: true,
            },
            WireNode::Deal {
                deal: crate::shuffle::Deal {
                    batch_rows: 64,
                    world: 4,
                    drop_last: true,
                    span: None,
                },
                ranges: 4,
            },
            WireNode::Deal {
                deal: crate::shuffle::Deal {
                    batch_rows: 8,
                    world: 2,
                    drop_last: false,
                    span: Some(crate::shuffle::EpochSpan {
                        offset: 24,
                        window_rows: 10,
                        rows: 50,
                    }),
                },
                ranges: 4,
            },
            WireNode::RankShard,
            WireNode::ParallelProjection {
                exprs: vec![vec![1, 2, 3], vec![]],
                names: vec!["x".into(), "y".into()],
                workers: 4,
                batch_bytes: 1 << 20,
                isolate_row_errors: true,
            },
            WireNode::SharedEntryWrite {
                dir: "/shared/sqlfeed-cache/0a1b".into(),
            },
            WireNode::LocalShuffle {
                buffer_rows: 100,
                seed: 9,
            },
            WireNode::Permute {
                per_partition: true,
                ranged: false,
                copies: CopyIdentity::Values,
            },
            WireNode::Permute {
                per_partition: false,
                ranged: false,
                copies: CopyIdentity::ContentHash(3),
            },
            WireNode::Permute {
                per_partition: false,
                ranged: true,
                copies: CopyIdentity::Values,
            },
            WireNode::Function,
            WireNode::UserFunction {
                identity: "0123456789abcdef0123456789abcdef".into(),
                origin: "plugin '/p/libp.so' (p 0.1.0)".into(),
                python: None,
            },
            WireNode::UserFunction {
                identity: "fedcba9876543210fedcba9876543210".into(),
                origin: "Python function 'team.prep.resize'".into(),
                python: Some(crate::cluster::PythonDeclaration {
                    qualname: "team.prep.resize".into(),
                    args: crate::cluster::DeclaredArgs::Exact(vec![
                        datafusion::arrow::datatypes::DataType::Binary,
                        datafusion::arrow::datatypes::DataType::Int32,
                    ]),
                    return_type: datafusion::arrow::datatypes::DataType::Float32,
                    volatility: datafusion::logical_expr::Volatility::Immutable,
                    costly: true,
                }),
            },
            WireNode::UserFunction {
                identity: "00".into(),
                origin: "Python function 'm.f'".into(),
                python: Some(crate::cluster::PythonDeclaration {
                    qualname: "m.f".into(),
                    args: crate::cluster::DeclaredArgs::Any(3),
                    return_type: datafusion::arrow::datatypes::DataType::Utf8,
                    volatility: datafusion::logical_expr::Volatility::Volatile,
                    costly: false,
                }),
            },
            WireNode::UserFunction {
                identity: "01".into(),
                origin: "Python function 'm.g'".into(),
                python: Some(crate::cluster::PythonDeclaration {
                    qualname: "m.g".into(),
                    args: crate::cluster::DeclaredArgs::Variadic,
                    return_type: datafusion::arrow::datatypes::DataType::Int64,
                    volatility: datafusion::logical_expr::Volatility::Stable,
                    costly: false,
                }),
            },
            WireNode::Mix {
                spec: MixSpec::new(
                    vec!["web".into(), "code".into()],
                    &[0.6, 0.4],
                    None,
                    None,
                    None,
                ),
            },
            WireNode::Mix {
                spec: MixSpec::new(
                    vec!["a".into(), "b".into(), "c".into()],
                    &[1.0, 0.1, 0.0],
                    Some(1000),
                    Some(u64::MAX),
                    Some(0),
                )
                .with_schedules(
                    &[
                        vec![(0, 0.8), (5000, 0.8), (5000, 0.2)],
                        vec![],
                        vec![(10, 1.5)],
                    ],
                    Some(64),
                ),
            },
            WireNode::MixExec {
                sources: vec![("web".into(), 600), ("code".into(), 0)],
                turns: TurnsOrigin::Fixed {
                    quotas: vec![600, 0],
                },
                nullable: vec![false, true, false],
            },
            WireNode::MixExec {
                sources: vec![("a".into(), 3), ("b".into(), 7)],
                turns: TurnsOrigin::Scheduled {
                    schedules: vec![vec![(0, 0.9), (100, 0.1)], vec![(0, 1.0)]],
                    step_rows: 32,
                    epoch: 4,
                    rows: 10,
                },
                nullable: vec![],
            },
            WireNode::MixWindow {
                source: "math".into(),
                window: Window {
                    first_pass: 3,
                    passes: 2,
                    skip: 17,
                    take: 250,
                },
            },
        ]);
        nodes
    }

    #[test]
    fn every_node_round_trips() -> Result<()> {
        for node in every_node() {
            let mut buf = vec![];
            encode(&node, &mut buf)?;
            assert_eq!(decode(&buf)?, Some(node));
        }
        Ok(())
    }

    /// The field numbers are the format: pinned by the bytes of one node.
    #[test]
    fn field_numbers_are_fixed() -> Result<()> {
        let mut buf = vec![];
        encode(
            &WireNode::ShuffleRoot {
                seed: 1,
                epoch: 2,
                batch_rows: 3,
                ranged: false,
                unique_rows: false,
                copies: CopyIdentity::ContentHash(4),
            },
            &mut buf,
        )?;
        // version = 4 (field 1, varint); shuffle_root (field 4, length 8):
        // seed (1) = 1, epoch (2) = 2, batch_rows (3) = 3,
        // copies_by_column (6) = 4.
        let expected: &[u8] =
            b"sqlfeed\x02\x08\x04\x22\x08\x08\x01\x10\x02\x18\x03\x30\x04";
        assert_eq!(buf, expected);
        Ok(())
    }

    #[test]
    fn other_versions_and_damaged_payloads_are_named() {
        let message = |buf: &[u8]| decode(buf).unwrap_err().to_string();
        // The JSON payloads of wire format 1.
        let err = message(b"sqlfeed\x01{\"Function\":null}");
        assert!(
            err.contains("wire format 1") && err.contains("same sqlfeed version"),
            "{err}"
        );
        // A newer version of the messages.
        let mut newer = b"sqlfeed\x02".to_vec();
        Envelope {
            version: WIRE_VERSION + 1,
            node: Some(Node::Function(Empty {})),
        }
        .encode(&mut newer)
        .expect("encodes");
        let err = message(&newer);
        assert!(
            err.contains(&format!("wire version {}", WIRE_VERSION + 1)),
            "{err}"
        );
        // Truncated, empty, and a node from the future (an unknown field).
        let mut buf = vec![];
        encode(&every_node()[1], &mut buf).expect("encodes");
        let err = message(&buf[..buf.len() - 3]);
        assert!(err.contains("invalid protobuf"), "{err}");
        assert!(message(b"sqlfeed").contains("empty"));
        // (Field 99, length 0.)
        let err = message(b"sqlfeed\x02\x08\x04\x9a\x06\x00");
        assert!(err.contains("no node this version knows"), "{err}");
        // Required parts left out.
        let mut buf = b"sqlfeed\x02".to_vec();
        Envelope {
            version: WIRE_VERSION,
            node: Some(Node::ShuffleKey(ShuffleKeyNode::default())),
        }
        .encode(&mut buf)
        .expect("encodes");
        assert!(message(&buf).contains("key source is missing"));
        // A row index scan without its projection (version 3's form).
        let mut buf = b"sqlfeed\x02".to_vec();
        Envelope {
            version: WIRE_VERSION,
            node: Some(Node::RowIndexScan(RowIndexScanNode::default())),
        }
        .encode(&mut buf)
        .expect("encodes");
        assert!(message(&buf).contains("its projection is damaged"));
        // Not ours: Ballista's codec gets it.
        assert_eq!(decode(b"\x0a\x02hi").expect("not ours"), None);
    }
}
