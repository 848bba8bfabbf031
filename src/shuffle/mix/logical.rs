//! [`MixNode`]: the logical plan node of `MIX`.

use std::fmt;

use datafusion::common::{DFSchemaRef, plan_err};
use datafusion::error::Result;
use datafusion::logical_expr::{
    Expr, LogicalPlan, Projection, UserDefinedLogicalNodeCore, cast,
};

/// What a `MIX` asks for: its sources' names and weights, and the epoch's
/// size, seed and number when given.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct MixSpec {
    /// The `source` column's value for each source.
    pub names: Vec<String>,
    /// Each source's weight, as `f64` bits (so the spec is `Eq` and `Hash`).
    weight_bits: Vec<u64>,
    /// `ROWS n`: rows per epoch; without it, all the sources' rows.
    pub rows: Option<u64>,
    /// `SEED s`; without it the feed's seed, or 0 outside a feed.
    pub seed: Option<u64>,
    /// `EPOCH e`; without it the feed's epoch, or 0 outside a feed.
    pub epoch: Option<u64>,
    /// Each source's weight schedule as (step, weight bits) points; empty
    /// for a fixed weight.
    schedule_bits: Vec<Vec<(u64, u64)>>,
    /// `BATCH g`: rows per global step of the schedules; without it the
    /// feed's batch size × world.
    pub step_rows: Option<u64>,
    /// `WINDOW n`: each pass over a source is a windowed shuffle of windows
    /// of at least `n` rows (`SHUFFLE WINDOW n`'s order) instead of a
    /// global one; see "Passes in windows" in [`super`].
    pub window_rows: Option<u64>,
}

impl MixSpec {
    /// A spec of sources `names` with `weights`.
    pub fn new(
        names: Vec<String>,
        weights: &[f64],
        rows: Option<u64>,
        seed: Option<u64>,
        epoch: Option<u64>,
    ) -> Self {
        Self {
            names,
            weight_bits: weights.iter().map(|w| w.to_bits()).collect(),
            rows,
            seed,
            epoch,
            schedule_bits: vec![],
            step_rows: None,
            window_rows: None,
        }
    }

    /// The same spec with each pass over a source shuffled in windows of
    /// `window_rows` rows (`None`: globally).
    pub fn with_window_rows(mut self, window_rows: Option<u64>) -> Self {
        self.window_rows = window_rows;
        self
    }

    /// The same spec with weight schedules (one per source, empty for a
    /// fixed weight) counted in steps of `step_rows` rows.
    pub fn with_schedules(
        mut self,
        schedules: &[Vec<(u64, f64)>],
        step_rows: Option<u64>,
    ) -> Self {
        self.schedule_bits = schedules
            .iter()
            .map(|points| points.iter().map(|(s, w)| (*s, w.to_bits())).collect())
            .collect();
        self.step_rows = step_rows;
        self
    }

    /// Each source's schedule points, when any source has a schedule.
    pub fn schedules(&self) -> Option<Vec<Vec<(u64, f64)>>> {
        self.schedule_bits
            .iter()
            .any(|p| !p.is_empty())
            .then(|| self.schedule_points())
    }

    /// Each source's schedule points as given (empty lists for fixed
    /// weights, or no lists at all), for a codec to carry.
    pub fn schedule_points(&self) -> Vec<Vec<(u64, f64)>> {
        self.schedule_bits
            .iter()
            .map(|points| {
                points
                    .iter()
                    .map(|(s, b)| (*s, f64::from_bits(*b)))
                    .collect()
            })
            .collect()
    }

    /// Each source's weight.
    pub fn weights(&self) -> Vec<f64> {
        self.weight_bits
            .iter()
            .map(|b| f64::from_bits(*b))
            .collect()
    }
}

/// Interleaves its inputs (the sources, same columns) as [`MixSpec`] says;
/// the schema is the first input's.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd)]
pub struct MixNode {
    inputs: Vec<LogicalPlan>,
    spec: MixSpec,
}

