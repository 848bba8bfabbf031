//! [`ShuffleNode`]: the logical plan node of `SHUFFLE` and `LOCAL SHUFFLE`.

use std::fmt;

use datafusion::common::internal_err;
use datafusion::common::plan_err;
use datafusion::error::Result;
use datafusion::logical_expr::{LogicalPlan, UserDefinedLogicalNodeCore};

use super::ShuffleSpec;

/// What a global shuffle's content hash is computed from (see the
/// [module docs](super) for the order it defines).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, serde::Serialize, serde::Deserialize,
)]
pub enum ShuffleKey {
    /// Every input column, in schema order.
    AllColumns,
    /// These input columns, in this order: the rows as they enter the
    /// query's row-wise functions ([`super::late`]).
    Columns(Vec<String>),
    /// This input column holds each row's content hash already (a cached
    /// result stores it, so that a cached feed keeps the uncached order).
    ContentHash(String),
    /// `SHUFFLE BY POSITION` over rows stored in the order of this epoch
    /// of the same seed (a feed's epoch cache, filled by that epoch): a
    /// row's rank is where it comes in that order, not its file and row,
    /// so that a cached feed keeps the uncached order.
    StoredOrder(u64),
}

impl ShuffleKey {
    /// The input columns it names.
    fn columns(&self) -> &[String] {
        match self {
            ShuffleKey::AllColumns => &[],
            ShuffleKey::Columns(names) => names,
            ShuffleKey::ContentHash(name) => std::slice::from_ref(name),
            ShuffleKey::StoredOrder(_) => &[],
        }
    }
}

impl fmt::Display for ShuffleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShuffleKey::AllColumns => write!(f, "all columns"),
            ShuffleKey::Columns(names) => write!(f, "[{}]", names.join(", ")),
            ShuffleKey::ContentHash(name) => write!(f, "content hash {name}"),
            ShuffleKey::StoredOrder(epoch) => {
                write!(f, "stored in epoch {epoch}'s order")
            }
        }
    }
}

/// Reorders its input as [`ShuffleSpec`] says; the schema is unchanged.
///
/// A global shuffle orders rows by a hash of their content, computed as
/// [`ShuffleKey`] says. [`super::late`] keys the rows as they enter the
/// query's row-wise expressions, so that those expressions can run before
/// or after the shuffle with the same order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct ShuffleNode {
    /// The rows to shuffle.
    input: LogicalPlan,
    /// How.
    spec: ShuffleSpec,
    /// What the content hash is computed from.
    key: ShuffleKey,
}

impl ShuffleNode {
    /// Shuffles `input` keyed on all its columns; a local buffer of zero
    /// rows is an error.
    pub fn try_new(input: LogicalPlan, spec: ShuffleSpec) -> Result<Self> {
        Self::try_new_keyed(input, spec, ShuffleKey::AllColumns)
    }

    /// Shuffles `input` keyed as `key` says; a column it names that is not
    /// an input column is an internal error.
    pub fn try_new_keyed(
        input: LogicalPlan,
        spec: ShuffleSpec,
        key: ShuffleKey,
    ) -> Result<Self> {
        if let ShuffleSpec::Local { buffer_rows: 0, .. } = spec {
            return plan_err!("LOCAL SHUFFLE BUFFER must hold at least 1 row");
        }
        if let ShuffleSpec::Windowed { window_rows: 0, .. } = spec {
            return plan_err!("SHUFFLE WINDOW must hold at least 1 row");
        }
        if matches!(key, ShuffleKey::StoredOrder(_))
            && !matches!(spec, ShuffleSpec::Positional { .. })
        {
            return internal_err!("a {spec:?} shuffle keyed by {key}");
        }
        let schema = input.schema();
        if let Some(missing) = key
            .columns()
            .iter()
            .find(|name| schema.fields().iter().all(|f| f.name() != *name))
        {
            return internal_err!(
                "Shuffle key column '{missing}' is not a column of its input ({})",
                schema.field_names().join(", ")
            );
        }
        Ok(Self { input, spec, key })
    }

    /// How the rows are shuffled.
    pub fn spec(&self) -> ShuffleSpec {
        self.spec
    }

    /// What the content hash is computed from.
    pub fn key(&self) -> &ShuffleKey {
        &self.key
    }

    /// The rows shuffled.
    pub fn input(&self) -> &LogicalPlan {
        &self.input
    }

    /// The same shuffle of another input (with the same key).
    pub(crate) fn with_input(&self, input: LogicalPlan) -> Result<Self> {
        Self::try_new_keyed(input, self.spec, self.key.clone())
    }
}

impl UserDefinedLogicalNodeCore for ShuffleNode {
    crate::exec::one_input_logical_node! {
        name: "Shuffle",
        input: input,
        rebuild: |this, input| this.with_input(input),
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self.spec {
            ShuffleSpec::Global { seed, epoch } => {
                write!(f, "Shuffle: seed={seed}, epoch={epoch}")?;
                match &self.key {
                    ShuffleKey::AllColumns => Ok(()),
                    key => write!(f, ", key={key}"),
                }
            }
            ShuffleSpec::Windowed {
                seed,
                epoch,
                window_rows,
                only_window,
            } => {
                write!(
                    f,
                    "Shuffle: window={window_rows}, seed={seed}, epoch={epoch}"
                )?;
                if let Some(window) = only_window {
                    write!(f, ", only_window={window}")?;
                }
                match &self.key {
                    ShuffleKey::AllColumns => Ok(()),
                    key => write!(f, ", key={key}"),
                }
            }
            ShuffleSpec::Positional { seed, epoch } => {
                write!(f, "Shuffle: by position, seed={seed}, epoch={epoch}")?;
                match &self.key {
                    ShuffleKey::StoredOrder(stored) => {
                        write!(f, ", stored in epoch {stored}'s order")
                    }
                    _ => Ok(()),
                }
            }
            ShuffleSpec::Local { buffer_rows, seed } => {
                write!(f, "LocalShuffle: buffer={buffer_rows}, seed={seed}")
            }
        }
    }

    fn necessary_children_exprs(
        &self,
        output_columns: &[usize],
    ) -> Option<Vec<Vec<usize>>> {
        // A shuffle passes its input's columns through; the order needs the
        // key's columns too. Columns neither read above nor hashed are not
        // moved through it (a provenance query keys by a content hash and
        // drops the key's wide columns before the shuffle). An all-columns
        // key hashes every column, so none may go.
        let schema = self.input.schema();
        // Ordered by where rows live, not by their values: only what is
        // read above goes through.
        if let ShuffleSpec::Positional { .. } = self.spec {
            return Some(vec![output_columns.to_vec()]);
        }
        let mut needed: Vec<usize> = match &self.key {
            ShuffleKey::AllColumns => {
                return Some(vec![(0..schema.fields().len()).collect()]);
            }
            key => key
                .columns()
                .iter()
                .map(|name| schema.fields().iter().position(|f| f.name() == name))
                .collect::<Option<Vec<usize>>>()?,
        };
        needed.extend_from_slice(output_columns);
        needed.sort_unstable();
        needed.dedup();
        Some(vec![needed])
    }

    fn supports_limit_pushdown(&self) -> bool {
        // A LIMIT above a shuffle takes a random subset; pushing it below
        // would take the first rows and shuffle only those.
        false
    }
}
