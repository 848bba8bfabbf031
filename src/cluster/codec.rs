//! Codecs that carry sqlfeed's plan nodes and functions across the wire.
//!
//! Ballista sends logical plans from the client to the scheduler and
//! physical plans from the scheduler to executors as protobuf; nodes and
//! functions DataFusion does not know travel as opaque bytes produced by an
//! extension codec. [`SqlfeedLogicalCodec`] and [`SqlfeedPhysicalCodec`]
//! recognise sqlfeed's own nodes and pass everything else to Ballista's
//! codecs, which they wrap:
//!
//! ```text
//!  client                       scheduler                      executor
//!  ShuffleNode ──logical──►     ShuffleNode ─plan─► stages ──physical──►
//!  tokenize()    codec          ShuffleKeyExec, PermuteExec,  ShuffleKeyExec,
//!                               ShuffleMergeExec, tokenize()       PermuteExec, tokenize()
//! ```
//!
//! # Wire format
//! Our payloads start with `sqlfeed` and a format byte, followed by a
//! protobuf message with fixed field numbers and a checked version (see
//! [`super::wire`]); a payload without the prefix belongs to the wrapped
//! codec. Functions are
//! encoded by name (plus the prefix): the receiving process resolves the
//! name against its own registry of sqlfeed functions, so a function's
//! process-local state (loaded tokenizers, the object stores it reads
//! tokenizer files from) is built where it runs.
//!
//! # Not encodable
//! `CACHE TABLE` results live on the machine that cached them; a cluster
//! plan reading one fails at encoding with an error naming the table.

use std::collections::HashMap;
use std::sync::Arc;

use ballista_core::extension::SessionConfigExt;
use ballista_core::serde::{
    BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec,
};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::common::{internal_err, plan_datafusion_err, plan_err};
use datafusion::datasource::file_format::FileFormatFactory;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{Extension, LogicalPlan, ScalarUDF};
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::{ProjectionExec, ProjectionExpr};
use datafusion_proto::logical_plan::LogicalExtensionCodec;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalProtoConverterExtension,
};
use sqlfeed_udfs::user::{FunctionOrigin, as_user_function};

use super::declared::{PythonDeclaration, declared_function};
use super::wire::WireNode;
use crate::cache::CachedTable;
use crate::cache::shared::{SharedEntryWriteExec, SharedEntryWriteNode};
use crate::exec::row_index::RowIndexScanExec;
use crate::shuffle::mix::pattern::Turns;
use crate::shuffle::mix::{MixExec, MixNode, MixSource, MixWindowExec};
use crate::shuffle::{
    DealExec, LocalShuffleExec, PermuteExec, PermuteMode, PositionKeyExec,
    RangeBucketExec, RankShardExec, ShuffleKeyExec, ShuffleMergeExec, ShuffleNode,
};
use crate::sql::ParallelProjectionExec;
use datafusion_proto::protobuf::PhysicalExprNode;
use prost::Message;

fn encode(node: &WireNode, buf: &mut Vec<u8>) -> Result<()> {
    super::wire::encode(node, buf)
}

/// The sqlfeed node in `buf`, or `None` when the bytes are not ours.
fn decode(buf: &[u8]) -> Result<Option<WireNode>> {
    super::wire::decode(buf)
}

/// sqlfeed's functions by name, as this process builds them.
#[derive(Debug, Clone, Default)]
pub struct FunctionRegistry {
    functions: HashMap<String, Arc<ScalarUDF>>,
    /// A scheduler's: a Python function it does not host is planned from
    /// the declaration the client sent (see `super::declared`). Executors
    /// run functions, so they refuse one they do not host.
    plans_python_by_declaration: bool,
}

impl FunctionRegistry {
    /// A registry of `functions`.
    pub fn new(functions: impl IntoIterator<Item = Arc<ScalarUDF>>) -> Self {
        Self {
            functions: functions
                .into_iter()
                .map(|f| (f.name().to_string(), f))
                .collect(),
            plans_python_by_declaration: false,
        }
    }

    /// This registry, planning Python functions it does not host from
    /// their declarations: a scheduler's.
    pub fn planning_python_by_declaration(mut self) -> Self {
        self.plans_python_by_declaration = true;
        self
    }

