//! Folders that are tables, not loose Parquet files: Delta Lake and Apache
//! Iceberg. A Delta table's own folder is read as the table (`delta.rs`);
//! what is refused here is reading inside one, or an Iceberg table.
//!
//! A Delta table is a folder of Parquet files plus a `_delta_log/` that says
//! which of them make the current version: an overwrite or a delete leaves
//! the old files in place, only removed in the log. Read as loose Parquet
//! files, such a folder silently yields the removed rows too (a table
//! written with 100,000 rows and overwritten with 50,000 counts 150,000).
//! An Iceberg table keeps its data files under `data/` and the snapshot that
//! picks them in `metadata/*.metadata.json`, with the same hazard. So a
//! `FROM '…'` that reads such a folder as files is refused, naming the table
//! and what to do, instead of being read wrong:
//!
//! ```text
//!  FROM 'tables/events/'            a Delta table's folder: read as the table
//!                                   (`delta.rs`; refused without the feature)
//!  FROM 'tables/events/'            an Iceberg table's folder      → refused
//!  FROM 'tables/events/*.parquet'   the folder (or its parent) holds
//!  FROM 'tables/events/day=1/'      _delta_log/ or metadata/*.metadata.json
//!                                                                  → refused
//!  FROM 'tables/*/*.parquet'        a folder glob's recursive listing holds
//!                                   a table that a match lies in → refused
//! ```
//!
//! A single file named explicitly is read as the file it is. A table two
//! `key=value` levels above the folder read is not looked for.

use datafusion::common::plan_datafusion_err;
use datafusion::error::{DataFusionError, Result};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore};

/// The folder that marks a Delta Lake table.
const DELTA_LOG: &str = "_delta_log";
/// The folder of an Iceberg table's metadata files (`*.metadata.json`).
const ICEBERG_METADATA: &str = "metadata";

/// A table format whose folders are not loose Parquet files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TableFormat {
    Delta,
    Iceberg,
}

/// The folder of a table and its format.
pub(super) type TableRoot = (Path, TableFormat);

/// The tables whose marks a recursive listing holds: the folder above each
/// `_delta_log/`, and above each `metadata/*.metadata.json`.
pub(super) fn table_roots(listed: &[ObjectMeta]) -> Vec<TableRoot> {
    let mut roots: Vec<TableRoot> = vec![];
    for file in listed {
        let parts: Vec<&str> = file.location.as_ref().split('/').collect();
        let root = if let Some(at) = parts.iter().position(|p| *p == DELTA_LOG) {
            Some((parts[..at].join("/"), TableFormat::Delta))
        } else if let [.., folder, name] = parts.as_slice()
            && *folder == ICEBERG_METADATA
            && name.ends_with(".metadata.json")
        {
            Some((parts[..parts.len() - 2].join("/"), TableFormat::Iceberg))
        } else {
            None
        };
        if let Some((root, format)) = root {
            let root = Path::from(root);
            if !roots.iter().any(|(known, _)| *known == root) {
                roots.push((root, format));
            }
        }
    }
    roots
}

/// The tables whose folder is `folder` or its parent: a listing's first
/// level does not show them (DataFusion lists one level, plus `key=value`
/// folders), so the folders are asked directly (one or two listings each).
/// A listing that fails (no permission to list the parent of the data)
/// says nothing: the data's own listing, which succeeded, is read as it is.
pub(super) async fn table_roots_at(
    store: &dyn ObjectStore,
    folder: &Path,
) -> Vec<TableRoot> {
    let parts: Vec<_> = folder.parts().collect();
    let parent =
        (!parts.is_empty()).then(|| Path::from_iter(parts[..parts.len() - 1].to_vec()));
    let mut roots = vec![];
    for folder in std::iter::once(folder.clone()).chain(parent) {
        let prefix = (!folder.as_ref().is_empty()).then_some(&folder);
        let Ok(listing) = store.list_with_delimiter(prefix).await else {
            continue;
        };
        let has = |name: &str| {
            listing
                .common_prefixes
                .iter()
                .any(|p| p.filename() == Some(name))
        };
        if has(DELTA_LOG) {
            roots.push((folder.clone(), TableFormat::Delta));
        } else if has(ICEBERG_METADATA) {
            let metadata = folder.clone().join(ICEBERG_METADATA);
            if let Ok(inside) = store.list_with_delimiter(Some(&metadata)).await
                && inside
                    .objects
                    .iter()
                    .any(|o| o.location.as_ref().ends_with(".metadata.json"))
            {
                roots.push((folder.clone(), TableFormat::Iceberg));
            }
        }
    }
    roots
}

