//! Which stage of a feed each operator's time belongs to, read from the
//! running plan's live metrics (DataFusion updates an operator's metrics
//! while it runs, so a walk of the plan at any moment gives the time each
//! operator has spent so far).
//!
//! | stage | operators | time |
//! |---|---|---|
//! | `scan` | `DataSourceExec` | `time_elapsed_processing`: decompressing and decoding Parquet |
//! | the costly functions' names (`image_decode+image_resize`) | a projection calling a costly function | `elapsed_compute`, summed over its workers |
//! | `shuffle` | sqlfeed's shuffle, mixture and deal operators | `elapsed_compute` |
//! | `sort` | `SortExec`, `SortPreservingMergeExec` | `elapsed_compute` |
//! | `cache` | reading and filling the epoch cache | `elapsed_compute` |
//! | `other` | every other operator (filters, cheap projections, joins) | `elapsed_compute` |
//!
//! The feed's own sink is not walked: its batch conversion is the feed's
//! `convert` counter.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;

use crate::exec::costly_function_names;
use crate::sql::ParallelProjectionExec;

/// The stage that scans files.
pub(crate) const SCAN: &str = "scan";
/// Operators of a global or local shuffle, a mixture, the deal to ranks.
const SHUFFLE: &str = "shuffle";
const SHUFFLE_OPERATORS: &[&str] = &[
    "ShuffleKeyExec",
    "PermuteExec",
    "ShuffleMergeExec",
    "LocalShuffleExec",
    "MixExec",
    "MixWindowExec",
    "DealExec",
    "RangeBucketExec",
    "RankShardExec",
];
const SORT_OPERATORS: &[&str] = &["SortExec", "SortPreservingMergeExec"];
const CACHE_OPERATORS: &[&str] =
    &["CacheScanExec", "CacheFillExec", "SharedEntryWriteExec"];
/// Operators whose time is counted elsewhere or is only waiting.
const NOT_COUNTED: &[&str] = &["DeviceSinkExec", "CoalescePartitionsExec"];

/// What a plan's operators did so far.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PlanTotals {
    /// Busy nanoseconds per stage.
    pub(crate) busy_ns: BTreeMap<String, u64>,
    /// Bytes the scans read from storage.
    pub(crate) bytes_scanned: u64,
    /// Bytes written to spill files.
    pub(crate) spilled_bytes: u64,
}

impl PlanTotals {
    /// Adds `other` (a finished epoch's plan) to these totals.
    pub(crate) fn add(&mut self, other: &PlanTotals) {
        for (stage, ns) in &other.busy_ns {
            *self.busy_ns.entry(stage.clone()).or_default() += ns;
        }
        self.bytes_scanned += other.bytes_scanned;
        self.spilled_bytes += other.spilled_bytes;
    }
}

/// The time and bytes of every operator of `plan` so far, by stage.
pub(crate) fn plan_totals(plan: &Arc<dyn ExecutionPlan>) -> PlanTotals {
    let mut totals = PlanTotals::default();
    add_operator(plan, &mut totals);
    totals
}

fn add_operator(plan: &Arc<dyn ExecutionPlan>, totals: &mut PlanTotals) {
    if let Some(metrics) = plan.metrics() {
        let sum = |name: &str| {
            metrics
                .sum_by_name(name)
                .map_or(0, |value| value.as_usize() as u64)
        };
        totals.spilled_bytes += sum("spilled_bytes");
        let name = plan.name();
        let (stage, busy) = if name == "DataSourceExec" {
            totals.bytes_scanned += sum("bytes_scanned");
            (Some(SCAN.to_string()), sum("time_elapsed_processing"))
        } else {
            let compute = metrics.elapsed_compute().unwrap_or(0) as u64;
            (stage_of(plan.as_ref()), compute)
        };
        if let Some(stage) = stage
            && busy > 0
        {
            *totals.busy_ns.entry(stage).or_default() += busy;
        }
    }
    for child in plan.children() {
        add_operator(child, totals);
    }
}

/// The stage an operator other than a scan belongs to (`None`: not counted).
fn stage_of(plan: &dyn ExecutionPlan) -> Option<String> {
    let name = plan.name();
    if NOT_COUNTED.contains(&name) {
        return None;
    }
    let projection = plan
        .downcast_ref::<ProjectionExec>()
        .map(ProjectionExec::expr)
        .or_else(|| {
            plan.downcast_ref::<ParallelProjectionExec>()
                .map(ParallelProjectionExec::exprs)
        });
    if let Some(exprs) = projection {
        let functions = costly_function_names(exprs.iter().map(|p| &p.expr));
        if !functions.is_empty() {
            return Some(functions.join("+"));
        }
    }
    let stage = if SHUFFLE_OPERATORS.contains(&name) {
        SHUFFLE
    } else if SORT_OPERATORS.contains(&name) {
        "sort"
    } else if CACHE_OPERATORS.contains(&name) {
        "cache"
    } else {
        "other"
    };
    Some(stage.to_string())
}