    /// Encodes `udf` if it is sqlfeed's, else with `other` (DataFusion's
    /// codec: a built-in function).
    fn encode_or(
        &self,
        udf: &ScalarUDF,
        buf: &mut Vec<u8>,
        other: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        if self.encode(udf, buf)? {
            Ok(())
        } else {
            other(buf)
        }
    }

    /// Decodes the function `name` if its bytes are sqlfeed's, else with
    /// `other`.
    fn decode_or(
        &self,
        name: &str,
        buf: &[u8],
        other: impl FnOnce() -> Result<Arc<ScalarUDF>>,
    ) -> Result<Arc<ScalarUDF>> {
        match self.decode(name, buf)? {
            Some(udf) => Ok(udf),
            None => other(),
        }
    }

    fn encode(&self, udf: &ScalarUDF, buf: &mut Vec<u8>) -> Result<bool> {
        if let Some(user) = as_user_function(udf) {
            let python = match user.origin() {
                FunctionOrigin::Plugin { .. } => None,
                FunctionOrigin::Python { .. } => Some(PythonDeclaration::of(user)?),
            };
            encode(
                &WireNode::UserFunction {
                    identity: user.identity().to_string(),
                    origin: user.origin().describe(),
                    python,
                },
                buf,
            )?;
            return Ok(true);
        }
        if !self.functions.contains_key(udf.name()) {
            return Ok(false);
        }
        encode(&WireNode::Function, buf)?;
        Ok(true)
    }

    fn decode(&self, name: &str, buf: &[u8]) -> Result<Option<Arc<ScalarUDF>>> {
        match decode(buf)? {
            Some(WireNode::Function) => match self.functions.get(name) {
                Some(udf) => Ok(Some(Arc::clone(udf))),
                None => plan_err!(
                    "function '{name}' is not a sqlfeed function of this process \
                     (sqlfeed {}); are client, scheduler and executors built with \
                     the same features?",
                    env!("CARGO_PKG_VERSION")
                ),
            },
            Some(WireNode::UserFunction {
                identity,
                origin,
                python,
            }) => {
                let here = self
                    .functions
                    .get(name)
                    .and_then(|f| as_user_function(f).map(|user| (Arc::clone(f), user)));
                match (here, python) {
                    (Some((udf, user)), _) if user.identity() == identity => {
                        Ok(Some(udf))
                    }
                    (Some((_, user)), Some(_)) => plan_err!(
                        "function '{name}' differs between the client and this process: the \
                         client's is {origin} (content {identity}), this executor's is {} \
                         (content {}). Give the client and every executor the same code \
                         (the same --function-dir, the same Python version: the content \
                         hash covers the function's bytecode, the values it reads and its \
                         declaration), or the same version= on both sides",
                        user.origin().describe(),
                        user.identity()
                    ),
                    (Some((_, user)), None) => plan_err!(
                        "function '{name}' differs between the client and this process: the \
                         client's comes from {origin} (content {identity}), this process's \
                         from {} (content {}). Give the client, the scheduler and every \
                         executor the same build of the plugin",
                        user.origin().describe(),
                        user.identity()
                    ),
                    (None, Some(declaration)) if self.plans_python_by_declaration => {
                        Ok(Some(declared_function(name, &identity, declaration)))
                    }
                    (None, Some(declaration)) => {
                        let module = declaration
                            .qualname
                            .split_once('.')
                            .map_or(declaration.qualname.as_str(), |(module, _)| module);
                        let hint = if module == "__main__" {
                            "; the client defines it in its script (__main__), which no \
                             executor can import: move it into a module of that folder and \
                             import it in the script"
                        } else {
                            ""
                        };
                        plan_err!(
                            "function '{name}' ({origin}, content {identity}) is not hosted \
                             by this executor: start every executor with `sqlfeed executor \
                             --python <interpreter> --function-dir <folder>` where the folder \
                             holds the module of '{}' as the client imports it{hint}",
                            declaration.qualname
                        )
                    }
                    (None, None) => plan_err!(
                        "function '{name}' of {origin} is not loaded in this process (sqlfeed \
                         {}): start the scheduler and every executor with --plugin-dir \
                         <folder> holding the same library (content {identity})",
                        env!("CARGO_PKG_VERSION")
                    ),
                }
            }
            Some(other) => {
                internal_err!("expected a function payload for '{name}', got {other:?}")
            }
            None => Ok(None),
        }
    }
}

