//! DLPack export: hands a tensor to another framework (`torch.from_dlpack`,
//! JAX, CuPy) without a copy.
//!
//! The structs mirror `dlpack.h`: the legacy `DLManagedTensor` (v0.8, what
//! every `from_dlpack` accepts) and the versioned `DLManagedTensorVersioned`
//! (v1.x, which adds flags: our versioned exports are **read-only** unless
//! asked otherwise, because the memory belongs to the feed's slot ring). The
//! export owns its shape and strides arrays and a keep-alive handle; the
//! consumer calls `deleter` exactly once when done, which frees both and
//! releases the slot back to the feed.

use std::any::Any;
use std::ffi::c_void;

use super::Device;
use super::dtype::DType;

/// `DLDeviceType::kDLCPU`.
pub const DL_CPU: i32 = 1;
/// `DLDeviceType::kDLCUDA`.
pub const DL_CUDA: i32 = 2;

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// `kDLCPU` = 1, `kDLCUDA` = 2.
    pub device_type: i32,
    /// The device ordinal (0 for the CPU).
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// `kDLInt` = 0, `kDLUInt` = 1, `kDLFloat` = 2, `kDLBfloat` = 4, `kDLBool` = 6.
    pub code: u8,
    /// Bits per element.
    pub bits: u8,
    /// Vector lanes (always 1 here).
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// Host or device address of the data.
    pub data: *mut c_void,
    /// Where `data` lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` sizes.
    pub shape: *mut i64,
    /// `ndim` strides in elements.
    pub strides: *mut i64,
    /// Offset of the first element from `data`, in bytes.
    pub byte_offset: u64,
}

/// `DLManagedTensor`: a tensor plus the means to release it.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// Our export context (shape, strides, keep-alive).
    pub manager_ctx: *mut c_void,
    /// Frees the export; call exactly once.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`: the ABI version of a versioned export.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version (1).
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// The DLPack version our versioned exports implement.
pub const DLPACK_VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the memory.
pub const DLPACK_FLAG_READ_ONLY: u64 = 1 << 0;

/// `DLManagedTensorVersioned` (DLPack ≥ 1.0): a tensor, the means to
/// release it, and flags such as read-only.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The ABI version of this struct.
    pub version: DLPackVersion,
    /// Our export context (shape, strides, keep-alive).
    pub manager_ctx: *mut c_void,
    /// Frees the export; call exactly once.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_*` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// Whether a consumer of an export may write into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// The default: the memory is the feed's and is reused after release.
    #[default]
    ReadOnly,
    /// Asked for explicitly: writes are visible to every holder of the
    /// same batch, and are overwritten once the slot is reused.
    Writable,
}

/// What an export owns until its deleter runs.
struct ExportContext {
    /// Backing store of `dl_tensor.shape`.
    shape: Vec<i64>,
    /// Backing store of `dl_tensor.strides`.
    strides: Vec<i64>,
    /// Keeps the tensor's memory alive (the slot lease).
    _keep_alive: Box<dyn Any + Send>,
}

/// The DLPack type of `dtype`.
pub(crate) fn dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::Float32 => (2, 32),
        DType::Float64 => (2, 64),
        DType::Float16 => (2, 16),
        DType::BFloat16 => (4, 16),
        DType::Int64 => (0, 64),
        DType::Int32 => (0, 32),
        DType::UInt8 => (1, 8),
        DType::Bool => (6, 8),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// What an export describes: a tensor's memory, where it lives, its element
/// type and layout, and what keeps the memory alive until the consumer runs
/// the export's deleter.
pub(crate) struct ExportedTensor<'a> {
    pub(crate) data: *mut c_void,
    pub(crate) device: Device,
    pub(crate) dtype: DType,
    pub(crate) shape: &'a [usize],
    pub(crate) strides: &'a [usize],
    pub(crate) keep_alive: Box<dyn Any + Send>,
}

