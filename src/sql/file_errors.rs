//! Errors found while reading a file's data name the file, once.
//!
//! # Background
//! A footer error names the file ([`super::url_table`] reads every footer
//! while planning), but an error found in the data (a corrupt page, a failed
//! decompression, a dictionary index out of bounds) comes out of DataFusion's
//! Parquet reader as `Arrow error: Parquet argument error: Parquet error: …`,
//! naming neither the file nor anything else. On a glob of thousands of
//! files that leaves the user nothing to replace or exclude.
//!
//! [`NameFileErrors`], a physical optimizer rule that runs last, wraps the
//! file source of every file scan in a [`NamedErrorsSource`]. It changes
//! nothing but the errors: each file's morsel planners and morsel streams
//! are wrapped, and an error out of them becomes one clean message:
//!
//! ```text
//!  DataSourceExec ─ FileScanConfig ─ NamedErrorsSource ─ ParquetSource
//!                                         │
//!       plan_file(part-00007.parquet) ────┤ planner, pending I/O, morsels
//!                                         ▼
//!  Err("Arrow error: Parquet argument error: Parquet error: dictionary key …")
//!                                         ▼
//!  Err("cannot read the data of '/data/part-00007.parquet': dictionary key …
//!       The file is damaged: restore it from its source, or exclude it…")
//! ```
//!
//! # Limits
//! The column and row group are not named: the Parquet reader does not say
//! which column chunk it was decoding (`VERIFY` reads chunk by chunk and
//! does). Plans run on Ballista executors are serialized as a plain
//! `ParquetSource` (the wrapper delegates `try_to_proto`); the executor's
//! execution engine runs this rule again on each stage plan it receives
//! (`src/cluster/executor.rs`).

use std::fmt::{self, Formatter};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::exec_datafusion_err;
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{
    FileOpener, FileScanConfig, FileScanConfigBuilder, FileSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::error::{DataFusionError, Result};
use datafusion::physical_expr::projection::ProjectionExprs;
use datafusion::physical_expr::{EquivalenceProperties, LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::filter_pushdown::FilterPushdownPropagation;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::physical_plan::sort_pushdown::SortOrderPushdownResult;
use datafusion::physical_plan::{DisplayFormatType, PhysicalExpr};
use datafusion_datasource::morsel::{Morsel, MorselPlan, MorselPlanner, Morselizer};
use futures::{FutureExt, StreamExt};
use object_store::ObjectStore;

use crate::exec::{NodeRewrite, PlanNode, Rewritten};

/// Whether `error` is the Parquet or Arrow reader failing on the bytes (as
/// opposed to, say, a schema that does not fit the table).
fn is_damage(error: &DataFusionError) -> bool {
    use datafusion::arrow::error::ArrowError;
    match error {
        DataFusionError::ParquetError(_) => true,
        DataFusionError::ArrowError(e, _) => {
            matches!(
                e.as_ref(),
                ArrowError::ParquetError(_)
                    | ArrowError::ExternalError(_)
                    | ArrowError::IoError(..)
                    | ArrowError::InvalidArgumentError(_)
            ) && !error.to_string().contains("non-nullable")
        }
        DataFusionError::External(_) => true,
        _ => false,
    }
}

/// `error`, found while reading `file`, as one message naming the file.
/// Memory and internal errors pass unchanged: they are not the file's fault.
fn name_file(file: &str, error: DataFusionError) -> DataFusionError {
    match error {
        DataFusionError::ResourcesExhausted(_)
        | DataFusionError::Internal(_)
        | DataFusionError::Context(..) => error,
        DataFusionError::ObjectStore(_) | DataFusionError::IoError(_) => {
            exec_datafusion_err!(
                "cannot read '{file}': {}. Check that the file is still there and \
                 readable",
                super::verify::reason(&error)
            )
        }
        _ if is_damage(&error) => exec_datafusion_err!(
            "cannot read the data of '{file}': {}. The file is damaged: restore it \
             from its source, or exclude it from the path",
            super::verify::reason(&error)
        ),
        _ => exec_datafusion_err!(
            "cannot read '{file}': {}",
            super::verify::reason(&error)
        ),
    }
}

/// Wraps the file source of every file scan in [`NamedErrorsSource`]; see
/// the module docs.
#[derive(Debug, Default)]
pub struct NameFileErrors;

crate::exec::node_rewrite_rule!(NameFileErrors, "name_file_errors");

impl NodeRewrite for NameFileErrors {
    fn rewrite(&self, node: PlanNode, _config: &ConfigOptions) -> Rewritten {
        let Some(scan) = node.downcast_ref::<DataSourceExec>() else {
            return Ok(Transformed::no(node));
        };
        let Some(config) = scan.data_source().downcast_ref::<FileScanConfig>() else {
            return Ok(Transformed::no(node));
        };
        if config.file_source().is::<NamedErrorsSource>() {
            return Ok(Transformed::no(node));
        }
        let source = NamedErrorsSource::new(Arc::clone(config.file_source()));
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(Arc::new(source))
            .build();
        let scan: PlanNode = DataSourceExec::from_data_source(config);
        Ok(Transformed::yes(scan))
    }
}

/// A file source whose read errors name the file; everything else is the
/// inner source's.
#[derive(Clone)]
pub struct NamedErrorsSource {
    /// The source that does the reading (a `ParquetSource`, usually).
    inner: Arc<dyn FileSource>,
}

impl NamedErrorsSource {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn FileSource>) -> Self {
        Self { inner }
    }

    /// The wrapped source.
    pub fn inner(&self) -> &Arc<dyn FileSource> {
        &self.inner
    }

    fn wrap(inner: Arc<dyn FileSource>) -> Arc<dyn FileSource> {
        if inner.is::<NamedErrorsSource>() {
            inner
        } else {
            Arc::new(Self::new(inner))
        }
    }
}

impl fmt::Debug for NamedErrorsSource {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedErrorsSource")
            .field("file_type", &self.inner.file_type())
            .finish()
    }
}

