//! `upnvme_deallocate` reads the caller's ranges by copy, at any alignment,
//! and never through a Rust reference: the ranges may sit in a
//! `upnvme_buf`'s DMA memory, which no Rust reference may cover (the rule
//! `upnvme_ctrl_admin_passthru` and the options structs follow too). Its
//! own binary: before the fix a misaligned array tripped
//! `slice::from_raw_parts`'s precondition check, which aborts the process.

use std::ffi::CStr;

use upnvme_c::{UPNVME_EINVAL, upnvme_deallocate, upnvme_last_error, upnvme_range};

fn last_error() -> String {
    // SAFETY: this thread's NUL-terminated message.
    unsafe { CStr::from_ptr(upnvme_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn ranges_at_any_alignment_are_read_by_copy() {
    let one = upnvme_range { slba: 8, blocks: 4 };
    let size = std::mem::size_of::<upnvme_range>();
    // Two ranges 4 bytes into a byte array: not 8-byte aligned.
    let mut bytes = vec![0u8; 4 + 2 * size + 8];
    let base = bytes.as_mut_ptr().wrapping_add(4);
    let base = if (base as usize).is_multiple_of(8) {
        base.wrapping_add(4)
    } else {
        base
    };
    for i in 0..2 {
        // SAFETY: inside `bytes` (4 + 2 × size + 8 long, at most 8 in).
        unsafe {
            base.wrapping_add(i * size)
                .cast::<upnvme_range>()
                .write_unaligned(one)
        };
    }
    // No queue pair: the ranges are read, then the NULL pair refused.
    // SAFETY: `base` is valid for two ranges' reads; a NULL pair is refused.
    let rc = unsafe {
        upnvme_deallocate(
            std::ptr::null_mut(),
            1,
            base.cast::<upnvme_range>(),
            2,
            None,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, UPNVME_EINVAL);
    assert!(
        last_error().contains("queue pair handle is NULL"),
        "{}",
        last_error()
    );
}