/// The function methods both codecs share: sqlfeed's functions by name
/// from `self.functions`, any other through Ballista's codec `self.inner`.
macro_rules! functions_then_ballista {
    () => {
        fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
            self.functions
                .decode_or(name, buf, || self.inner.try_decode_udf(name, buf))
        }

        fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
            self.functions
                .encode_or(node, buf, |buf| self.inner.try_encode_udf(node, buf))
        }
    };
}

/// Logical codec: [`ShuffleNode`] and sqlfeed functions, the rest to Ballista.
#[derive(Debug)]
pub struct SqlfeedLogicalCodec {
    functions: FunctionRegistry,
    inner: BallistaLogicalExtensionCodec,
}

impl SqlfeedLogicalCodec {
    /// A codec resolving functions against `functions`.
    pub fn new(functions: FunctionRegistry) -> Self {
        Self {
            functions,
            inner: BallistaLogicalExtensionCodec::default(),
        }
    }
}

impl LogicalExtensionCodec for SqlfeedLogicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[LogicalPlan],
        ctx: &TaskContext,
    ) -> Result<Extension> {
        match decode(buf)? {
            Some(WireNode::Shuffle { spec, key }) => {
                let [input] = inputs else {
                    return internal_err!("Shuffle has one input, got {}", inputs.len());
                };
                let node = ShuffleNode::try_new_keyed(input.clone(), spec, key)?;
                Ok(Extension {
                    node: Arc::new(node),
                })
            }

            Some(WireNode::Mix { spec }) => Ok(Extension {
                node: Arc::new(MixNode::try_new(inputs.to_vec(), spec)?),
            }),
            Some(WireNode::SharedEntryWrite { dir }) => {
                let [input] = inputs else {
                    return internal_err!(
                        "SharedEntryWrite has one input, got {}",
                        inputs.len()
                    );
                };
                Ok(Extension {
                    node: Arc::new(SharedEntryWriteNode::try_new(input.clone(), dir)?),
                })
            }
            Some(other) => internal_err!("{other:?} is not a logical plan node"),
            None => self.inner.try_decode(buf, inputs, ctx),
        }
    }

    fn try_encode(&self, node: &Extension, buf: &mut Vec<u8>) -> Result<()> {
        let any = node.node.as_any();
        if let Some(shuffle) = any.downcast_ref::<ShuffleNode>() {
            let wire = WireNode::Shuffle {
                spec: shuffle.spec(),
                key: shuffle.key().clone(),
            };
            return encode(&wire, buf);
        }
        if let Some(mix) = any.downcast_ref::<MixNode>() {
            if let Some(window_rows) = mix.spec().window_rows {
                return Err(crate::shuffle::mix::refused_on_a_cluster(window_rows));
            }
            let wire = WireNode::Mix {
                spec: mix.spec().clone(),
            };
            return encode(&wire, buf);
        }
        if let Some(write) = any.downcast_ref::<SharedEntryWriteNode>() {
            let wire = WireNode::SharedEntryWrite {
                dir: write.dir().to_string(),
            };
            return encode(&wire, buf);
        }
        self.inner.try_encode(node, buf)
    }

    fn try_decode_table_provider(
        &self,
        buf: &[u8],
        table_ref: &TableReference,
        schema: SchemaRef,
        ctx: &TaskContext,
    ) -> Result<Arc<dyn TableProvider>> {
        self.inner
            .try_decode_table_provider(buf, table_ref, schema, ctx)
    }

    fn try_encode_table_provider(
        &self,
        table_ref: &TableReference,
        node: Arc<dyn TableProvider>,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        if node.as_ref().is::<CachedTable>() {
            return plan_err!(
                "table '{table_ref}' is a CACHE TABLE result, which lives on this machine \
                 and cannot be read by a cluster; query its source instead, or run \
                 without --cluster"
            );
        }
        #[cfg(feature = "delta")]
        if node.as_ref().is::<crate::sql::delta::DeltaSnapshotTable>() {
            return plan_err!(
                "table '{table_ref}' is a Delta Lake table, which sqlfeed cannot send to a \
                 cluster yet (its scan has no form in the cluster's wire format); run \
                 without --cluster"
            );
        }
        self.inner.try_encode_table_provider(table_ref, node, buf)
    }

    fn try_decode_file_format(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
    ) -> Result<Arc<dyn FileFormatFactory>> {
        self.inner.try_decode_file_format(buf, ctx)
    }

    fn try_encode_file_format(
        &self,
        buf: &mut Vec<u8>,
        node: Arc<dyn FileFormatFactory>,
    ) -> Result<()> {
        self.inner.try_encode_file_format(buf, node)
    }

    functions_then_ballista!();
}

