//! How sqlfeed's operators show their settings in plans.
//!
//! ```text
//!   EXPLAIN / EXPLAIN VERBOSE     ShuffleMergeExec: seed=7, epoch=0, batch_rows=64
//!   EXPLAIN FORMAT TREE           seed=7
//!                                 epoch=0
//!                                 batch_rows=64
//! ```
//!
//! The tree render prints the operator's name itself, one setting a line;
//! the one-line forms lead with the name, as DataFusion's own operators do.

use std::fmt;

use datafusion::physical_plan::DisplayFormatType;

/// One setting of an operator: its name and value.
pub(crate) type Setting<'a> = (&'a str, &'a dyn fmt::Display);

/// Writes `name`'s `settings` in the form `t` asks for (see the module
/// docs).
pub(crate) fn fmt_settings(
    f: &mut fmt::Formatter,
    t: DisplayFormatType,
    name: &str,
    settings: &[Setting],
) -> fmt::Result {
    let separator = match t {
        DisplayFormatType::TreeRender => "\n",
        DisplayFormatType::Default | DisplayFormatType::Verbose => {
            write!(f, "{name}: ")?;
            ", "
        }
    };
    for (i, (key, value)) in settings.iter().enumerate() {
        if i > 0 {
            f.write_str(separator)?;
        }
        write!(f, "{key}={value}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Shown(DisplayFormatType);

    impl fmt::Display for Shown {
        fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
            fmt_settings(f, self.0, "TestExec", &[("seed", &7), ("dir", &"a/b")])
        }
    }

    #[test]
    fn one_line_forms_lead_with_the_name_and_the_tree_puts_a_setting_a_line() {
        for t in [DisplayFormatType::Default, DisplayFormatType::Verbose] {
            assert_eq!(Shown(t).to_string(), "TestExec: seed=7, dir=a/b");
        }
        assert_eq!(
            Shown(DisplayFormatType::TreeRender).to_string(),
            "seed=7\ndir=a/b"
        );
    }
}
