//! `SqlResult`: a planned query whose rows are read through the Arrow
//! PyCapsule stream interface (`__arrow_c_stream__`), so pyarrow, Polars
//! and DuckDB read them without a copy.
//!
//! ```text
//!  pyarrow.table(result) ─► __arrow_c_stream__() ─► capsule "arrow_array_stream"
//!      consumer's get_next() ─► block_on(stream.next()) on the session runtime
//! ```
//! The query starts when the capsule is made and stops when the consumer
//! releases the stream (or drops the capsule unread).

use std::sync::Arc;

use arrow_array::ffi_stream::FFI_ArrowArrayStream;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatchReader;
use datafusion::dataframe::DataFrame;
use datafusion::execution::SendableRecordBatchStream;
use futures::StreamExt;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use sqlfeed::Session;

use crate::errors::PlanError;

/// A planned query; see `sqlfeed.SqlResult`.
#[pyclass(module = "sqlfeed._sqlfeed", name = "SqlResult", frozen)]
pub(crate) struct PySqlResult {
    /// The plan (cloned for every read: a result can be read many times).
    df: DataFrame,
    /// The session (its memory budget, cluster, …).
    session: Session,
    /// Where the stream's futures run.
    runtime: Arc<crate::session::SessionRuntime>,
}

impl PySqlResult {
    pub(crate) fn new(
        df: DataFrame,
        session: Session,
        runtime: Arc<crate::session::SessionRuntime>,
    ) -> Self {
        Self {
            df,
            session,
            runtime,
        }
    }

    fn dataframe(&self) -> DataFrame {
        self.df.clone()
    }
}

#[pymethods]
impl PySqlResult {
    /// The Arrow PyCapsule stream protocol. `requested_schema` is not
    /// supported (the result has one schema); pass None.
    #[pyo3(signature = (requested_schema = None))]
    fn __arrow_c_stream__<'py>(
        &self,
        py: Python<'py>,
        requested_schema: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        if requested_schema.is_some_and(|s| !s.is_none()) {
            return Err(PlanError::new_err(
                "sqlfeed results have one schema; cast in SQL instead of passing \
                 requested_schema",
            ));
        }
        let df = self.dataframe();
        let session = self.session.clone();
        let stream = crate::wait::wait_for_future(py, &self.runtime, async move {
            let plan = df.create_physical_plan().await?;
            session.execute_stream(plan)
        })?;
        let reader = BlockingReader {
            schema: Arc::clone(self.df.schema().inner()),
            stream: Some(stream),
            runtime: Arc::clone(&self.runtime),
        };
        let ffi = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new_with_value(py, ffi, c"arrow_array_stream")
    }

    /// Runs the query to the end (errors raise here, as sqlfeed errors) and
    /// returns its batches as an Arrow stream capsule; what `to_arrow()`
    /// reads.
    fn _collect_stream<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyCapsule>> {
        let df = self.dataframe();
        let schema = Arc::clone(df.schema().inner());
        let session = self.session.clone();
        let batches = crate::wait::wait_for_future(py, &self.runtime, async move {
            session.collect(df).await
        })?;
        // The batches' own schema: the plan's may differ in metadata.
        let schema = batches.first().map_or(schema, RecordBatch::schema);
        let reader = datafusion::arrow::record_batch::RecordBatchIterator::new(
            batches.into_iter().map(Ok),
            schema,
        );
        let ffi = FFI_ArrowArrayStream::new(Box::new(reader));
        PyCapsule::new_with_value(py, ffi, c"arrow_array_stream")
    }

    /// The column names.
    #[getter]
    fn columns(&self) -> Vec<String> {
        self.df
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// The plan as `EXPLAIN` prints it.
    fn explain(&self, py: Python<'_>) -> PyResult<String> {
        let df = self.dataframe();
        crate::wait::wait_for_future(py, &self.runtime, async move {
            let plan = df.create_physical_plan().await?;
            Ok(datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string())
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "sqlfeed.SqlResult(columns={:?}); read it with pyarrow.table(result), \
             result.to_arrow() or result.to_pylist()",
            self.columns()
        )
    }
}

/// Reads a DataFusion stream for a synchronous Arrow consumer.
struct BlockingReader {
    /// The result's schema.
    schema: SchemaRef,
    /// `None` once finished or failed.
    stream: Option<SendableRecordBatchStream>,
    /// Runs the stream's futures (the consumer's thread only waits).
    runtime: Arc<crate::session::SessionRuntime>,
}

impl Iterator for BlockingReader {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let stream = self.stream.as_mut()?;
        // The consumer (pyarrow, Polars, DuckDB) may call with the GIL held;
        // the query may run Python functions on engine threads, which need
        // it: wait without it.
        let runtime = &self.runtime;
        let next = Python::attach(|py| py.detach(|| runtime.block_on(stream.next())));
        match next {
            Some(Ok(batch)) => Some(Ok(batch)),
            Some(Err(err)) => {
                self.stream = None;
                Some(Err(ArrowError::ExternalError(Box::new(err))))
            }
            None => {
                self.stream = None;
                None
            }
        }
    }
}

impl RecordBatchReader for BlockingReader {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