impl FileSource for NamedErrorsSource {
    fn create_file_opener(
        &self,
        object_store: Arc<dyn ObjectStore>,
        base_config: &FileScanConfig,
        partition: usize,
    ) -> Result<Arc<dyn FileOpener>> {
        self.inner
            .create_file_opener(object_store, base_config, partition)
    }

    fn create_morselizer(
        &self,
        object_store: Arc<dyn ObjectStore>,
        base_config: &FileScanConfig,
        partition: usize,
    ) -> Result<Box<dyn Morselizer>> {
        let inner = self.inner.create_morselizer(
            Arc::clone(&object_store),
            base_config,
            partition,
        )?;
        let store = base_config.object_store_url.as_str().to_string();
        Ok(Box::new(NamedErrorsMorselizer {
            inner,
            store,
            object_store,
        }))
    }

    fn table_schema(&self) -> &TableSchema {
        self.inner.table_schema()
    }

    fn with_batch_size(&self, batch_size: usize) -> Arc<dyn FileSource> {
        Self::wrap(self.inner.with_batch_size(batch_size))
    }

    fn filter(&self) -> Option<Arc<dyn PhysicalExpr>> {
        self.inner.filter()
    }

    fn projection(&self) -> Option<&ProjectionExprs> {
        self.inner.projection()
    }

    fn metrics(&self) -> &ExecutionPlanMetricsSet {
        self.inner.metrics()
    }

    fn file_type(&self) -> &str {
        self.inner.file_type()
    }

    fn fmt_extra(&self, t: DisplayFormatType, f: &mut Formatter) -> fmt::Result {
        self.inner.fmt_extra(t, f)
    }

    fn supports_repartitioning(&self) -> bool {
        self.inner.supports_repartitioning()
    }

