//! sqlfeed's settings: [`SqlfeedOptions`] (set like DataFusion's, with
//! `SET sqlfeed.<name> = <value>`), and the one definition of the settings
//! under which a query's partitions hold the same rows on every run
//! ([`deterministic_config`]). A leaf: every other module may read them.

mod deterministic;
mod options;

pub use deterministic::{PartitionOrder, deterministic_config};
pub use options::{SqlfeedOptions, SqlfeedSettings};
