//! Panics turned into errors: a panic in a function or an operator must
//! reach the user as an error naming it, never abort a training run.

use std::any::Any;

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
