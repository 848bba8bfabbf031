//! [`ShuffleNode`]: the logical plan node of `SHUFFLE` and `LOCAL SHUFFLE`.

use std::fmt;

use datafusion::common::DFSchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use super::ShuffleSpec;

/// Reorders its input as [`ShuffleSpec`] says; the schema is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct ShuffleNode {
    /// The rows to shuffle.
    input: LogicalPlan,
    /// How.
    spec: ShuffleSpec,
}

impl ShuffleNode {
    /// Shuffles `input`; a local buffer of zero rows is an error.
    pub fn try_new(input: LogicalPlan, spec: ShuffleSpec) -> Result<Self> {
        if let ShuffleSpec::Local { buffer_rows: 0, .. } = spec {
            return Err(DataFusionError::Plan(
                "LOCAL SHUFFLE BUFFER must hold at least 1 row".into(),
            ));
        }
        Ok(Self { input, spec })
    }

    /// How the rows are shuffled.
    pub fn spec(&self) -> ShuffleSpec {
        self.spec
    }
}

impl UserDefinedLogicalNodeCore for ShuffleNode {
    fn name(&self) -> &str {
        "Shuffle"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        vec![&self.input]
    }

    fn schema(&self) -> &DFSchemaRef {
        self.input.schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.spec {
            ShuffleSpec::Global { seed, epoch } => {
                write!(f, "Shuffle: seed={seed}, epoch={epoch}")
            }
            ShuffleSpec::Local { buffer_rows, seed } => {
                write!(f, "LocalShuffle: buffer={buffer_rows}, seed={seed}")
            }
        }
    }

    fn with_exprs_and_inputs(
        &self,
        exprs: Vec<Expr>,
        mut inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        if !exprs.is_empty() || inputs.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "Shuffle takes no expressions and one input, got {} and {}",
                exprs.len(),
                inputs.len()
            )));
        }
        Self::try_new(inputs.swap_remove(0), self.spec)
    }

    fn supports_limit_pushdown(&self) -> bool {
        // A LIMIT above a shuffle takes a random subset; pushing it below
        // would take the first rows and shuffle only those.
        false
    }
}
