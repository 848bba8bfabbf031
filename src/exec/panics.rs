//! Panics turned into errors, in one place: a panic in a function, an
//! operator or a dependency must reach the user as an error naming it,
//! never abort a training run.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::exec_datafusion_err;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::RecordBatchStream;
use futures::{FutureExt, Stream};

/// The text of a caught panic payload.
pub(crate) fn panic_message(panic: &Box<dyn Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// The error a panic inside the engine becomes.
pub(crate) fn panic_error(panic: &Box<dyn Any + Send>) -> DataFusionError {
    exec_datafusion_err!(
        "the query engine panicked: {}. This is a bug in sqlfeed or a dependency, \
         usually triggered by unusual input data; please report it",
        panic_message(panic)
    )
}

/// Runs `fut`, turning a panic into an error (see [`panic_error`]).
pub(crate) async fn catch_panic<T>(
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(panic_error(&panic)),
    }
}

/// `stream`, its panics turned into one error item after which it ends.
pub(crate) fn catching_panics(
    stream: SendableRecordBatchStream,
) -> SendableRecordBatchStream {
    Box::pin(PanicCatchingStream { inner: stream })
}

/// A record-batch stream whose panics (from a dependency, e.g. a reader
/// meeting corrupt data) become one error item, after which it ends.
struct PanicCatchingStream {
    inner: SendableRecordBatchStream,
}

impl Stream for PanicCatchingStream {
    type Item = Result<RecordBatch>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        let inner = &mut self.inner;
        match std::panic::catch_unwind(AssertUnwindSafe(|| inner.as_mut().poll_next(cx)))
        {
            Ok(poll) => poll,
            Err(panic) => {
                self.inner = Box::pin(
                    datafusion::physical_plan::stream::EmptyRecordBatchStream::new(
                        self.inner.schema(),
                    ),
                );
                Poll::Ready(Some(Err(panic_error(&panic))))
            }
        }
    }
}

impl RecordBatchStream for PanicCatchingStream {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn panics_in_streams_become_errors() -> Result<()> {
        use futures::StreamExt;
        let schema = Arc::new(datafusion::arrow::datatypes::Schema::empty());
        let panicking =
            futures::stream::poll_fn(|_| -> Poll<Option<Result<RecordBatch>>> {
                panic!("corrupt page")
            });
        let inner: SendableRecordBatchStream = Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                schema, panicking,
            ),
        );
        let mut stream = catching_panics(inner);
        let first = stream.next().await.expect("one item");
        let err = first.expect_err("the panic becomes an error");
        assert!(err.to_string().contains("corrupt page"), "{err}");
        assert!(stream.next().await.is_none());
        Ok(())
    }
}
