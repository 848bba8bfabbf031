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

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use sqlfeed::device::{
    Access, ConsumerStream, DLManagedTensor, DLManagedTensorVersioned, DLPackManaged,
    Tensor,
};

/// A capsule exporting `tensor` to a consumer reading on `stream`.
pub(crate) fn capsule<'py>(
    py: Python<'py>,
    tensor: &Tensor,
    stream: ConsumerStream,
    versioned: bool,
) -> PyResult<Bound<'py, PyCapsule>> {
    let error =
        |e: datafusion::error::DataFusionError| PyBufferError::new_err(e.to_string());
    let (pointer, name, destructor): (
        *mut c_void,
        &'static CStr,
        ffi::PyCapsule_Destructor,
    ) = if versioned {
        let managed = tensor
            .to_dlpack_versioned(stream, Access::ReadOnly)
            .map_err(error)?;
        (
            managed.cast(),
            DLManagedTensorVersioned::CAPSULE_NAME,
            delete_unconsumed::<DLManagedTensorVersioned>,
        )
    } else {
        let managed = tensor.to_dlpack_on(stream).map_err(error)?;
        (
            managed.cast(),
            DLManagedTensor::CAPSULE_NAME,
            delete_unconsumed::<DLManagedTensor>,
        )
    };
    let pointer = NonNull::new(pointer)
        .ok_or_else(|| PyBufferError::new_err("the DLPack export is null"))?;
    // SAFETY: `pointer` is a live export of ours, owned by the capsule until
    // either the consumer takes it (and renames the capsule) or the capsule's
    // destructor, which checks the name, hands it back to its deleter.
    unsafe {
        PyCapsule::new_with_pointer_and_destructor(py, pointer, name, Some(destructor))
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
