//! DLPack capsules: the Python side of the DLPack protocol over the Rust
//! exports of `sqlfeed::device` (which own the shape arrays and keep the
//! batch's slot on loan until their deleter runs).
//!
//! A capsule holds the export's pointer under the name `dltensor` (legacy)
//! or `dltensor_versioned` (DLPack 1.x). A consumer that imports it renames
//! the capsule to `used_dltensor[_versioned]` and calls the deleter itself
//! when its tensor dies; a capsule dropped unconsumed still has its first
//! name, and then its destructor calls the deleter. That name check is the
//! whole protocol: exactly one of the two calls the deleter.
//!
//! This file and `result.rs`'s use of pyo3's safe capsule are the only
//! places the extension touches raw pointers.

use std::ffi::c_void;
use std::ptr::NonNull;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use sqlfeed::device::{Access, ConsumerStream, DLPackManaged, Tensor, hand_over};

/// A capsule exporting `tensor` to a consumer reading on `stream`.
pub(crate) fn capsule<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    stream: ConsumerStream,
    versioned: bool,
) -> PyResult<Bound<'py, PyCapsule>> {
    let error =
        |e: datafusion::error::DataFusionError| PyBufferError::new_err(e.to_string());
    if versioned {
        let managed = tensor
            .to_dlpack_versioned(stream, Access::ReadOnly)
            .map_err(error)?;
        wrap(py, managed)
    } else {
        wrap(py, tensor.to_dlpack_on(stream).map_err(error)?)
    }
}

/// The capsule owning the export `managed` (named as its kind says).
fn wrap<'py, M: DLPackManaged>(
    py: Python<'py>,
    managed: *mut M,
) -> PyResult<Bound<'py, PyCapsule>> {
    let pointer = NonNull::new(managed.cast::<c_void>())
        .ok_or_else(|| PyBufferError::new_err("the DLPack export is null"))?;
    // SAFETY: `managed` is a live export of ours, just made. Once in the
    // capsule it is the capsule's until either the consumer takes it (and
    // renames the capsule) or the capsule's destructor, which checks the
    // name, hands it back to its deleter. If no capsule can be made (out of
    // memory), `hand_over` deletes the export, giving the batch's slot back:
    // `PyCapsule_New` keeps no pointer and calls no destructor when it fails.
    unsafe {
        hand_over(managed, |_| {
            PyCapsule::new_with_pointer_and_destructor(
                py,
                pointer,
                M::CAPSULE_NAME,
                Some(delete_unconsumed::<M>),
            )
        })
    }
}

/// Destructor of a capsule of `M`s: deletes the export if nobody took it
/// (the capsule still has its unconsumed name).
///
/// # Safety
/// Called by Python with the capsule being destroyed.
unsafe extern "C" fn delete_unconsumed<M: DLPackManaged>(capsule: *mut ffi::PyObject) {
    let name = M::CAPSULE_NAME.as_ptr();
    // SAFETY: `capsule` is the live capsule being destroyed; `IsValid` only
    // compares its name and sets no error.
    if unsafe { ffi::PyCapsule_IsValid(capsule, name) } != 1 {
        return;
    }
    // SAFETY: the name matched, so the pointer is our export of an `M`,
    // unconsumed.
    let managed = unsafe { ffi::PyCapsule_GetPointer(capsule, name) }.cast::<M>();
    if managed.is_null() {
        return;
    }
    // SAFETY: an export of ours whose deleter has not run (nobody consumed
    // it); it runs exactly once, here.
    if let Some(deleter) = unsafe { (*managed).deleter() } {
        // SAFETY: as above.
        unsafe { deleter(managed) };
    }
}
