//! Kernel launches through `cuLaunchKernelEx`, so that a launch can carry the programmatic stream
//! serialization attribute (Hopper's programmatic dependent launch): the next kernel on the stream may
//! start while this one finishes, and runs up to its `griddepcontrol.wait` (cuda/prelude.cuh
//! `pdl_wait`) — weight prefetch, for the GEMVs — before the previous kernel's results are needed.
//! Captured into a CUDA graph, the attribute becomes a programmatic edge. Every kernel waits before it
//! touches activations, so the attribute changes when work starts, never what it reads.

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys::{self, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchConfig};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DriverError, LaunchConfig};

/// One kernel parameter as the bytes the kernel reads (device addresses and 4- or 8-byte scalars, in
/// an 8-byte slot; CUDA copies the parameter's declared size from the slot's start).
pub trait KernelArg {
    fn bits(self, stream: &CudaStream) -> u64;
}

impl<T> KernelArg for &CudaSlice<T> {
    fn bits(self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}

impl<T> KernelArg for &CudaView<'_, T> {
    fn bits(self, stream: &CudaStream) -> u64 {
        self.device_ptr(stream).0
    }
}

impl<T> KernelArg for &mut CudaViewMut<'_, T> {
    fn bits(self, stream: &CudaStream) -> u64 {
        self.device_ptr_mut(stream).0
    }
}

impl KernelArg for &i32 {
    fn bits(self, _: &CudaStream) -> u64 {
        u64::from(*self as u32)
    }
}

impl KernelArg for &f32 {
    fn bits(self, _: &CudaStream) -> u64 {
        u64::from(self.to_bits())
    }
}

impl KernelArg for &u64 {
    fn bits(self, _: &CudaStream) -> u64 {
        *self
    }
}

/// Launches `function` on `stream` with the parameter slots `args` (in the kernel's declared order);
/// `cluster` > 0 groups the grid's blocks along x into thread-block clusters of that many (sm_90; the
/// grid's x must be a multiple of it).
///
/// # Safety
/// `args` must match the kernel's parameter list in number, order and type, and every buffer the
/// kernel indexes must be large enough (the wrappers in `device` check this before calling).
pub unsafe fn launch(
    stream: &CudaStream,
    function: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut [u64],
    programmatic: bool,
    cluster: u32,
) -> Result<(), DriverError> {
    let mut params: Vec<*mut c_void> = args.iter_mut().map(|slot| (slot as *mut u64).cast::<c_void>()).collect();
    // SAFETY: an all-zero attribute is a valid (ignored) value; ids and values are set below.
    let mut attributes: [CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut count = 0;
    if programmatic {
        attributes[count].id = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attributes[count].value.programmaticStreamSerializationAllowed = 1;
        count += 1;
    }
    if cluster > 0 {
        attributes[count].id = CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attributes[count].value.clusterDim.x = cluster;
        attributes[count].value.clusterDim.y = 1;
        attributes[count].value.clusterDim.z = 1;
        count += 1;
    }
    let config = CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: if count > 0 { attributes.as_mut_ptr() } else { ptr::null_mut() },
        numAttrs: count as u32,
    };
    // SAFETY: `params` points at `args`' slots, alive for the call (CUDA copies them at launch); the
    // caller vouches for their match with the kernel.
    unsafe { sys::cuLaunchKernelEx(&config, function.cu_function(), params.as_mut_ptr(), ptr::null_mut()) }.result()
}
