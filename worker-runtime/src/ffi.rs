//! Declarations of `csrc/c10d_shim.cpp` and the one place that turns its
//! status codes into Rust errors.
//!
//! Contract (see the shim's header comment): every function returns 0 on
//! success, otherwise a [`FailureKind`] code and a `malloc`ed message that
//! must go back through `wr_string_free`. Tensor handles are tch's
//! `C_tensor` pointers, which are `at::Tensor*`; the shim never frees them.

use std::ffi::{c_char, CStr};
use std::ptr;

use torch_sys::C_tensor;

use crate::error::FailureKind;

/// The shim's `wr_group` (store + ProcessGroupGloo); opaque here.
#[repr(C)]
pub(crate) struct RawGroup {
    _private: [u8; 0],
}

extern "C" {
    pub(crate) fn wr_string_free(s: *mut c_char);
    pub(crate) fn wr_group_new(
        host: *const c_char,
        port: u16,
        is_master: i32,
        rank: i32,
        size: i32,
        timeout_ms: i64,
        out: *mut *mut RawGroup,
        err: *mut *mut c_char,
    ) -> i32;
    pub(crate) fn wr_group_free(group: *mut RawGroup);
    pub(crate) fn wr_all_reduce(
        group: *mut RawGroup,
        tensor: *mut C_tensor,
        op: i32,
        err: *mut *mut c_char,
    ) -> i32;
    pub(crate) fn wr_broadcast(
        group: *mut RawGroup,
        tensor: *mut C_tensor,
        root: i32,
        err: *mut *mut c_char,
    ) -> i32;
    pub(crate) fn wr_all_gather(
        group: *mut RawGroup,
        input: *const C_tensor,
        outputs: *const *const C_tensor,
        n: i32,
        err: *mut *mut c_char,
    ) -> i32;
    pub(crate) fn wr_reduce_scatter(
        group: *mut RawGroup,
        output: *mut C_tensor,
        inputs: *const *const C_tensor,
        n: i32,
        op: i32,
        err: *mut *mut c_char,
    ) -> i32;
    pub(crate) fn wr_barrier(group: *mut RawGroup, err: *mut *mut c_char) -> i32;
}

/// A failure reported by the shim.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) kind: FailureKind,
    pub(crate) message: String,
}

/// Calls a shim function with an error slot and converts its status.
pub(crate) fn checked(f: impl FnOnce(*mut *mut c_char) -> i32) -> Result<(), Failure> {
    let mut err: *mut c_char = ptr::null_mut();
    let status = f(&mut err);
    if status == 0 {
        return Ok(());
    }
    let message = if err.is_null() {
        "(no message: the shim could not allocate it)".to_owned()
    } else {
        // SAFETY: a non-null message is a NUL-terminated string the shim
        // malloc'ed for us; it is read once and freed once.
        let text = unsafe { CStr::from_ptr(err) }
            .to_string_lossy()
            .into_owned();
        unsafe { wr_string_free(err) };
        text
    };
    Err(Failure {
        kind: FailureKind::from_status(status),
        message,
    })
}