/// The tensor description and the context that owns its arrays.
fn describe(tensor: ExportedTensor) -> (Box<ExportContext>, DLTensor) {
    let ExportedTensor {
        data,
        device,
        dtype,
        shape,
        strides,
        keep_alive,
    } = tensor;
    let mut context = Box::new(ExportContext {
        shape: shape.iter().map(|&d| d as i64).collect(),
        strides: strides.iter().map(|&s| s as i64).collect(),
        _keep_alive: keep_alive,
    });
    let device = match device {
        Device::Cpu => DLDevice {
            device_type: DL_CPU,
            device_id: 0,
        },
        Device::Cuda(ordinal) => DLDevice {
            device_type: DL_CUDA,
            device_id: ordinal as i32,
        },
    };
    let dl_tensor = DLTensor {
        data,
        device,
        ndim: shape.len() as i32,
        dtype: dl_dtype(dtype),
        shape: context.shape.as_mut_ptr(),
        strides: context.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    (context, dl_tensor)
}

/// Builds a heap-allocated `DLManagedTensor` describing `tensor`.
pub(crate) fn export(tensor: ExportedTensor) -> *mut DLManagedTensor {
    let (context, dl_tensor) = describe(tensor);
    Box::into_raw(Box::new(DLManagedTensor {
        dl_tensor,
        manager_ctx: Box::into_raw(context).cast(),
        deleter: Some(delete_export::<DLManagedTensor>),
    }))
}

/// Builds a heap-allocated `DLManagedTensorVersioned` describing `tensor`,
/// read-only unless `access` is [`Access::Writable`].
pub(crate) fn export_versioned(
    tensor: ExportedTensor,
    access: Access,
) -> *mut DLManagedTensorVersioned {
    let (context, dl_tensor) = describe(tensor);
    Box::into_raw(Box::new(DLManagedTensorVersioned {
        version: DLPACK_VERSION,
        manager_ctx: Box::into_raw(context).cast(),
        deleter: Some(delete_export::<DLManagedTensorVersioned>),
        flags: match access {
            Access::ReadOnly => DLPACK_FLAG_READ_ONLY,
            Access::Writable => 0,
        },
        dl_tensor,
    }))
}

/// Hands the export `managed` to `give` (which wraps it into whatever its
/// consumer takes, a Python capsule); if `give` fails, nobody owns the
/// export, so it is deleted here and its batch's slot goes back to the feed.
///
/// # Safety
/// `managed` must be a live export whose deleter has not run, and `give`
/// must not run the deleter nor keep the pointer when it fails.
pub unsafe fn hand_over<M: DLPackManaged, T, E>(
    managed: *mut M,
    give: impl FnOnce(*mut M) -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    give(managed).inspect_err(|_| {
        // SAFETY: live and not deleted (the caller's contract); `give`
        // failed, so this is the only call of its deleter.
        if let Some(deleter) = unsafe { (*managed).deleter() } {
            // SAFETY: as above.
            unsafe { deleter(managed) };
        }
    })
}

/// What the two DLPack structs share: a way for a consumer (or a capsule
/// that nobody consumed) to hand an export back through its own deleter.
pub trait DLPackManaged: Sized {
    /// The Python capsule name of an unconsumed export of this kind
    /// (`dltensor` or `dltensor_versioned`, as the DLPack protocol says).
    const CAPSULE_NAME: &'static std::ffi::CStr;

    /// The export's deleter.
    fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)>;

    /// The export's context.
    fn manager_ctx(&self) -> *mut c_void;
}

/// Both managed structs hold `deleter` and `manager_ctx` under those names.
macro_rules! dlpack_managed {
    ($managed:ty, $capsule_name:literal) => {
        impl DLPackManaged for $managed {
            const CAPSULE_NAME: &'static std::ffi::CStr = $capsule_name;

            fn deleter(&self) -> Option<unsafe extern "C" fn(*mut Self)> {
                self.deleter
            }

            fn manager_ctx(&self) -> *mut c_void {
                self.manager_ctx
            }
        }
    };
}

dlpack_managed!(DLManagedTensor, c"dltensor");
dlpack_managed!(DLManagedTensorVersioned, c"dltensor_versioned");

