//! [`MixWindowExec`]: one source of a mixture as its epoch's window of
//! passes: the rows the epoch takes from it, in their order.
//!
//! ```text
//!  ProjectionExec: the source's row-wise functions (only where it has any:
//!    │             run on the window's rows alone, see the planner)
//!  MixWindowExec: pass p from row `skip` on, then pass p+1 …, `take` rows
//!    ├── ShuffleMergeExec <source's rows as they enter its functions>
//!    │     (seed of the source, epoch = p)
//!    └── ShuffleMergeExec <the same>  (epoch = p+1)
//! ```
//! With `MIX … WINDOW n` each pass is a `WindowedShuffleExec` over that
//! shuffle instead, the first one starting at row `skip` itself (its
//! windows before it are not run), and this operator skips nothing.
//!
//! # Order
//! The passes in turn, each in its shuffle's order: a pure function of the
//! source's rows, its seed and the window.
//!
//! # Memory
//! One pass runs at a time, and it is dropped (its shuffle's memory and
//! spill files freed) before the next one starts. A pass is only started
//! when the window needs rows from it. A windowed pass holds about two of
//! its windows, not the source.
//!
//! # Metrics
//! `output_rows`, `elapsed_compute`.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::exec::BatchStream;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::internal_err;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, PlanProperties,
};
use futures::StreamExt;

use super::pattern::Window;

/// The rows of a source's window; see the module docs.
#[derive(Debug)]
pub struct MixWindowExec {
    /// The source's name, shown in plans.
    source: String,
    /// Pass `window.first_pass + i` is `passes[i]`; one partition each.
    passes: Vec<Arc<dyn ExecutionPlan>>,
    window: Window,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl MixWindowExec {
    /// The window `window` of `passes` (all with one schema, one
    /// partition each) of the source named `source`.
    pub fn try_new(
        source: String,
        passes: Vec<Arc<dyn ExecutionPlan>>,
        window: Window,
    ) -> Result<Self> {
        if passes.len() as u64 != window.passes || passes.is_empty() {
            return internal_err!(
                "mixture source '{source}' has {} pass plans for a window of {} passes",
                passes.len(),
                window.passes
            );
        }
        let schema: SchemaRef = passes[0].schema();
        let properties = Arc::new(crate::exec::one_bounded_partition(
            schema,
            EmissionType::Incremental,
        ));
        Ok(Self {
            source,
            passes,
            window,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// The source's name.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Which rows of the passes the epoch takes.
    pub fn window(&self) -> Window {
        self.window
    }
}

impl DisplayAs for MixWindowExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let w = &self.window;
        write!(
            f,
            "MixWindowExec: {}: take {} from pass {} (skip {}, {} passes)",
            self.source, w.take, w.first_pass, w.skip, w.passes
        )
    }
}

impl ExecutionPlan for MixWindowExec {
    crate::exec::name_and_properties!("MixWindowExec");

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.passes.iter().collect()
    }

    crate::exec::no_expressions!();

    // The passes' orders are the window's order, but no sort order is
    // claimed: nothing above may rely on one.
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false; self.passes.len()]
    }

    // Each pass is one partition in its shuffle order, read from the start.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false; self.passes.len()]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition; self.passes.len()]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(
            self.source.clone(),
            children,
            self.window,
        )?))
    }

    fn execute(&self, partition: usize, ctx: Arc<TaskContext>) -> Result<BatchStream> {
        crate::exec::only_partition("MixWindowExec", partition)?;
        let reader = WindowReader {
            passes: self.passes.iter().cloned().collect(),
            current: None,
            skip: self.window.skip,
            left: self.window.take,
            context: ctx,
            baseline: BaselineMetrics::new(&self.metrics, partition),
        };
        // Ends after the first error.
        let stream = futures::stream::try_unfold(reader, |mut reader| async move {
            Ok(reader.next_slice().await?.map(|batch| (batch, reader)))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }

    crate::exec::metrics_of_field!();
}

/// Reads the window: the passes in turn, `skip` rows dropped, `left` rows
/// still to give.
struct WindowReader {
    passes: VecDeque<Arc<dyn ExecutionPlan>>,
    current: Option<SendableRecordBatchStream>,
    skip: u64,
    left: u64,
    context: Arc<TaskContext>,
    baseline: BaselineMetrics,
}

impl WindowReader {
    /// The next rows of the window, `None` when it is whole or the passes
    /// ended (the mixture reports a source that ended short).
    async fn next_slice(&mut self) -> Result<Option<RecordBatch>> {
        while self.left > 0 {
            let stream = match &mut self.current {
                Some(stream) => stream,
                None => match self.passes.pop_front() {
                    Some(pass) => self
                        .current
                        .insert(pass.execute(0, Arc::clone(&self.context))?),
                    None => return Ok(None),
                },
            };
            let Some(batch) = stream.next().await.transpose()? else {
                // This pass is read: free it before the next one runs.
                self.current = None;
                continue;
            };
            let rows = batch.num_rows() as u64;
            if self.skip >= rows {
                self.skip -= rows;
                continue;
            }
            let length = (rows - self.skip).min(self.left);
            let slice = batch.slice(self.skip as usize, length as usize);
            self.skip = 0;
            self.left -= length;
            if self.left == 0 {
                // The window is whole: stop the pass's shuffle now.
                self.current = None;
                self.passes.clear();
            }
            self.baseline.record_output(slice.num_rows());
            return Ok(Some(slice));
        }
        Ok(None)
    }
}
