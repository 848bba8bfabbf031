//! The protobuf messages of the wire format (prost), with their field
//! numbers: what [`super::to_message`] writes and [`super::from_message`]
//! reads. Field numbers are never reused (see the parent's docs).

use prost::Message;

/// One encoded node.
#[derive(Clone, PartialEq, Message)]
pub struct Envelope {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    #[prost(
        oneof = "Node",
        tags = "2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18"
    )]
    pub node: Option<Node>,
}

/// The node an [`Envelope`] carries.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Node {
    #[prost(message, tag = "2")]
    Shuffle(Shuffle),
    #[prost(message, tag = "3")]
    ShuffleKey(ShuffleKeyNode),
    #[prost(message, tag = "4")]
    ShuffleRoot(ShuffleRoot),
    #[prost(message, tag = "5")]
    LocalShuffle(LocalShuffle),
    #[prost(message, tag = "6")]
    Permute(Permute),
    #[prost(message, tag = "7")]
    Function(Empty),
    #[prost(message, tag = "8")]
    RangeBucket(RangeBucket),
    #[prost(message, tag = "9")]
    Deal(DealNode),
    #[prost(message, tag = "10")]
    RankShard(Empty),
    #[prost(message, tag = "11")]
    SharedEntryWrite(SharedEntryWrite),
    #[prost(message, tag = "12")]
    UserFunction(UserFunctionNode),
    #[prost(message, tag = "13")]
    Mix(MixSpecNode),
    #[prost(message, tag = "14")]
    MixExec(MixExecNode),
    #[prost(message, tag = "15")]
    MixWindow(MixWindowNode),
    #[prost(message, tag = "16")]
    ParallelProjection(ParallelProjectionNode),
    #[prost(message, tag = "17")]
    PositionKey(PositionKeyNode),
    #[prost(message, tag = "18")]
    RowIndexScan(RowIndexScanNode),
}

/// `RowIndexScanExec`: its projection (DataFusion's `PhysicalExprNode`s,
/// encoded) and output names; its input is the scan without virtual
/// columns. Tags 1 and 2 (row index places and names) are retired.
#[derive(Clone, PartialEq, Message)]
pub struct RowIndexScanNode {
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub exprs: Vec<Vec<u8>>,
    #[prost(string, repeated, tag = "4")]
    pub names: Vec<String>,
}

/// `PositionKeyExec`: its `PositionKeys`.
#[derive(Clone, PartialEq, Message)]
pub struct PositionKeyNode {
    #[prost(uint64, tag = "1")]
    pub seed: u64,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    #[prost(uint64, tag = "3")]
    pub ranges: u64,
    #[prost(bool, tag = "4")]
    pub counted: bool,
    #[prost(uint64, repeated, tag = "5")]
    pub starts: Vec<u64>,
    #[prost(message, repeated, tag = "6")]
    pub files: Vec<PositionFile>,
}

/// One file's row groups: (first row index, row group in rank order) each.
#[derive(Clone, PartialEq, Message)]
pub struct PositionFile {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(uint64, repeated, tag = "2")]
    pub first_rows: Vec<u64>,
    #[prost(uint64, repeated, tag = "3")]
    pub groups: Vec<u64>,
}

/// `ParallelProjectionExec`: its expressions (DataFusion's
/// `PhysicalExprNode`s, encoded) and output names.
#[derive(Clone, PartialEq, Message)]
pub struct ParallelProjectionNode {
    #[prost(bytes = "vec", repeated, tag = "1")]
    pub exprs: Vec<Vec<u8>>,
    #[prost(string, repeated, tag = "2")]
    pub names: Vec<String>,
    #[prost(uint64, tag = "3")]
    pub workers: u64,
    #[prost(uint64, tag = "4")]
    pub batch_bytes: u64,
    #[prost(bool, tag = "5")]
    pub isolate_row_errors: bool,
}

/// `MixNode`: its `MixSpec`.
#[derive(Clone, PartialEq, Message)]
pub struct MixSpecNode {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
    #[prost(double, repeated, tag = "2")]
    pub weights: Vec<f64>,
    #[prost(uint64, optional, tag = "3")]
    pub rows: Option<u64>,
    #[prost(uint64, optional, tag = "4")]
    pub seed: Option<u64>,
    #[prost(uint64, optional, tag = "5")]
    pub epoch: Option<u64>,
    /// One per source when any, each maybe empty (a fixed weight).
    #[prost(message, repeated, tag = "6")]
    pub schedules: Vec<SchedulePoints>,
    #[prost(uint64, optional, tag = "7")]
    pub step_rows: Option<u64>,
}

