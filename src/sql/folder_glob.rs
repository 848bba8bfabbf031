//! Globs with a wildcard in a folder component: `'data/*/*.parquet'`,
//! `'s3://bucket/date=2024-*/*.parquet'`, `'data/**/part-*.parquet'`.
//!
//! # Background
//! DataFusion's `ListingTableUrl` keeps the part of a glob before its first
//! wildcard as the listing prefix and, with `listing_table_ignore_subdirectory`
//! on (the default), matches the pattern against the *first* path segment
//! after it only, with `key=value` segments removed first. So a wildcard in
//! a folder matches nothing, and neither does a pattern over a hive folder.
//!
//! # How
//! ```text
//!   'data/*/month=1*/x-*.parquet'
//!    base  └──────── pattern ──────┘   list everything under base once,
//!                                       match each path (`*` stops at `/`,
//!                                       `**` crosses folders)
//!   matched: data/a/month=1/x-0.parquet, data/b/month=10/x-3.parquet
//!   roots:   data/a/, data/b/           the folders before the first
//!                                       key=value folder, each a table path
//!                                       with the file component as its glob
//!   filter:  regexp_like(month, '^1.*$') the hive components of the pattern,
//!                                       on the partition columns (pruned
//!                                       before any file is opened)
//! ```
//! The table is DataFusion's `ListingTable` over the roots (so partition
//! columns, statistics and pushdown are DataFusion's), under that filter. A
//! plain folder after a `key=value` folder in the pattern
//! (`year=*/raw/*.parquet`) cannot be expressed this way and is an error.

use std::collections::BTreeSet;

use datafusion::common::Column;
use datafusion::common::plan_datafusion_err;
use datafusion::common::plan_err;
use datafusion::datasource::listing::ListingTableUrl;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, lit};
use futures::TryStreamExt;
use glob::{MatchOptions, Pattern};
use object_store::{ObjectMeta, ObjectStore};

use super::table_formats::{TableRoot, table_roots};

/// Characters that make a path component a pattern.
const GLOB_CHARS: [char; 3] = ['*', '?', '['];

/// A path or URL whose pattern has a wildcard before its last component.
#[derive(Debug)]
pub(super) struct FolderGlob {
    /// Everything before the first component with a wildcard.
    base: ListingTableUrl,
    /// The rest, one entry per `/`-separated component.
    components: Vec<String>,
    /// The rest, as one pattern.
    pattern: Pattern,
}

impl FolderGlob {
    /// `Some` when `url`'s pattern has a wildcard in a folder component.
    pub(super) fn parse(url: &str) -> Result<Option<Self>> {
        let Some(glob_start) = url.find(GLOB_CHARS) else {
            return Ok(None);
        };
        let invalid = |e: &dyn std::fmt::Display| {
            plan_datafusion_err!("'{url}' is not a valid path or URL: {e}")
        };
        let split = url[..glob_start].rfind('/').map(|i| i + 1).unwrap_or(0);
        let (base, rest) = url.split_at(split);
        let components: Vec<String> = rest.split('/').map(str::to_string).collect();
        let folders = &components[..components.len().saturating_sub(1)];
        if !folders.iter().any(|c| c.contains(GLOB_CHARS)) {
            return Ok(None);
        }
        if let Some((_, after_scheme)) = base.split_once("://")
            && !after_scheme.contains('/')
        {
            return Err(invalid(&"a glob cannot be part of the bucket or host name"));
        }
        let base = if base.is_empty() { "./" } else { base };
        let base = ListingTableUrl::parse(base).map_err(|e| invalid(&e))?;
        let pattern = Pattern::new(rest).map_err(|e| invalid(&e))?;
        for component in &components {
            Pattern::new(component).map_err(|e| invalid(&e))?;
        }
        let first_hive = components.iter().position(|c| c.contains('='));
        if let Some(first_hive) = first_hive
            && let Some(plain) = components[first_hive..components.len() - 1]
                .iter()
                .find(|c| !c.contains('='))
        {
            return plan_err!(
                "'{url}': the folder '{plain}' after a key=value folder cannot be matched \
                 (partition folders must come last, before the file name); put the \
                 wildcard in a key=value folder or list the folders"
            );
        }
        Ok(Some(Self {
            base,
            components,
            pattern,
        }))
    }

    /// The folder everything matched lies under.
    pub(super) fn base(&self) -> &ListingTableUrl {
        &self.base
    }

    /// Every object under the base whose path below it matches the pattern,
    /// sorted by path.
    pub(super) async fn expand(
        &self,
        store: &dyn ObjectStore,
    ) -> Result<(Vec<ObjectMeta>, Vec<TableRoot>)> {
        let prefix = self.base.prefix();
        let options = MatchOptions {
            require_literal_separator: true,
            ..MatchOptions::default()
        };
        let listed: Vec<ObjectMeta> = store
            .list(Some(prefix))
            .try_collect()
            .await
            .map_err(|e| DataFusionError::ObjectStore(Box::new(e)))?;
        // Delta and Iceberg tables under the base, whose files are not to be
        // read as loose Parquet (see `table_formats.rs`).
        let roots = table_roots(&listed);
        let mut matched: Vec<ObjectMeta> = listed
            .into_iter()
            .filter(|meta| {
                relative(prefix.as_ref(), meta.location.as_ref())
                    .is_some_and(|rest| self.pattern.matches_with(rest, options))
            })
            .collect();
        matched.sort_by(|a, b| a.location.cmp(&b.location));
        Ok((matched, roots))
    }