/// The `deleter` of our exports, legacy and versioned.
///
/// # Safety
/// `managed` must come from [`export`] or [`export_versioned`] (whichever
/// made an `M`) and be passed here exactly once.
unsafe extern "C" fn delete_export<M: DLPackManaged>(managed: *mut M) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` was created by `Box::into_raw` in `export` or
    // `export_versioned` and the caller passes it once (the DLPack
    // contract), so we own it again.
    let managed = unsafe { Box::from_raw(managed) };
    let context = managed.manager_ctx();
    if !context.is_null() {
        // SAFETY: `manager_ctx` was created by `Box::into_raw` of an
        // `ExportContext` in `describe` and is only freed here.
        drop(unsafe { Box::from_raw(context.cast::<ExportContext>()) });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    struct SetOnDrop(Arc<AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    /// Four bytes on the CPU at `data`, which set `released` when the
    /// export is deleted.
    fn bytes(data: *mut c_void, released: &Arc<AtomicBool>) -> ExportedTensor<'static> {
        ExportedTensor {
            data,
            device: Device::Cpu,
            dtype: DType::UInt8,
            shape: &[4],
            strides: &[1],
            keep_alive: Box::new(SetOnDrop(Arc::clone(released))),
        }
    }

    #[test]
    fn export_describes_the_tensor_and_the_deleter_releases_it() {
        let released = Arc::new(AtomicBool::new(false));
        let mut data = [0f32; 6];
        let managed = export(ExportedTensor {
            data: data.as_mut_ptr().cast(),
            device: Device::Cuda(3),
            dtype: DType::BFloat16,
            shape: &[2, 3],
            strides: &[3, 1],
            keep_alive: Box::new(SetOnDrop(Arc::clone(&released))),
        });
        // SAFETY: `managed` is a live export we have not deleted yet.
        let tensor = unsafe { &(*managed).dl_tensor };
        assert_eq!(tensor.data, data.as_mut_ptr().cast());
        assert_eq!(
            tensor.device,
            DLDevice {
                device_type: DL_CUDA,
                device_id: 3
            }
        );
        assert_eq!(
            tensor.dtype,
            DLDataType {
                code: 4,
                bits: 16,
                lanes: 1
            }
        );
        assert_eq!(tensor.ndim, 2);
        // SAFETY: shape and strides point at `ndim` i64s owned by the export.
        let (shape, strides) = unsafe {
            (
                std::slice::from_raw_parts(tensor.shape, 2),
                std::slice::from_raw_parts(tensor.strides, 2),
            )
        };
        assert_eq!((shape, strides), (&[2i64, 3][..], &[3i64, 1][..]));
        assert!(!released.load(Ordering::SeqCst));
        // SAFETY: the deleter of an export, called once.
        unsafe { ((*managed).deleter.expect("deleter"))(managed) };
        assert!(released.load(Ordering::SeqCst));
    }

    #[test]
    fn versioned_exports_are_read_only_unless_asked() {
        for (access, flags) in [
            (Access::ReadOnly, DLPACK_FLAG_READ_ONLY),
            (Access::Writable, 0),
        ] {
            let released = Arc::new(AtomicBool::new(false));
            let mut data = [0u8; 4];
            let managed =
                export_versioned(bytes(data.as_mut_ptr().cast(), &released), access);
            // SAFETY: `managed` is a live export we have not deleted yet.
            let export = unsafe { &*managed };
            assert_eq!(export.version, DLPackVersion { major: 1, minor: 0 });
            assert_eq!(export.flags, flags);
            assert_eq!(export.dl_tensor.ndim, 1);
            assert_eq!(export.dl_tensor.device.device_type, DL_CPU);
            // SAFETY: the deleter of an export, called once.
            unsafe { (export.deleter.expect("deleter"))(managed) };
            assert!(released.load(Ordering::SeqCst));
        }
    }

    #[test]
    fn an_export_nobody_could_take_is_deleted() {
        let mut data = [0u8; 4];
        let address: *mut c_void = data.as_mut_ptr().cast();
        let make = |released: &Arc<AtomicBool>| {
            export_versioned(bytes(address, released), Access::ReadOnly)
        };
        let released = Arc::new(AtomicBool::new(false));
        // SAFETY: a live export, never deleted elsewhere: `give` fails.
        let outcome =
            unsafe { hand_over(make(&released), |_| Err::<(), _>("no capsule")) };
        assert_eq!(outcome, Err("no capsule"));
        assert!(
            released.load(Ordering::SeqCst),
            "a failed hand-over leaks nothing"
        );

        let released = Arc::new(AtomicBool::new(false));
        // SAFETY: a live export; `give` takes it and we delete it once below.
        let taken = unsafe { hand_over(make(&released), Ok::<_, ()>) }.expect("taken");
        assert!(
            !released.load(Ordering::SeqCst),
            "taken: still the consumer's"
        );
        // SAFETY: the consumer's single call of the deleter.
        unsafe { ((*taken).deleter.expect("deleter"))(taken) };
        assert!(released.load(Ordering::SeqCst));
    }
}