impl MixNode {
    /// Mixes `inputs`, one per name of `spec`. Inputs whose columns have
    /// other names or types than the first's are projected onto its names
    /// and cast to its types, as `UNION ALL` does; a different number of
    /// columns is an error that names the source.
    pub fn try_new(inputs: Vec<LogicalPlan>, spec: MixSpec) -> Result<Self> {
        if inputs.len() != spec.names.len() || inputs.is_empty() {
            return plan_err!(
                "a mixture has {} sources but {} names",
                inputs.len(),
                spec.names.len()
            );
        }
        let first = std::sync::Arc::clone(inputs[0].schema());
        let mut aligned = Vec::with_capacity(inputs.len());
        for (input, name) in inputs.into_iter().zip(&spec.names) {
            let schema = std::sync::Arc::clone(input.schema());
            if schema.fields().len() != first.fields().len() {
                return plan_err!(
                    "mixture source '{name}' has {} columns ({}) but the first source has {} ({}); \
                     every source must give the same columns",
                    schema.fields().len(),
                    schema.field_names().join(", "),
                    first.fields().len(),
                    first.field_names().join(", ")
                );
            }
            let same = schema
                .fields()
                .iter()
                .zip(first.fields())
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
            if same {
                aligned.push(input);
                continue;
            }
            let exprs: Vec<Expr> = schema
                .columns()
                .into_iter()
                .zip(schema.fields().iter().zip(first.fields()))
                .map(|(column, (own, target))| {
                    let value = Expr::Column(column);
                    let value = if own.data_type() == target.data_type() {
                        value
                    } else {
                        cast(value, target.data_type().clone())
                    };
                    value.alias(target.name())
                })
                .collect();
            aligned.push(LogicalPlan::Projection(Projection::try_new(
                exprs,
                std::sync::Arc::new(input),
            )?));
        }
        Ok(Self {
            inputs: aligned,
            spec,
        })
    }

    /// What the mixture asks for.
    pub fn spec(&self) -> &MixSpec {
        &self.spec
    }

    /// The mixture's columns (the first source's).
    pub fn arrow_schema(&self) -> datafusion::arrow::datatypes::Schema {
        self.inputs[0].schema().as_arrow().clone()
    }
}

impl UserDefinedLogicalNodeCore for MixNode {
    fn name(&self) -> &str {
        "Mix"
    }

    fn inputs(&self) -> Vec<&LogicalPlan> {
        self.inputs.iter().collect()
    }

    fn schema(&self) -> &DFSchemaRef {
        self.inputs[0].schema()
    }

    fn expressions(&self) -> Vec<Expr> {
        vec![]
    }

    fn fmt_for_explain(&self, f: &mut fmt::Formatter) -> fmt::Result {
        let shown =
            |v: Option<u64>| v.map_or("feed's or 0".to_string(), |v| v.to_string());
        write!(f, "Mix: ")?;
        for (name, weight) in self.spec.names.iter().zip(self.spec.weights()) {
            write!(f, "{name}={weight}, ")?;
        }
        if let Some(schedules) = self.spec.schedules() {
            for (name, points) in self.spec.names.iter().zip(schedules) {
                if !points.is_empty() {
                    write!(f, "{name} by step {points:?}, ")?;
                }
            }
        }
        write!(
            f,
            "rows={}, seed={}, epoch={}",
            self.spec.rows.map_or("all".to_string(), |r| r.to_string()),
            shown(self.spec.seed),
            shown(self.spec.epoch)
        )?;
        if let Some(window_rows) = self.spec.window_rows {
            write!(f, ", passes in windows of {window_rows}")?;
        }
        Ok(())
    }

    fn with_exprs_and_inputs(
        &self,
        exprs: Vec<Expr>,
        inputs: Vec<LogicalPlan>,
    ) -> Result<Self> {
        if !exprs.is_empty() {
            return plan_err!("Mix takes no expressions, got {}", exprs.len());
        }
        Self::try_new(inputs, self.spec.clone())
    }

    fn necessary_children_exprs(
        &self,
        _output_columns: &[usize],
    ) -> Option<Vec<Vec<usize>>> {
        // Each source is shuffled by the content of all its columns, so all
        // of them stay.
        Some(
            self.inputs
                .iter()
                .map(|input| (0..input.schema().fields().len()).collect())
                .collect(),
        )
    }

    fn supports_limit_pushdown(&self) -> bool {
        false
    }
}
