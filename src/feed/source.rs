//! Where a feed's epochs run, chosen once when the feed is built.
//!
//! ```text
//!   session.scale_out()?   cache + SHUFFLE by content + executor_cache_dir?
//!   ───────────────────    ──────────────────────────────────────────────
//!   none                   —        ──► Embedded
//!   a cluster              no       ──► Cluster(scale_out)
//!   a cluster              yes      ──► ExecutorCache { scale_out, dir }
//! ```
//!
//! The executor cache keeps rows by their content hash and later epochs
//! shuffle them by content: a feed shuffled by position caches its first
//! epoch's rows here instead (the local epoch cache over `Cluster`), in
//! that epoch's order, which later epochs read by position.
//!
//! The local epoch cache is not a source of its own: it is a layer over
//! `Embedded` or `Cluster`. Its first epoch fills the entry from the
//! source's rows (a tee in this process); later epochs read the entry
//! here, on the embedded engine, whatever the source, because the entry is
//! on this machine. So do the origins of a batch (`explain_batch`) and an
//! epoch continued over appended data (it joins against rows held here):
//! their order is the same on either engine.
//!
//! The cluster is reached only through the session's
//! [`ScaleOut`](crate::session::ScaleOut): this module, like the rest of
//! the feed, names nothing of `crate::cluster`.

use std::sync::Arc;

use crate::Session;
use crate::session::ScaleOut;

/// Where a feed's epochs run; see the module docs.
#[derive(Debug, Clone)]
pub(super) enum EpochSource {
    /// Every epoch is planned and run by this process's engine.
    Embedded,
    /// Each epoch is one job on the session's cluster, which all ranks of
    /// the run read (see `crate::cluster::SharedJobExec`).
    Cluster(Arc<dyn ScaleOut>),
    /// A cached, shuffled cluster feed whose entry the executors keep in the
    /// shared folder `dir` (`crate::cache::shared`): the first epoch's job
    /// writes it where it computes the rows, later epochs' jobs scan it.
    ExecutorCache {
        /// The session's cluster.
        scale_out: Arc<dyn ScaleOut>,
        /// `sqlfeed.executor_cache_dir`.
        dir: String,
    },
}

impl EpochSource {
    /// The source of a feed over `session`, cached (`cache`) and shuffled
    /// by content (`by_content`: `SHUFFLE` or `SHUFFLE WINDOW`) or not.
    pub(super) fn choose(session: &Session, cache: bool, by_content: bool) -> Self {
        let Some(scale_out) = session.scale_out() else {
            return Self::Embedded;
        };
        let scale_out = Arc::clone(scale_out);
        match executor_cache_dir(session) {
            Some(dir) if cache && by_content => Self::ExecutorCache { scale_out, dir },
            _ => Self::Cluster(scale_out),
        }
    }

    /// The session's cluster, unless the epochs run here.
    pub(super) fn scale_out(&self) -> Option<&Arc<dyn ScaleOut>> {
        match self {
            Self::Embedded => None,
            Self::Cluster(scale_out) | Self::ExecutorCache { scale_out, .. } => {
                Some(scale_out)
            }
        }
    }
}

/// The shared folder of executor-kept cache entries, if the session has
/// one (`sqlfeed.executor_cache_dir`).
fn executor_cache_dir(session: &Session) -> Option<String> {
    let state = session.context().state_ref();
    let state = state.read();
    let dir =
        &crate::config::SqlfeedOptions::of(state.config().options()).executor_cache_dir;
    Some(dir.clone()).filter(|dir| !dir.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_embedded_session_runs_its_epochs_here() -> datafusion::error::Result<()> {
        let session = Session::builder().executor_cache_dir("/shared").build()?;
        for (cache, shuffled) in [(false, false), (true, true)] {
            let source = EpochSource::choose(&session, cache, shuffled);
            assert!(matches!(source, EpochSource::Embedded), "{source:?}");
            assert!(source.scale_out().is_none());
        }
        Ok(())
    }
}