    /// One table path per folder that holds matches, up to its first
    /// `key=value` folder, with the file-name pattern as its glob.
    pub(super) fn roots(&self, files: &[ObjectMeta]) -> Result<Vec<ListingTableUrl>> {
        let prefix = self.base.prefix().as_ref().to_string();
        let file_pattern = self.components.last().cloned().unwrap_or_default();
        let mut folders = BTreeSet::new();
        for file in files {
            let Some(rest) = relative(&prefix, file.location.as_ref()) else {
                continue;
            };
            let parts: Vec<&str> = rest.split('/').collect();
            let leading: Vec<&str> = parts[..parts.len() - 1]
                .iter()
                .take_while(|p| !p.contains('='))
                .copied()
                .collect();
            folders.insert(leading.join("/"));
        }
        folders
            .into_iter()
            .map(|folder| {
                let mut url = self.base.get_url().clone();
                if !folder.is_empty() {
                    url = url
                        .join(&format!("{folder}/"))
                        .map_err(|e| plan_datafusion_err!("folder '{folder}': {e}"))?;
                }
                let glob = Pattern::new(&file_pattern)
                    .map_err(|e| plan_datafusion_err!("{e}"))?;
                ListingTableUrl::try_new(url, Some(glob))
            })
            .collect()
    }

    /// The pattern's `key=value` folders as a filter on the partition
    /// columns (`*` alone matches every value and adds nothing).
    pub(super) fn partition_filter(&self) -> Option<Expr> {
        let folders = &self.components[..self.components.len().saturating_sub(1)];
        folders
            .iter()
            .filter_map(|c| c.split_once('='))
            .filter(|(_, value)| *value != "*")
            .map(|(key, value)| {
                datafusion::functions::expr_fn::regexp_like(
                    Expr::Column(Column::new_unqualified(key)),
                    lit(glob_to_regex(value)),
                    None,
                )
            })
            .reduce(Expr::and)
    }
}

/// `path` below `prefix` (both without a leading `/`), if it is below it.
fn relative<'a>(prefix: &str, path: &'a str) -> Option<&'a str> {
    if prefix.is_empty() {
        return Some(path);
    }
    path.strip_prefix(prefix)?.strip_prefix('/')
}

/// An anchored regular expression that matches what the glob `pattern`
/// matches within one path component.
fn glob_to_regex(pattern: &str) -> String {
    let mut regex = String::from("^");
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => regex.push_str("[^/]*"),
            '?' => regex.push_str("[^/]"),
            '[' => {
                regex.push('[');
                if chars.peek() == Some(&'!') {
                    chars.next();
                    regex.push('^');
                }
                for c in chars.by_ref() {
                    if c == ']' {
                        break;
                    }
                    if c == '\\' || c == '^' {
                        regex.push('\\');
                    }
                    regex.push(c);
                }
                regex.push(']');
            }
            c if "\\.+()|{}^$".contains(c) => {
                regex.push('\\');
                regex.push(c);
            }
            c => regex.push(c),
        }
    }
    regex.push('$');
    regex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_folder_wildcards_take_this_path() -> Result<()> {
        assert!(FolderGlob::parse("data/*.parquet")?.is_none());
        assert!(FolderGlob::parse("data/x.parquet")?.is_none());
        assert!(FolderGlob::parse("s3://b/k/*.parquet")?.is_none());
        let glob =
            FolderGlob::parse("s3://b/k/*/month=1*/x-*.parquet")?.expect("folder glob");
        assert_eq!(glob.base().as_str(), "s3://b/k/");
        assert_eq!(glob.components, ["*", "month=1*", "x-*.parquet"]);
        let err =
            FolderGlob::parse("data/year=*/raw/*.parquet").expect_err("plain after hive");
        assert!(
            err.to_string().contains("'raw' after a key=value folder"),
            "{err}"
        );
        let err = FolderGlob::parse("s3://bu*/x/*.parquet").expect_err("bucket glob");
        assert!(err.to_string().contains("bucket or host"), "{err}");
        Ok(())
    }

    #[test]
    fn globs_become_anchored_component_regexes() {
        assert_eq!(glob_to_regex("2024-*"), "^2024-[^/]*$");
        assert_eq!(glob_to_regex("a?c"), "^a[^/]c$");
        assert_eq!(glob_to_regex("[!ab]x"), "^[^ab]x$");
        assert_eq!(glob_to_regex("v1.0+(x)"), "^v1\\.0\\+\\(x\\)$");
    }

    #[test]
    fn hive_folders_become_partition_filters() -> Result<()> {
        let glob =
            FolderGlob::parse("d/*/month=1*/day=*/*.parquet")?.expect("folder glob");
        let filter = glob.partition_filter().expect("a filter").to_string();
        assert!(
            filter.contains("regexp_like(month, Utf8(\"^1[^/]*$\"))"),
            "{filter}"
        );
        assert!(!filter.contains("day"), "day=* filters nothing: {filter}");
        let plain = FolderGlob::parse("d/*/*.parquet")?.expect("folder glob");
        assert!(plain.partition_filter().is_none());
        Ok(())
    }

    #[test]
    fn roots_stop_before_the_first_partition_folder() -> Result<()> {
        let glob =
            FolderGlob::parse("s3://b/k/*/month=*/*.parquet")?.expect("folder glob");
        let meta = |path: &str| ObjectMeta {
            location: object_store::path::Path::from(path),
            last_modified: Default::default(),
            size: 1,
            e_tag: None,
            version: None,
        };
        let roots = glob.roots(&[
            meta("k/a/month=1/x.parquet"),
            meta("k/a/month=2/y.parquet"),
            meta("k/b/month=1/z.parquet"),
        ])?;
        let roots: Vec<&str> = roots.iter().map(|r| r.as_str()).collect();
        assert_eq!(roots, ["s3://b/k/a/", "s3://b/k/b/"]);
        Ok(())
    }
}