/// Physical codec: the shuffle operators and sqlfeed functions, the rest to
/// Ballista.
#[derive(Debug)]
pub struct SqlfeedPhysicalCodec {
    functions: FunctionRegistry,
    inner: BallistaPhysicalExtensionCodec,
}

impl SqlfeedPhysicalCodec {
    /// A codec resolving functions against `functions`.
    pub fn new(functions: FunctionRegistry) -> Self {
        Self {
            functions,
            inner: BallistaPhysicalExtensionCodec::default(),
        }
    }

    /// Each expression of `projection` as DataFusion's encoded
    /// `PhysicalExprNode`, and each output name.
    fn encode_projection(
        &self,
        projection: &[ProjectionExpr],
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<(Vec<Vec<u8>>, Vec<String>)> {
        projection
            .iter()
            .map(|e| {
                let bytes = proto_converter
                    .physical_expr_to_proto(&e.expr, self)?
                    .encode_to_vec();
                Ok((bytes, e.alias.clone()))
            })
            .collect()
    }

    /// The projection [`Self::encode_projection`] wrote, over `input`'s
    /// columns; an error names the column and `of` (the node it is in).
    fn decode_projection(
        &self,
        (exprs, names): (&[Vec<u8>], Vec<String>),
        input: &Arc<dyn ExecutionPlan>,
        (ctx, proto_converter): (&TaskContext, &dyn PhysicalProtoConverterExtension),
        of: &str,
    ) -> Result<Vec<ProjectionExpr>> {
        let decoding = PhysicalPlanDecodeContext::new(ctx, self);
        let schema = input.schema();
        exprs
            .iter()
            .zip(names)
            .map(|(bytes, name)| {
                let node = PhysicalExprNode::decode(bytes.as_slice()).map_err(|e| {
                    plan_datafusion_err!(
                        "cannot decode the expression of column '{name}' of {of}: {e}"
                    )
                })?;
                let expr =
                    proto_converter.proto_to_physical_expr(&node, &schema, &decoding)?;
                Ok(ProjectionExpr::new(expr, name))
            })
            .collect()
    }
}

impl PhysicalExtensionCodec for SqlfeedPhysicalCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let Some(node) = decode(buf)? else {
            return self.inner.try_decode(buf, inputs, ctx, proto_converter);
        };
        // The mixture's operators read several inputs.
        let node = match node {
            WireNode::MixExec {
                sources,
                turns,
                nullable,
            } => return decode_mix(sources, turns, &nullable, inputs),
            WireNode::MixWindow { source, window } => {
                return Ok(Arc::new(MixWindowExec::try_new(
                    source,
                    inputs.to_vec(),
                    window,
                )?));
            }
            other => other,
        };
        let [input] = inputs else {
            return internal_err!("{node:?} has one input, got {}", inputs.len());
        };
        let input = Arc::clone(input);
        Ok(match node {
            WireNode::ParallelProjection {
                exprs,
                names,
                workers,
                batch_bytes,
                isolate_row_errors,
            } => {
                let exprs = self.decode_projection(
                    (&exprs, names),
                    &input,
                    (ctx, proto_converter),
                    "a ParallelProjectionExec",
                )?;
                let projection = ProjectionExec::try_new(exprs, input)?;
                if isolate_row_errors {
                    Arc::new(ParallelProjectionExec::isolating_row_errors(
                        &projection,
                        workers,
                        batch_bytes,
                    ))
                } else {
                    Arc::new(ParallelProjectionExec::new(
                        &projection,
                        workers,
                        batch_bytes,
                    ))
                }
            }
            WireNode::ShuffleKey {
                seed,
                epoch,
                source,
            } => Arc::new(
                ShuffleKeyExec::try_new(input, seed, epoch)?.with_source(source)?,
            ),
            WireNode::ShuffleRoot {
                seed,
                epoch,
                batch_rows,
                ranged,
                unique_rows,
                copies,
            } => Arc::new(
                ShuffleMergeExec::new(input, seed, epoch, batch_rows)
                    .ranged(ranged)
                    .unique_rows(unique_rows)
                    .with_copies(copies),
            ),
            // The scan without its row index, restored (`row_index.rs`).
            WireNode::RowIndexScan { exprs, names } => {
                let projection = self.decode_projection(
                    (&exprs, names),
                    &input,
                    (ctx, proto_converter),
                    "a Parquet scan reading row indexes",
                )?;
                RowIndexScanExec::restore(&input, &ProjectionExprs::new(projection))?
            }
            WireNode::PositionKey { keys } => {
                Arc::new(PositionKeyExec::try_new(input, keys)?)
            }
            WireNode::RangeBucket { ranges, counted } => {
                Arc::new(RangeBucketExec::try_new_counted(input, ranges, counted)?)
            }
            WireNode::Deal { deal, ranges } => {
                Arc::new(DealExec::try_new(input, deal, ranges)?)
            }
            WireNode::RankShard => Arc::new(RankShardExec::try_new(input)?),
            WireNode::SharedEntryWrite { dir } => {
                Arc::new(SharedEntryWriteExec::try_new(input, dir)?.with_job_of(job_name))
            }
            WireNode::LocalShuffle { buffer_rows, seed } => {
                Arc::new(LocalShuffleExec::new(input, buffer_rows, seed))
            }

            WireNode::Permute {
                per_partition,
                ranged,
                copies,
            } => {
                let mode = match (ranged, per_partition) {
                    (true, _) => PermuteMode::Ranged,
                    (false, true) => PermuteMode::PerPartition,
                    (false, false) => PermuteMode::Gather,
                };
                Arc::new(
                    PermuteExec::try_new_with_mode(input, mode)?.with_copies(copies)?,
                )
            }

            other @ (WireNode::Shuffle { .. }
            | WireNode::Mix { .. }
            | WireNode::MixExec { .. }
            | WireNode::MixWindow { .. }
            | WireNode::Function
            | WireNode::UserFunction { .. }) => {
                return internal_err!("{other:?} is not a physical plan node");
            }
        })
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        proto_converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        let plan = node.as_ref();
        let wire = if let Some(key) = plan.downcast_ref::<ShuffleKeyExec>() {
            WireNode::ShuffleKey {
                seed: key.seed(),
                epoch: key.epoch(),
                source: key.source().clone(),
            }
        } else if let Some(root) = plan.downcast_ref::<ShuffleMergeExec>() {
            WireNode::ShuffleRoot {
                seed: root.seed(),
                epoch: root.epoch(),
                batch_rows: root.batch_rows(),
                ranged: root.is_ranged(),
                unique_rows: root.is_unique_rows(),
                copies: root.copies(),
            }
        } else if let Some(scan) = plan.downcast_ref::<RowIndexScanExec>() {
            let (exprs, names) =
                self.encode_projection(scan.projection().as_ref(), proto_converter)?;
            WireNode::RowIndexScan { exprs, names }
        } else if let Some(keyed) = plan.downcast_ref::<PositionKeyExec>() {
            WireNode::PositionKey {
                keys: keyed.keys().clone(),
            }
        } else if let Some(bucket) = plan.downcast_ref::<RangeBucketExec>() {
            WireNode::RangeBucket {
                ranges: bucket.partitions(),
                counted: bucket.is_counted(),
            }
        } else if let Some(deal) = plan.downcast_ref::<DealExec>() {
            WireNode::Deal {
                deal: deal.deal(),
                ranges: deal.ranges(),
            }
        } else if plan.downcast_ref::<RankShardExec>().is_some() {
            WireNode::RankShard
        } else if let Some(parallel) = plan.downcast_ref::<ParallelProjectionExec>() {
            let (exprs, names) =
                self.encode_projection(parallel.exprs(), proto_converter)?;
            WireNode::ParallelProjection {
                exprs,
                names,
                workers: parallel.workers(),
                batch_bytes: parallel.batch_bytes(),
                isolate_row_errors: parallel.isolates_row_errors(),
            }
        } else if let Some(write) = plan.downcast_ref::<SharedEntryWriteExec>() {
            WireNode::SharedEntryWrite {
                dir: write.dir().to_string(),
            }
        } else if let Some(local) = plan.downcast_ref::<LocalShuffleExec>() {
            WireNode::LocalShuffle {
                buffer_rows: local.buffer_rows(),
                seed: local.seed(),
            }
        } else if let Some(mix) = plan.downcast_ref::<MixExec>() {
            WireNode::MixExec {
                sources: mix
                    .sources()
                    .iter()
                    .map(|s| (s.name.clone(), s.take))
                    .collect(),
                turns: mix.turns().origin(),
                nullable: mix
                    .schema()
                    .fields()
                    .iter()
                    .map(|f| f.is_nullable())
                    .collect(),
            }
        } else if let Some(window) = plan.downcast_ref::<MixWindowExec>() {
            WireNode::MixWindow {
                source: window.source().to_string(),
                window: window.window(),
            }
        } else if let Some(permute) = plan.downcast_ref::<PermuteExec>() {
            WireNode::Permute {
                per_partition: permute.mode() == PermuteMode::PerPartition,
                ranged: permute.mode() == PermuteMode::Ranged,
                copies: permute.copies(),
            }
        } else {
            return self.inner.try_encode(node, buf, proto_converter);
        };
        encode(&wire, buf)
    }

    functions_then_ballista!();
}

