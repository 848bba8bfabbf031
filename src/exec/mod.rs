//! The operator toolkit every operator module shares (`shuffle`, `cache`,
//! `sql`, `cluster`, `feed`): a leaf that imports nothing of the crate.
//!
//! - [`plan`]: the scaffolding of operators (leaves, single inputs, one
//!   output partition, metrics; the statistics of operators that pass rows
//!   through), and which expressions are costly per row;
//! - [`lanes`]: an unshuffled query's partitions read as one stream, in
//!   turns of rows (the feed's and a cluster job's order);
//! - [`display`]: how operators show their settings in plans;
//! - [`panics`]: panics turned into errors, in one place;
//! - [`rule`]: optimizer rules that rewrite a plan one node at a time;
//! - [`row_errors`]: a projection's failing rows marked instead of fatal
//!   (a feed's quarantine).

pub(crate) mod batches;
pub(crate) mod display;
pub(crate) mod lanes;
pub(crate) mod panics;
pub(crate) mod plan;
pub(crate) mod row_errors;
pub(crate) mod row_index;
pub(crate) mod rule;
pub(crate) mod sequence;

pub(crate) use display::{Setting, fmt_settings};
pub(crate) use panics::{catch_panic, catching_panics, panic_error, panic_message};
pub(crate) use plan::{
    BatchStream, calls_costly_function, column_named, column_names,
    costly_function_names, counted_rows, first_input_statistics, is_parquet_table,
    keeps_input_order, leaf, metrics_of_field, name_and_properties, no_expressions,
    node_kind, one_bounded_partition, one_input_logical_node, one_input_operator,
    only_partition, row_wise_properties, rows_passed_through, single_child,
    statistics_of_one_input, with_u64_column,
};
pub(crate) use rule::{
    NodeRewrite, PlanNode, Rewritten, node_rewrite_rule, rewrite_nodes,
};
