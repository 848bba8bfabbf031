//! [`ShuffleNode`]: the logical plan node of `SHUFFLE` and `LOCAL SHUFFLE`.

use std::fmt;

use datafusion::common::DFSchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, LogicalPlan, UserDefinedLogicalNodeCore};

use super::ShuffleSpec;

/// Reorders its input as [`ShuffleSpec`] says; the schema is unchanged.
///
/// A global shuffle orders rows by a hash of their content; `key` names the
/// input columns hashed (all of them when `None`). [`super::late`] keys the
/// rows as they enter the query's row-wise expressions, so that those
/// expressions can run before or after the shuffle with the same order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct ShuffleNode {
    /// The rows to shuffle.
    input: LogicalPlan,
    /// How.
    spec: ShuffleSpec,
    /// Names of the input columns the shuffle key hashes, in hashing order;
    /// `None`: every column, in schema order.
    key: Option<Vec<String>>,
}

impl ShuffleNode {
    /// Shuffles `input`; a local buffer of zero rows is an error.
    pub fn try_new(input: LogicalPlan, spec: ShuffleSpec) -> Result<Self> {
        if let ShuffleSpec::Local { buffer_rows: 0, .. } = spec {
            return Err(DataFusionError::Plan(
                "LOCAL SHUFFLE BUFFER must hold at least 1 row".into(),
            ));
        }
        Ok(Self {
            input,
            spec,
            key: None,
        })
    }

    /// Shuffles `input` by a key hashing only the `key` columns (in that
    /// order); a name that is not an input column is an internal error.
    pub fn try_new_keyed(
        input: LogicalPlan,
        spec: ShuffleSpec,
        key: Vec<String>,
    ) -> Result<Self> {
        let schema = input.schema();
        if let Some(missing) = key
            .iter()
            .find(|name| schema.fields().iter().all(|f| f.name() != *name))
        {
            return Err(DataFusionError::Internal(format!(
                "Shuffle key column '{missing}' is not a column of its input ({})",
                schema.field_names().join(", ")
            )));
        }
        let mut node = Self::try_new(input, spec)?;
        node.key = Some(key);
        Ok(node)
    }

    /// How the rows are shuffled.
    pub fn spec(&self) -> ShuffleSpec {
        self.spec
    }

    /// The input columns the shuffle key hashes (`None`: all).
    pub fn key(&self) -> Option<&[String]> {
        self.key.as_deref()
    }

    /// The rows shuffled.
    pub fn input(&self) -> &LogicalPlan {
        &self.input
    }

    /// The same shuffle of another input (with the same key columns).
    pub(crate) fn with_input(&self, input: LogicalPlan) -> Result<Self> {
        match &self.key {
            Some(key) => Self::try_new_keyed(input, self.spec, key.clone()),
            None => Self::try_new(input, self.spec),
        }
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
                write!(f, "Shuffle: seed={seed}, epoch={epoch}")?;
                match &self.key {
                    Some(key) => write!(f, ", key=[{}]", key.join(", ")),
                    None => Ok(()),
                }
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
        self.with_input(inputs.swap_remove(0))
    }

    fn supports_limit_pushdown(&self) -> bool {
        // A LIMIT above a shuffle takes a random subset; pushing it below
        // would take the first rows and shuffle only those.
        false
    }
}