/// A [`MixExec`] of `inputs` (one per source, in order) from its wire form.
fn decode_mix(
    sources: Vec<(String, u64)>,
    turns: crate::shuffle::mix::pattern::TurnsOrigin,
    nullable: &[bool],
    inputs: &[Arc<dyn ExecutionPlan>],
) -> Result<Arc<dyn ExecutionPlan>> {
    let Some(first) = inputs.first() else {
        return internal_err!("MixExec without sources");
    };
    if sources.len() != inputs.len() {
        return internal_err!(
            "MixExec of {} sources has {} inputs",
            sources.len(),
            inputs.len()
        );
    }
    // The sources' columns, nullable where the sender's mixture's are.
    let schema = first.schema();
    let fields: Vec<datafusion::arrow::datatypes::Field> = schema
        .fields()
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let nullable = nullable.get(i).copied().unwrap_or(f.is_nullable());
            f.as_ref().clone().with_nullable(nullable)
        })
        .collect();
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::new_with_metadata(
        fields,
        schema.metadata().clone(),
    ));
    let sources = sources
        .into_iter()
        .zip(inputs)
        .map(|((name, take), plan)| MixSource {
            name,
            plan: Arc::clone(plan),
            take,
        })
        .collect();
    Ok(Arc::new(MixExec::try_new(
        sources,
        Turns::from_origin(turns)?,
        schema,
    )?))
}