/// One source's weight schedule: `steps[i]` has weight `weights[i]`.
#[derive(Clone, PartialEq, Message)]
pub struct SchedulePoints {
    #[prost(uint64, repeated, tag = "1")]
    pub steps: Vec<u64>,
    #[prost(double, repeated, tag = "2")]
    pub weights: Vec<f64>,
}

/// `MixExec`.
#[derive(Clone, PartialEq, Message)]
pub struct MixExecNode {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
    #[prost(uint64, repeated, tag = "2")]
    pub takes: Vec<u64>,
    #[prost(oneof = "TurnsKind", tags = "3, 4")]
    pub turns: Option<TurnsKind>,
    #[prost(bool, repeated, tag = "5")]
    pub nullable: Vec<bool>,
}

/// What a `MixExec`'s turns are built from.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TurnsKind {
    #[prost(message, tag = "3")]
    Fixed(Positions),
    #[prost(message, tag = "4")]
    Scheduled(ScheduledTurnsNode),
}

/// `TurnsOrigin::Scheduled`.
#[derive(Clone, PartialEq, Message)]
pub struct ScheduledTurnsNode {
    #[prost(message, repeated, tag = "1")]
    pub schedules: Vec<SchedulePoints>,
    #[prost(uint64, tag = "2")]
    pub step_rows: u64,
    #[prost(uint64, tag = "3")]
    pub epoch: u64,
    #[prost(uint64, tag = "4")]
    pub rows: u64,
}

/// `MixWindowExec`.
#[derive(Clone, PartialEq, Message)]
pub struct MixWindowNode {
    #[prost(string, tag = "1")]
    pub source: String,
    #[prost(uint64, tag = "2")]
    pub first_pass: u64,
    #[prost(uint64, tag = "3")]
    pub passes: u64,
    #[prost(uint64, tag = "4")]
    pub skip: u64,
    #[prost(uint64, tag = "5")]
    pub take: u64,
}
/// A plugin's or a Python function (`WireNode::UserFunction`).
#[derive(Clone, PartialEq, Message)]
pub struct UserFunctionNode {
    #[prost(string, tag = "1")]
    pub identity: String,
    #[prost(string, tag = "2")]
    pub origin: String,
    /// A Python function's declaration; absent for a plugin's.
    #[prost(message, optional, tag = "3")]
    pub python: Option<PythonDeclarationNode>,
}

/// `crate::cluster::PythonDeclaration`.
#[derive(Clone, PartialEq, Message)]
pub struct PythonDeclarationNode {
    #[prost(string, tag = "1")]
    pub qualname: String,
    /// The argument types as an Arrow IPC stream without batches, when the
    /// function declares them (`Exact`).
    #[prost(bytes = "vec", optional, tag = "2")]
    pub exact_args: Option<Vec<u8>>,
    /// The number of arguments of any type (`Any`).
    #[prost(uint64, optional, tag = "3")]
    pub any_args: Option<u64>,
    /// The return type, as `exact_args` carries types (one field).
    #[prost(bytes = "vec", tag = "4")]
    pub return_type: Vec<u8>,
    /// "immutable", "stable" or "volatile".
    #[prost(string, tag = "5")]
    pub volatility: String,
    #[prost(bool, tag = "6")]
    pub costly: bool,
}

/// `SharedEntryWriteNode` (logical) and `SharedEntryWriteExec`.
#[derive(Clone, PartialEq, Message)]
pub struct SharedEntryWrite {
    #[prost(string, tag = "1")]
    pub dir: String,
}

/// `RangeBucketExec`.
#[derive(Clone, PartialEq, Message)]
pub struct RangeBucket {
    #[prost(uint64, tag = "1")]
    pub ranges: u64,
    #[prost(bool, tag = "2")]
    pub counted: bool,
}

/// `DealExec`.
#[derive(Clone, PartialEq, Message)]
pub struct DealNode {
    #[prost(uint64, tag = "1")]
    pub batch_rows: u64,
    #[prost(uint64, tag = "2")]
    pub world: u64,
    #[prost(bool, tag = "3")]
    pub drop_last: bool,
    #[prost(uint64, tag = "4")]
    pub ranges: u64,
    /// A window job's place in its epoch (`Deal::span`), if it is one.
    #[prost(message, optional, tag = "5")]
    pub span: Option<EpochSpanNode>,
}

/// `EpochSpan`: a window job's rows in its epoch.
#[derive(Clone, PartialEq, Message)]
pub struct EpochSpanNode {
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(uint64, tag = "2")]
    pub window_rows: u64,
    #[prost(uint64, tag = "3")]
    pub rows: u64,
}

/// No fields.
#[derive(Clone, PartialEq, Message)]
pub struct Empty {}

