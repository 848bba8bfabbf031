//! Streams read one after another, the next ones started ahead: the
//! windows of a windowed shuffle on one machine, and a cluster feed's jobs
//! of one window each.
//!
//! ```text
//!  streams: s0, s1, s2, …  (made lazily, in order)
//!
//!  driver task: keeps 1 + ahead streams started, each pumped by its own
//!  task into a channel of one batch; passes the front stream's batches on
//!  ─► output channel (1 batch) ─► the returned stream
//! ```
//!
//! A started stream runs until its first batch is ready (a window's
//! barrier: scan, key, sort; a job: submitted, completed, first fetch) and
//! then waits for its turn: the consumer of stream k never waits for k+1's
//! start-up. An error ends the sequence (no later stream is made); dropping
//! the returned stream aborts every task.

use std::collections::VecDeque;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::metrics::Time;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::StreamExt;
use tokio::sync::mpsc;

/// The streams `streams` makes, read in order as one stream of `schema`,
/// with `ahead` streams after the current one started; `wait`, if given,
/// times how long the output waited for each stream's first batch.
pub(crate) fn in_sequence(
    schema: SchemaRef,
    streams: impl Iterator<Item = Result<SendableRecordBatchStream>> + Send + 'static,
    ahead: usize,
    wait: Option<Time>,
) -> SendableRecordBatchStream {
    let (out, rx) = mpsc::channel::<Result<RecordBatch>>(1);
    let driver = SpawnedTask::spawn(async move {
        if let Err(e) = drive(streams, ahead, wait, &out).await {
            // The reader may be gone (dropped stream): nothing to tell.
            let _ = out.send(Err(e)).await;
        }
    });
    let stream =
        futures::stream::unfold((rx, Some(driver)), |(mut rx, driver)| async move {
            match rx.recv().await {
                Some(batch) => Some((batch, (rx, driver))),
                // The driver ended: a panic in it is an error here.
                None => match driver {
                    Some(task) => task.join().await.err().map(|e| {
                        (Err(DataFusionError::External(Box::new(e))), (rx, None))
                    }),
                    None => None,
                },
            }
        });
    Box::pin(RecordBatchStreamAdapter::new(schema, stream))
}

/// A started stream: its pump and the channel it fills.
struct Started {
    task: SpawnedTask<()>,
    batches: mpsc::Receiver<Result<RecordBatch>>,
}

fn start(mut stream: SendableRecordBatchStream) -> Started {
    let (tx, batches) = mpsc::channel(1);
    let task = SpawnedTask::spawn(async move {
        while let Some(batch) = stream.next().await {
            let failed = batch.is_err();
            if tx.send(batch).await.is_err() || failed {
                return;
            }
        }
    });
    Started { task, batches }
}

async fn drive(
    mut streams: impl Iterator<Item = Result<SendableRecordBatchStream>>,
    ahead: usize,
    wait: Option<Time>,
    out: &mpsc::Sender<Result<RecordBatch>>,
) -> Result<()> {
    // A stream that could not be made fails in its turn, after the ones
    // before it were read; none is made after it.
    let mut started: VecDeque<Result<Started>> = VecDeque::new();
    let mut failed_to_make = false;
    loop {
        while started.len() <= ahead && !failed_to_make {
            let Some(stream) = streams.next() else { break };
            failed_to_make = stream.is_err();
            started.push_back(stream.map(start));
        }
        let Some(current) = started.pop_front() else {
            return Ok(());
        };
        let mut current = current?;
        let mut first = true;
        loop {
            let waiting = wait.as_ref().filter(|_| first).map(Time::timer);
            let batch = current.batches.recv().await;
            drop(waiting);
            first = false;
            let Some(batch) = batch else { break };
            let failed = batch.is_err();
            // The reader gone, or the stream failed (its error passed on):
            // nothing later is read; the started tasks abort as they drop.
            if out.send(batch).await.is_err() || failed {
                return Ok(());
            }
        }
        current
            .task
            .join()
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::exec_err;
    use futures::TryStreamExt;

    use super::*;
    use crate::test_util::first_int64s;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]))
    }

    /// A stream of batches `[k·10, k·10 + 1]` and `[k·10 + 2]`, counting in
    /// `made` when it is made.
    fn numbered(k: i64, made: &Arc<AtomicUsize>) -> Result<SendableRecordBatchStream> {
        made.fetch_add(1, Ordering::SeqCst);
        let batches = [vec![k * 10, k * 10 + 1], vec![k * 10 + 2]].map(|values| {
            RecordBatch::try_new(schema(), vec![Arc::new(Int64Array::from(values))])
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema(),
            futures::stream::iter(batches.into_iter().map(|b| b.map_err(Into::into))),
        )))
    }

    #[tokio::test]
    async fn streams_are_read_in_order_with_a_bounded_number_started() -> Result<()> {
        let made = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&made);
        let streams = (0..5).map(move |k| numbered(k, &counter));
        let mut out = in_sequence(schema(), streams, 1, None);
        let first = out.next().await.expect("a batch")?;
        assert_eq!(first_int64s(&[first]), vec![0, 1]);
        // The first stream and one ahead, no more.
        assert!(made.load(Ordering::SeqCst) <= 2);
        let rest: Vec<RecordBatch> = out.try_collect().await?;
        assert_eq!(
            first_int64s(&rest),
            vec![2, 10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42]
        );
        assert_eq!(made.load(Ordering::SeqCst), 5);
        Ok(())
    }

    #[tokio::test]
    async fn an_error_ends_the_sequence() -> Result<()> {
        let made = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&made);
        let streams = (0..5).map(move |k| {
            if k == 2 {
                return exec_err!("stream {k} cannot be made");
            }
            numbered(k, &counter)
        });
        let results: Vec<Result<RecordBatch>> =
            in_sequence(schema(), streams, 1, None).collect().await;
        let ok: Vec<RecordBatch> = results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .cloned()
            .collect();
        assert_eq!(first_int64s(&ok), vec![0, 1, 2, 10, 11, 12]);
        let errors: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().map(ToString::to_string))
            .collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].contains("stream 2 cannot be made"), "{errors:?}");
        assert_eq!(made.load(Ordering::SeqCst), 2);
        Ok(())
    }
}