/// Refuses `url` when one of `files` it reads lies in one of `roots`.
pub(super) fn refuse_reads_in_tables(
    url: &str,
    roots: &[TableRoot],
    files: &[ObjectMeta],
) -> Result<()> {
    for (root, format) in roots {
        let inside = files.iter().any(|file| {
            root.as_ref().is_empty()
                || file
                    .location
                    .as_ref()
                    .strip_prefix(root.as_ref())
                    .is_some_and(|rest| rest.starts_with('/'))
        });
        if inside {
            return Err(table_error(url, &(root.clone(), *format)));
        }
    }
    Ok(())
}

/// The error for `url`, which reads (in) the table `root`.
pub(super) fn table_error(url: &str, (root, format): &TableRoot) -> DataFusionError {
    match format {
        TableFormat::Delta => delta_error(url, root.as_ref()),
        TableFormat::Iceberg => iceberg_error(url, root.as_ref()),
    }
}

fn delta_error(url: &str, table: &str) -> DataFusionError {
    let how = if cfg!(feature = "delta") {
        format!(
            "Read the table itself: FROM '/{table}/' (with WHERE on its partition \
             columns), or one version of it: FROM '/{table}/' VERSION AS OF <n>"
        )
    } else {
        "This sqlfeed was built without Delta Lake support (the `delta` feature): \
         rebuild with it, or read the current version's files by name (the deltalake \
         package's DeltaTable(path).file_uris())"
            .to_string()
    };
    plan_datafusion_err!(
        "'{url}' reads inside the Delta Lake table at '{table}' (it has a {DELTA_LOG}/ \
         folder) as loose Parquet files, which would include the rows of files that \
         later commits removed. {how}"
    )
}

fn iceberg_error(url: &str, table: &str) -> DataFusionError {
    plan_datafusion_err!(
        "'{url}' reads the Apache Iceberg table at '{table}' (it has \
         {ICEBERG_METADATA}/*.metadata.json) as loose Parquet files, which would include \
         the rows of files that later snapshots removed. sqlfeed does not read Iceberg \
         tables yet (iceberg-datafusion is not on DataFusion 55): read the snapshot's \
         files by name (pyiceberg's table.scan().plan_files()), or write it as plain \
         Parquet"
    )
}

#[cfg(test)]
mod tests {
    use object_store::{ObjectStoreExt, PutPayload};

    use super::*;

    fn meta(location: &str) -> ObjectMeta {
        ObjectMeta {
            location: Path::from(location),
            last_modified: Default::default(),
            size: 1,
            e_tag: None,
            version: None,
        }
    }

    #[test]
    fn delta_and_iceberg_tables_are_found_in_a_listing_and_named() {
        let listed = [
            meta("t/events/_delta_log/00000000000000000000.json"),
            meta("t/events/part-0.parquet"),
            meta("t/ice/metadata/v2.metadata.json"),
            meta("t/ice/data/0.parquet"),
            meta("t/metadata/notes.json"),
            meta("t/plain/a.parquet"),
        ];
        let roots = table_roots(&listed);
        assert_eq!(
            roots,
            [
                (Path::from("t/events"), TableFormat::Delta),
                (Path::from("t/ice"), TableFormat::Iceberg)
            ]
        );
        let err = refuse_reads_in_tables("t/*/*.parquet", &roots, &listed)
            .unwrap_err()
            .to_string();
        assert!(err.contains("Delta Lake table at 't/events'"), "{err}");
        let err = refuse_reads_in_tables(
            "t/ice/data/",
            &roots,
            &[meta("t/ice/data/0.parquet")],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("Iceberg table at 't/ice'"), "{err}");
        // t/events-old is not inside t/events.
        refuse_reads_in_tables("t/x", &roots, &[meta("t/events-old/a.parquet")])
            .expect("a folder beside the table is read");
    }

    #[tokio::test]
    async fn a_folder_or_its_parent_is_asked_for_its_marks() -> Result<()> {
        let store = object_store::memory::InMemory::new();
        for path in [
            "t/events/_delta_log/0.json",
            "t/events/day=1/a.parquet",
            "t/ice/metadata/v1.metadata.json",
            "t/ice/data/a.parquet",
            "t/plain/a.parquet",
        ] {
            store
                .put(&Path::from(path), PutPayload::from_static(b"{}"))
                .await?;
        }
        let delta = [(Path::from("t/events"), TableFormat::Delta)];
        for (folder, expected) in [
            ("t/events", &delta[..]),
            ("t/events/day=1", &delta[..]),
            (
                "t/ice/data",
                &[(Path::from("t/ice"), TableFormat::Iceberg)][..],
            ),
            ("t/plain", &[][..]),
        ] {
            assert_eq!(
                table_roots_at(&store, &Path::from(folder)).await,
                expected,
                "{folder}"
            );
        }
        Ok(())
    }
}