/// The Ballista job a task runs in (its folder in the executor cache).
fn job_name(context: &TaskContext) -> Option<String> {
    context
        .session_config()
        .ballista_config()
        .settings()
        .get(ballista_core::config::BALLISTA_JOB_NAME)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shuffle::ShuffleSpec;
    use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
    use datafusion::physical_plan::empty::EmptyExec;
    use datafusion::prelude::SessionContext;

    fn registry() -> FunctionRegistry {
        FunctionRegistry::new(sqlfeed_udfs::scalar_functions().into_iter().map(Arc::new))
    }

    /// A Python function of a client: `team.prep.resize(Binary, Int32) ->
    /// Float32`, costly, content `identity`.
    fn python_function(identity: &str) -> Arc<ScalarUDF> {
        use datafusion::arrow::datatypes::DataType;
        use datafusion::logical_expr::{ColumnarValue, Volatility, create_udf};
        sqlfeed_udfs::user::user_function(
            create_udf(
                "resize",
                vec![DataType::Binary, DataType::Int32],
                DataType::Float32,
                Volatility::Immutable,
                Arc::new(|args: &[ColumnarValue]| Ok(args[0].clone())),
            ),
            identity.into(),
            true,
            FunctionOrigin::Python {
                qualname: "team.prep.resize".into(),
            },
        )
    }

    #[test]
    fn a_python_function_is_planned_by_its_declaration_and_run_where_hosted() -> Result<()>
    {
        let client = SqlfeedLogicalCodec::new(registry());
        let mut buf = vec![];
        client.try_encode_udf(&python_function("aa11"), &mut buf)?;

        // The scheduler plans with the declaration and sends it on as it came.
        let scheduler =
            SqlfeedLogicalCodec::new(registry().planning_python_by_declaration());
        let planned = scheduler.try_decode_udf("resize", &buf)?;
        assert_eq!(planned.signature(), python_function("aa11").signature());
        let user = as_user_function(&planned).expect("a user function");
        assert_eq!((user.identity(), user.is_costly()), ("aa11", true));
        let mut sent_on = vec![];
        SqlfeedPhysicalCodec::new(registry().planning_python_by_declaration())
            .try_encode_udf(&planned, &mut sent_on)?;
        assert_eq!(sent_on, buf);

        // An executor hosting the same function runs its own.
        let hosting = |identity: &str| {
            let mut functions: Vec<Arc<ScalarUDF>> = sqlfeed_udfs::scalar_functions()
                .into_iter()
                .map(Arc::new)
                .collect();
            functions.push(python_function(identity));
            SqlfeedPhysicalCodec::new(FunctionRegistry::new(functions))
        };
        let ran = hosting("aa11").try_decode_udf("resize", &sent_on)?;
        assert_eq!(as_user_function(&ran).map(|u| u.identity()), Some("aa11"));

        // One whose code differs, or none at all, is refused by name.
        let differs = hosting("bb22")
            .try_decode_udf("resize", &sent_on)
            .unwrap_err()
            .to_string();
        assert!(
            differs.contains("content aa11") && differs.contains("content bb22"),
            "{differs}"
        );
        let missing = SqlfeedPhysicalCodec::new(registry())
            .try_decode_udf("resize", &sent_on)
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("is not hosted by this executor")
                && missing.contains("--function-dir")
                && missing.contains("team.prep.resize"),
            "{missing}"
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_mixture_travels_and_gives_the_same_rows() -> Result<()> {
        use crate::shuffle::mix::MixSpec;
        use crate::shuffle::mix::pattern::{Interleave, Window};
        use datafusion::arrow::array::Int64Array;
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::arrow::record_batch::RecordBatch;
        use datafusion::common::cast::as_int64_array;
        use datafusion::datasource::memory::MemorySourceConfig;

        let ctx = SessionContext::new();
        let task = ctx.task_ctx();
        // The logical node, schedules and all.
        let logical = SqlfeedLogicalCodec::new(registry());
        let input = LogicalPlan::EmptyRelation(EmptyRelation {
            produce_one_row: true,
            schema: Arc::new(datafusion::common::DFSchema::empty()),
        });
        let spec = MixSpec::new(vec!["a".into()], &[1.0], Some(5), Some(7), None)
            .with_schedules(&[vec![(0, 1.0), (10, 0.5)]], Some(4));
        // Windowed passes are refused before the plan leaves this machine.
        let windowed = Extension {
            node: Arc::new(MixNode::try_new(
                vec![input.clone()],
                spec.clone().with_window_rows(Some(4096)),
            )?),
        };
        let refused = logical
            .try_encode(&windowed, &mut vec![])
            .expect_err("a windowed mixture stays on this machine")
            .to_string();
        assert!(refused.contains("MIX … WINDOW 4096"), "{refused}");
        let node = Extension {
            node: Arc::new(MixNode::try_new(vec![input.clone()], spec.clone())?),
        };
        let mut buf = vec![];
        logical.try_encode(&node, &mut buf)?;
        let back = logical.try_decode(&buf, &[input], &task)?;
        let back = back.node.as_any().downcast_ref::<MixNode>();
        assert_eq!(back.map(|mix| mix.spec()), Some(&spec));

        // The operators, each decoded over its children as Ballista does.
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let memory = |values: Vec<i64>| -> Result<Arc<dyn ExecutionPlan>> {
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(Int64Array::from(values))],
            )?;
            Ok(MemorySourceConfig::try_new_exec(
                &[vec![batch]],
                Arc::clone(&schema),
                None,
            )?)
        };
        let window: Arc<dyn ExecutionPlan> = Arc::new(MixWindowExec::try_new(
            "a".into(),
            vec![memory(vec![1, 2, 3])?, memory(vec![4, 5, 6])?],
            Window {
                first_pass: 0,
                passes: 2,
                skip: 2,
                take: 3,
            },
        )?);
        let sources = vec![
            MixSource {
                name: "a".into(),
                plan: window,
                take: 3,
            },
            MixSource {
                name: "b".into(),
                plan: memory(vec![10, 20])?,
                take: 2,
            },
        ];
        let mix: Arc<dyn ExecutionPlan> = Arc::new(MixExec::try_new(
            sources,
            Turns::Fixed(Interleave::new(vec![3, 2])),
            Arc::clone(&schema),
        )?);
        let physical = SqlfeedPhysicalCodec::new(registry());
        let converter = datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {};
        let travel = |plan: &Arc<dyn ExecutionPlan>,
                      children: Vec<Arc<dyn ExecutionPlan>>|
         -> Result<Arc<dyn ExecutionPlan>> {
            let mut buf = vec![];
            physical.try_encode(Arc::clone(plan), &mut buf, &converter)?;
            physical.try_decode(&buf, &children, &task, &converter)
        };
        let children: Vec<Arc<dyn ExecutionPlan>> =
            mix.children().into_iter().cloned().collect();
        let window = travel(
            &children[0],
            children[0].children().into_iter().cloned().collect(),
        )?;
        let arrived = travel(&mix, vec![window, Arc::clone(&children[1])])?;
        let values = |plan: Arc<dyn ExecutionPlan>| {
            let task = Arc::clone(&task);
            async move {
                let batches = datafusion::physical_plan::collect(plan, task).await?;
                let mut values = vec![];
                for batch in &batches {
                    values.extend_from_slice(as_int64_array(batch.column(0))?.values());
                }
                Ok::<_, datafusion::error::DataFusionError>(values)
            }
        };
        let expected = values(mix).await?;
        assert_eq!(expected.len(), 5, "{expected:?}");
        assert_eq!(values(arrived).await?, expected);
        Ok(())
    }

    #[test]
    fn shuffle_nodes_and_functions_round_trip() -> Result<()> {
        let ctx = SessionContext::new();
        let task = ctx.task_ctx();
        let logical = SqlfeedLogicalCodec::new(registry());
        let input = LogicalPlan::EmptyRelation(EmptyRelation {
            produce_one_row: true,
            schema: Arc::new(datafusion::common::DFSchema::empty()),
        });
        let spec = ShuffleSpec::Global { seed: 7, epoch: 3 };
        let node = Extension {
            node: Arc::new(ShuffleNode::try_new(input.clone(), spec)?),
        };
        let mut buf = vec![];
        logical.try_encode(&node, &mut buf)?;
        assert!(buf.starts_with(super::super::wire::PREFIX));
        let decoded = logical.try_decode(&buf, &[input], &task)?;
        let shuffle = decoded
            .node
            .as_any()
            .downcast_ref::<ShuffleNode>()
            .expect("a ShuffleNode");
        assert_eq!(shuffle.spec(), spec);

        let physical = SqlfeedPhysicalCodec::new(registry());
        let converter = datafusion_proto::physical_plan::DefaultPhysicalProtoConverter {};
        let empty: Arc<dyn ExecutionPlan> = Arc::new(EmptyExec::new(Arc::new(
            datafusion::arrow::datatypes::Schema::empty(),
        )));
        let root: Arc<dyn ExecutionPlan> =
            Arc::new(ShuffleMergeExec::new(Arc::clone(&empty), 7, 3, 512));
        let mut buf = vec![];
        physical.try_encode(Arc::clone(&root), &mut buf, &converter)?;
        let back = physical.try_decode(&buf, &[empty], &task, &converter)?;
        let back = back
            .as_ref()
            .downcast_ref::<ShuffleMergeExec>()
            .expect("a ShuffleMergeExec");
        assert_eq!((back.seed(), back.epoch(), back.batch_rows()), (7, 3, 512));

        // Functions travel by name and resolve in the receiving registry.
        let udf = registry().functions["standardize"].as_ref().clone();
        let mut buf = vec![];
        physical.try_encode_udf(&udf, &mut buf)?;
        assert_eq!(
            physical.try_decode_udf("standardize", &buf)?.name(),
            "standardize"
        );
        let err = SqlfeedPhysicalCodec::new(FunctionRegistry::default())
            .try_decode_udf("standardize", &buf)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'standardize' is not a sqlfeed function"),
            "{err}"
        );
        Ok(())
    }
}