    fn repartitioned(
        &self,
        target_partitions: usize,
        repartition_file_min_size: usize,
        output_ordering: Option<LexOrdering>,
        config: &FileScanConfig,
    ) -> Result<Option<FileScanConfig>> {
        // `config` holds this wrapper, so the result does too.
        self.inner.repartitioned(
            target_partitions,
            repartition_file_min_size,
            output_ordering,
            config,
        )
    }

    fn try_pushdown_filters(
        &self,
        filters: Vec<Arc<dyn PhysicalExpr>>,
        config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn FileSource>>> {
        let mut result = self.inner.try_pushdown_filters(filters, config)?;
        result.updated_node = result.updated_node.map(Self::wrap);
        Ok(result)
    }

    fn try_pushdown_sort(
        &self,
        order: &[PhysicalSortExpr],
        eq_properties: &EquivalenceProperties,
    ) -> Result<SortOrderPushdownResult<Arc<dyn FileSource>>> {
        Ok(self
            .inner
            .try_pushdown_sort(order, eq_properties)?
            .map(Self::wrap))
    }

    fn reorder_files(&self, files: Vec<PartitionedFile>) -> Vec<PartitionedFile> {
        self.inner.reorder_files(files)
    }

    fn try_pushdown_projection(
        &self,
        projection: &ProjectionExprs,
    ) -> Result<Option<Arc<dyn FileSource>>> {
        Ok(self
            .inner
            .try_pushdown_projection(projection)?
            .map(Self::wrap))
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.inner.apply_expressions(f)
    }

    // Executors get the plain inner source: the wrapper is not a plan node
    // Ballista knows, and naming files there is not worth a codec entry.
    #[cfg(feature = "ballista")]
    fn try_to_proto(
        &self,
        base: &FileScanConfig,
        ctx: &datafusion::physical_plan::proto::ExecutionPlanEncodeCtx<'_>,
    ) -> Result<Option<datafusion_proto::protobuf::PhysicalPlanNode>> {
        self.inner.try_to_proto(base, ctx)
    }
}

/// Names the file in the errors of each file's planners.
#[derive(Debug)]
struct NamedErrorsMorselizer {
    /// The source's morselizer.
    inner: Box<dyn Morselizer>,
    /// The object store URL (`file:///`, `s3://bucket/`), to name files.
    store: String,
    /// The store, to locate the damage in a file that fails.
    object_store: Arc<dyn ObjectStore>,
}

/// A file being read: how the user names it, and where to find it again.
#[derive(Debug)]
struct FileRef {
    name: String,
    object_store: Arc<dyn ObjectStore>,
    meta: object_store::ObjectMeta,
}

impl Morselizer for NamedErrorsMorselizer {
    fn plan_file(&self, file: PartitionedFile) -> Result<Box<dyn MorselPlanner>> {
        let name = if self.store.starts_with("file://") {
            format!("/{}", file.object_meta.location)
        } else {
            format!("{}{}", self.store, file.object_meta.location)
        };
        let file_ref = Arc::new(FileRef {
            name,
            object_store: Arc::clone(&self.object_store),
            meta: file.object_meta.clone(),
        });
        match self.inner.plan_file(file) {
            Ok(inner) => Ok(Box::new(NamedErrorsPlanner {
                inner,
                file: file_ref,
            })),
            Err(e) => Err(name_file(&file_ref.name, e)),
        }
    }
}

/// A planner of one file whose errors, and whose morsels' errors, name it.
#[derive(Debug)]
struct NamedErrorsPlanner {
    /// The source's planner.
    inner: Box<dyn MorselPlanner>,
    /// The file.
    file: Arc<FileRef>,
}

impl NamedErrorsPlanner {
    fn boxed(
        inner: Box<dyn MorselPlanner>,
        file: &Arc<FileRef>,
    ) -> Box<dyn MorselPlanner> {
        Box::new(Self {
            inner,
            file: Arc::clone(file),
        })
    }
}

impl MorselPlanner for NamedErrorsPlanner {
    fn plan(self: Box<Self>) -> Result<Option<MorselPlan>> {
        let file = self.file;
        let inner = self.inner;
        let planned = std::panic::catch_unwind(AssertUnwindSafe(move || inner.plan()))
            .map_err(|panic| reader_panicked(&file.name, &panic))?;
        let Some(mut plan) = planned.map_err(|e| name_file(&file.name, e))? else {
            return Ok(None);
        };
        let morsels: Vec<Box<dyn Morsel>> = plan
            .take_morsels()
            .into_iter()
            .map(|inner| {
                Box::new(NamedErrorsMorsel {
                    inner,
                    file: Arc::clone(&file),
                }) as Box<dyn Morsel>
            })
            .collect();
        let planners: Vec<Box<dyn MorselPlanner>> = plan
            .take_ready_planners()
            .into_iter()
            .map(|inner| Self::boxed(inner, &file))
            .collect();
        let mut wrapped = MorselPlan::new()
            .with_morsels(morsels)
            .with_planners(planners);
        if let Some(pending) = plan.take_pending_planner() {
            let file = Arc::clone(&file);
            wrapped.set_pending_planner(
                AssertUnwindSafe(pending.into_future()).catch_unwind().map(
                    move |planner| match planner {
                        Ok(planner) => planner
                            .map(|inner| Self::boxed(inner, &file))
                            .map_err(|e| name_file(&file.name, e)),
                        Err(panic) => Err(reader_panicked(&file.name, &panic)),
                    },
                ),
            );
        }
        Ok(Some(wrapped))
    }
}

/// A morsel whose stream's errors name its file.
#[derive(Debug)]
struct NamedErrorsMorsel {
    /// The source's morsel.
    inner: Box<dyn Morsel>,
    /// The file.
    file: Arc<FileRef>,
}

impl Morsel for NamedErrorsMorsel {
    fn into_stream(
        self: Box<Self>,
    ) -> futures::stream::BoxStream<'static, Result<datafusion::arrow::array::RecordBatch>>
    {
        let file = self.file;
        // A reader that panics on damaged bytes (parquet 59 unwraps a
        // missing data page header, found by tests/fuzz.rs) is the file's
        // fault too: catch it here, where the file is known, so it is not
        // reported as a bug of the engine. The stream ends after a panic.
        AssertUnwindSafe(self.inner.into_stream())
            .catch_unwind()
            .then(move |item| match item {
                // The batch path stays synchronous: no clone, no future.
                Ok(Ok(batch)) => futures::future::ready(Ok(batch)).left_future(),
                Ok(Err(e)) => {
                    let file = Arc::clone(&file);
                    async move { Err(name_file_located(&file, e).await) }.right_future()
                }
                Err(panic) => {
                    futures::future::ready(Err(reader_panicked(&file.name, &panic)))
                        .left_future()
                }
            })
            .boxed()
    }
}

/// [`name_file`], and for damage also the row group and column chunk that
/// fail: the reader does not say, so the file is read again chunk by chunk
/// (as `VERIFY` does) up to the first chunk that fails. Only on this error
/// path, and bounded by the file.
async fn name_file_located(file: &FileRef, error: DataFusionError) -> DataFusionError {
    if !is_damage(&error) {
        return name_file(&file.name, error);
    }
    match crate::sql::verify::locate_damage(&file.object_store, &file.meta).await {
        Some(place) => exec_datafusion_err!(
            "cannot read the data of '{}' ({place}): {}. The file is damaged: restore it \
             from its source, or exclude it from the path",
            file.name,
            super::verify::reason(&error)
        ),
        None => name_file(&file.name, error),
    }
}

/// A panic of the reader on `file`, as a damage error naming it.
fn reader_panicked(file: &str, panic: &Box<dyn std::any::Any + Send>) -> DataFusionError {
    exec_datafusion_err!(
        "cannot read the data of '{file}': the Parquet reader panicked on it ({}). The \
         file is damaged: restore it from its source, or exclude it from the path",
        crate::exec::panic_message(panic)
    )
}