/// `ShuffleNode` (logical).
#[derive(Clone, PartialEq, Message)]
pub struct Shuffle {
    #[prost(message, optional, tag = "1")]
    pub spec: Option<Spec>,
    #[prost(message, optional, tag = "2")]
    pub key: Option<Key>,
}

/// A `ShuffleSpec`.
#[derive(Clone, PartialEq, Message)]
pub struct Spec {
    #[prost(oneof = "SpecKind", tags = "1, 2, 3, 4")]
    pub kind: Option<SpecKind>,
}

/// Global or local.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum SpecKind {
    #[prost(message, tag = "1")]
    Global(Global),
    #[prost(message, tag = "2")]
    Local(LocalShuffle),
    #[prost(message, tag = "3")]
    Windowed(Windowed),
    /// `ShuffleSpec::Positional`: its seed and epoch.
    #[prost(message, tag = "4")]
    Positional(Global),
}

/// `ShuffleSpec::Windowed`.
#[derive(Clone, PartialEq, Message)]
pub struct Windowed {
    #[prost(uint64, tag = "1")]
    pub seed: u64,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    #[prost(uint64, tag = "3")]
    pub window_rows: u64,
    #[prost(uint64, optional, tag = "4")]
    pub only_window: Option<u64>,
}

/// `ShuffleSpec::Global`.
#[derive(Clone, PartialEq, Message)]
pub struct Global {
    #[prost(uint64, tag = "1")]
    pub seed: u64,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
}

/// A logical `ShuffleKey`.
#[derive(Clone, PartialEq, Message)]
pub struct Key {
    #[prost(oneof = "KeyKind", tags = "1, 2, 3")]
    pub kind: Option<KeyKind>,
}

/// What the content hash is computed from.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum KeyKind {
    #[prost(message, tag = "1")]
    AllColumns(Empty),
    #[prost(message, tag = "2")]
    Columns(Names),
    #[prost(string, tag = "3")]
    ContentHash(String),
}

/// Column names, in order.
#[derive(Clone, PartialEq, Message)]
pub struct Names {
    #[prost(string, repeated, tag = "1")]
    pub names: Vec<String>,
}

/// `ShuffleKeyExec`.
#[derive(Clone, PartialEq, Message)]
pub struct ShuffleKeyNode {
    #[prost(uint64, tag = "1")]
    pub seed: u64,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    #[prost(message, optional, tag = "3")]
    pub source: Option<Source>,
}

/// A physical `KeySource`.
#[derive(Clone, PartialEq, Message)]
pub struct Source {
    #[prost(oneof = "SourceKind", tags = "1, 2, 3")]
    pub kind: Option<SourceKind>,
}

/// Where the content hash comes from.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum SourceKind {
    #[prost(message, tag = "1")]
    AllColumns(Empty),
    #[prost(message, tag = "2")]
    Columns(Positions),
    #[prost(uint64, tag = "3")]
    ContentHash(u64),
}

/// Column positions, in order.
#[derive(Clone, PartialEq, Message)]
pub struct Positions {
    #[prost(uint64, repeated, tag = "1")]
    pub positions: Vec<u64>,
}

/// `ShuffleMergeExec`.
#[derive(Clone, PartialEq, Message)]
pub struct ShuffleRoot {
    #[prost(uint64, tag = "1")]
    pub seed: u64,
    #[prost(uint64, tag = "2")]
    pub epoch: u64,
    #[prost(uint64, tag = "3")]
    pub batch_rows: u64,
    #[prost(bool, tag = "4")]
    pub ranged: bool,
    /// Version 2: an executor that ignored it would skip the check that the
    /// plan without a copy stage relies on.
    #[prost(bool, tag = "5")]
    pub unique_rows: bool,
    /// Version 3: the content hash column that alone makes two rows copies
    /// (absent: every column does). An executor that ignored it would
    /// compare the columns that ride along and order copies differently.
    #[prost(uint64, optional, tag = "6")]
    pub copies_by_column: Option<u64>,
}

/// `LocalShuffleExec`, and `ShuffleSpec::Local`.
#[derive(Clone, PartialEq, Message)]
pub struct LocalShuffle {
    #[prost(uint64, tag = "1")]
    pub buffer_rows: u64,
    #[prost(uint64, tag = "2")]
    pub seed: u64,
}

/// `PermuteExec`.
#[derive(Clone, PartialEq, Message)]
pub struct Permute {
    #[prost(bool, tag = "1")]
    pub per_partition: bool,
    #[prost(bool, tag = "2")]
    pub ranged: bool,
    /// Version 3: as `ShuffleRoot::copies_by_column`.
    #[prost(uint64, optional, tag = "3")]
    pub copies_by_column: Option<u64>,
}
