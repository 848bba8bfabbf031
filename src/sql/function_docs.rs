//! The reference of sqlfeed's SQL functions, rendered from the one source
//! DataFusion reads too: each function's [`Documentation`] (what
//! `information_schema.routines` and `SHOW FUNCTIONS` show).
//!
//! `docs/functions.md` is this module's [`functions_markdown`]; a test keeps
//! the file in sync and runs every example in it
//! (`tests/integration/function_docs.rs`; `SQLFEED_BLESS=1` rewrites the
//! file). `\functions <name>` in the shell prints one function's section.

use std::fmt::Write;

use datafusion::logical_expr::{DocSection, Documentation};

/// Every sqlfeed function (the enabled UDF families, then sqlfeed's own),
/// in listing order, with its documentation.
pub fn documented_functions() -> Vec<(&'static str, Documentation)> {
    sqlfeed_udfs::functions()
        .into_iter()
        .chain(super::function_infos())
        .map(|info| (info.name, info.documentation()))
        .collect()
}

/// The Markdown section of one function.
pub fn function_markdown(name: &str, doc: &Documentation) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = writeln!(out, "### `{name}`\n\n{}\n", doc.description);
    let _ = writeln!(out, "```sql\n{}\n```\n", doc.syntax_example);
    if let Some(arguments) = &doc.arguments {
        let _ = writeln!(out, "#### Arguments\n");
        for (argument, description) in arguments {
            let _ = writeln!(out, "- **{argument}**: {description}");
        }
        out.push('\n');
    }
    if let Some(example) = &doc.sql_example {
        let _ = writeln!(out, "#### Example\n\n{example}\n");
    }
    out
}

/// `docs/functions.md`: every function by section, with a table of
/// contents.
pub fn functions_markdown() -> String {
    let functions = documented_functions();
    let mut out = String::from(
        "# sqlfeed's SQL functions\n\n\
         <!-- Generated from each function's DataFusion `Documentation` \
         (src/sql/function_docs.rs); do not edit. A test runs every example and \
         keeps this file in sync: `SQLFEED_BLESS=1 cargo test --test integration \
         function_docs` rewrites it. -->\n\n\
         Every function below is registered on every sqlfeed session (embedded or \
         cluster) next to DataFusion's own. In the shell, `\\functions` lists them \
         and `\\functions <name>` shows one as here; `SHOW FUNCTIONS LIKE '<name>'` \
         and `information_schema.routines` read the same documentation.\n\n",
    );
    // Sections in order of first appearance, each with its functions.
    let mut sections: Vec<(&DocSection, Vec<(&str, &Documentation)>)> = vec![];
    for (name, doc) in &functions {
        let section = &doc.doc_section;
        match sections.iter_mut().find(|(s, _)| s.label == section.label) {
            Some((_, members)) => members.push((name, doc)),
            None => sections.push((section, vec![(name, doc)])),
        }
    }
    for (section, members) in &sections {
        let _ = writeln!(out, "- {}", section.label);
        for (name, _) in members {
            let _ = writeln!(out, "  - [`{name}`](#{name})");
        }
    }
    out.push('\n');
    for (section, members) in &sections {
        let _ = writeln!(out, "## {}\n", section.label);
        if let Some(description) = section.description {
            let _ = writeln!(out, "{description}\n");
        }
        for (name, doc) in members {
            out.push_str(&function_markdown(name, doc));
        }
    }
    // One trailing newline.
    while out.ends_with("\n\n") {
        out.pop();
    }
    out
}

/// The query of an example section (`> …` lines) and the output printed
/// under it.
pub fn example_parts(example: &str) -> (String, String) {
    let body = example
        .trim()
        .trim_start_matches("```sql")
        .trim_end_matches("```")
        .trim_matches('\n');
    let (mut query, mut output) = (vec![], vec![]);
    for line in body.lines() {
        match line.strip_prefix("> ") {
            Some(sql) if output.is_empty() => query.push(sql),
            _ => output.push(line),
        }
    }
    (query.join("\n"), output.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_has_arguments_and_an_example() {
        let functions = documented_functions();
        assert!(functions.len() >= 20, "{}", functions.len());
        for (name, doc) in &functions {
            assert!(doc.syntax_example.starts_with(name), "{name}");
            assert!(
                doc.arguments.as_ref().is_some_and(|a| !a.is_empty()),
                "{name}"
            );
            let (query, _) = example_parts(doc.sql_example.as_deref().unwrap_or(""));
            assert!(query.contains(name), "{name}: {query}");
        }
    }
}
