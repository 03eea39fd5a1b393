//! `capi_sequence`: the C ABI (driver/capi) driven through its own entry
//! points, on the in-memory controller model, by a sequence of actions
//! decoded from the fuzzer's bytes — open and close a controller, create and
//! destroy queue pairs (also with commands in flight), allocate, free and
//! split buffers, pools (create, get, put, destroy), Read / Write (with and
//! without flags) / Flush / Write Zeroes / Deallocate / Copy / Compare /
//! Verify / Write Uncorrectable, and the `_ext` forms (`upnvme_io_ext`: NULL,
//! short, unknown bits, a separate metadata buffer — also one the API must
//! refuse — protection fields, on a namespace with metadata of either
//! layout, with or without protection information) with callbacks that
//! record, submit again on the same pair, reap again (nested), try to
//! destroy their pair or free a buffer in flight (refused), free their own
//! buffer, or with no callback at all; completions with every kind of `max`;
//! uses of handles the API promises to refuse (a buffer in flight, a pool
//! buffer already put back, a buffer the driver kept); admin passthrough,
//! controller resets, asynchronous events and the model's faults.
//!
//! The entry points are lib.rs's own functions, compiled here with the model
//! as their device (fuzz/build.rs writes the file; see there), so the
//! `unsafe` code under AddressSanitizer is the library's, not a copy.
//!
//! Checked after every call:
//! - no panic reaches the ABI (a caught one is `UPNVME_EINTERNAL`, never
//!   accepted), no ASan report, no hang;
//! - every return code is one the header documents for that call;
//! - every callback runs at most once per accepted submission, never for a
//!   refused one, with the submission's buffer handle, and no longer in
//!   flight; `process_completions` returns how many callbacks it ran (never
//!   more than `max`); a destroy that succeeds has run every callback of
//!   its pair; `upnvme_qpair_in_flight` counts the commands whose callback
//!   has not run;
//! - an `_ext` command's metadata buffer is in flight exactly while the
//!   command is accepted and its callback has not run, comes back in
//!   `cpl->md`, and a refused submission leaves it as it was (another
//!   command's stays in flight);
//! - a buffer handle given to a command is refused (`UPNVME_EBUSY`) for
//!   another command, free, put and split until its callback ran; a pool
//!   buffer put back, and a handle whose memory the driver kept, are refused
//!   with `UPNVME_EINVAL`; a refused submission leaves its buffer as it was;
//! - at the end (faults cleared, a reset, the pairs destroyed — after a
//!   close when commands cannot complete otherwise) every accepted
//!   command's callback ran exactly once, and the model saw no DMA to
//!   unmapped memory and no doorbell of a deleted queue.
#![no_main]

use std::cell::RefCell;
use std::ffi::{CStr, c_int, c_void};

use libfuzzer_sys::fuzz_target;
use upnvme::{Controller, ControllerOptions};
use upnvme_fuzz::Reader;
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig, Status};

/// driver/capi/src/lib.rs with the model as its device (see fuzz/build.rs).
#[allow(
    dead_code,
    non_camel_case_types,
    unused_imports,
    clippy::missing_safety_doc
)]
mod capi {
    include!(concat!(env!("OUT_DIR"), "/capi_lib.rs"));
}

// lib.rs's modules name each other as `crate::status`, `crate::buf`, ...
use capi::{buf, ctrl, qpair, status};

use buf::{upnvme_buf, upnvme_pool};
use capi::{upnvme_ctrl, upnvme_qpair};
use ctrl::{upnvme_admin_cmd, upnvme_admin_cpl, upnvme_async_event, upnvme_ns_info};
use qpair::{upnvme_cpl, upnvme_qpair_opts, upnvme_range};
use status::*;

/// Blocks of namespace 1 (and 2).
const NS_BLOCKS: u64 = 256;
/// Most actions per input.
const MAX_ACTIONS: usize = 200;
/// Most buffer handles, pools and pairs the harness makes per input.
const MAX_BUFS: usize = 64;
const MAX_POOLS: usize = 4;
const MAX_PAIRS: usize = 6;

thread_local! {
    /// The model `upnvme_ctrl_open` brings up (see `model_open`).
    static MODEL: RefCell<Option<ModelController>> = const { RefCell::new(None) };
    /// The harness's books, shared with the callbacks.
    static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
}

/// `Controller::open` for lib.rs's `upnvme_ctrl_open` (fuzz/build.rs patches
/// the call): brings up this input's model with the caller's options over
/// the fuzz defaults (4 KiB pages, short bounds).
pub(crate) fn model_open(
    addr: &str,
    o: ControllerOptions,
) -> upnvme::Result<Controller<ModelController>> {
    assert_eq!(addr, "model", "the harness opens only the model");
    let m = MODEL
        .with(|m| m.borrow().clone())
        .expect("a model for this input");
    let mut opts = upnvme_fuzz::options();
    opts.io_queues = o.io_queues;
    opts.shadow_doorbells = o.shadow_doorbells;
    opts.admin_timeout = o.admin_timeout.or(opts.admin_timeout);
    Controller::with_device(m, opts)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BufState {
    /// The harness holds it, with memory.
    Owned,
    /// The harness holds it; the driver kept its memory (data NULL).
    Empty,
    /// A command with a callback owns it (submission id).
    InFlight(usize),
    /// A command without a callback owns it (or did: it is the harness's
    /// again once the pair has nothing in flight).
    NoCb(usize),
    /// Put back into its pool (which still lives): the pool owns the handle.
    Spare,
    /// Freed: never touched again.
    Freed,
}

struct Buf {
    h: *mut upnvme_buf,
    pool: Option<usize>,
    state: BufState,
}

struct Pool {
    p: *mut upnvme_pool,
    alive: bool,
}

struct Pair {
    q: *mut upnvme_qpair,
    alive: bool,
    /// The model's queue ID (for faults).
    qid: u16,
}

/// What a callback does besides recording.
#[derive(Clone, Copy, Debug)]
enum Cb {
    Record,
    /// Submits a Flush, and a Read with its own buffer when it came back.
    Resubmit,
    /// Tries to destroy its own pair and free a buffer in flight (refused).
    TryDestroy,
    /// Reaps its pair again, `max` as given.
    Nested(u32),
    /// Frees its own buffer handle.
    FreeBuf,
}

struct Sub {
    pair: usize,
    buf: Option<usize>,
    /// The separate metadata buffer of an `_ext` submission.
    md: Option<usize>,
    accepted: bool,
    null_cb: bool,
    calls: u32,
    cb: Cb,
}

struct World {
    bufs: Vec<Buf>,
    pools: Vec<Pool>,
    pairs: Vec<Pair>,
    subs: Vec<Sub>,
    /// Callbacks run in each `process_completions` / destroy in progress.
    frames: Vec<u32>,
    /// Pairs whose destroy is in progress (their commands may end with
    /// `UPNVME_ENODEV` and refuse work).
    destroying: Vec<usize>,
    lba: u32,
    /// What happened, for `UPNVME_FUZZ_DEBUG=1`.
    stats: std::collections::BTreeMap<String, u32>,
}

/// Counts an event for `UPNVME_FUZZ_DEBUG=1`.
fn note(w: &mut World, what: impl Into<String>) {
    *w.stats.entry(what.into()).or_default() += 1;
}

fn w<R>(f: impl FnOnce(&mut World) -> R) -> R {
    WORLD.with(|x| f(x.borrow_mut().as_mut().expect("the world of this input")))
}

/// Every code the header defines.
const DEFINED: [c_int; 11] = [
    UPNVME_OK,
    UPNVME_EINVAL,
    UPNVME_ENOMEM,
    UPNVME_EAGAIN,
    UPNVME_EBUSY,
    UPNVME_ENODEV,
    UPNVME_EIO,
    UPNVME_ETIMEDOUT,
    UPNVME_ECANCELED,
    UPNVME_ENOTSUP,
    UPNVME_ESETUP,
];

/// What a submission may return (header: `upnvme_read` "0 or a negative
/// code (nothing was sent)": an argument, a buffer in flight, a full queue,
/// a failed / closed / gone controller, an unsupported command).
const SUBMIT: &[c_int] = &[
    UPNVME_OK,
    UPNVME_EINVAL,
    UPNVME_EBUSY,
    UPNVME_EAGAIN,
    UPNVME_ENODEV,
    UPNVME_ENOTSUP,
];
/// `upnvme_cpl.status`.
const CPL: &[c_int] = &[
    UPNVME_OK,
    UPNVME_EIO,
    UPNVME_ENODEV,
    UPNVME_ECANCELED,
    UPNVME_ETIMEDOUT,
];

/// This thread's last error, read (its pointer must be valid).
fn last_error() -> String {
    // SAFETY: the library's NUL-terminated message for this thread, valid
    // until the next failing call on it.
    unsafe { CStr::from_ptr(capi::upnvme_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// `rc` must be in `allowed`; never `UPNVME_EINTERNAL` (a caught panic).
fn check(call: &str, rc: c_int, allowed: &[c_int]) {
    if rc == UPNVME_OK {
        return;
    }
    let msg = last_error();
    assert_ne!(
        rc, UPNVME_EINTERNAL,
        "{call}: UPNVME_EINTERNAL (a panic inside the library): {msg}"
    );
    assert!(
        allowed.contains(&rc),
        "{call}: return code {rc} is not among the documented {allowed:?}: {msg}"
    );
    // SAFETY: a static string for any code.
    let s = unsafe { CStr::from_ptr(capi::upnvme_strerror(rc)) };
    assert!(!s.to_bytes().is_empty());
}

fn data_of(h: *mut upnvme_buf) -> *mut u8 {
    // SAFETY: a live handle (the harness never passes a freed one).
    unsafe { capi::upnvme_buf_data(h) }.cast()
}

fn in_flight_flag(h: *mut upnvme_buf) -> bool {
    // SAFETY: a live handle; a plain read of its state, no call running.
    unsafe { (*h).inflight }
}

/// The state a handle the harness holds again is in: with memory or not.
fn held_state(h: *mut upnvme_buf) -> BufState {
    if data_of(h).is_null() {
        BufState::Empty
    } else {
        BufState::Owned
    }
}

// ---------------------------------------------------------------------------
// Callbacks.
// ---------------------------------------------------------------------------

unsafe extern "C" fn on_done(arg: *mut c_void, cpl: *const upnvme_cpl) {
    let id = arg as usize;
    // SAFETY: valid for the call (the API's promise).
    let cpl = unsafe { *cpl };
    assert!(
        CPL.contains(&cpl.status),
        "completion status {}",
        cpl.status
    );
    let (pair, q, buf, cb) = w(|w| {
        let sub = &mut w.subs[id];
        assert!(sub.accepted, "callback of refused submission {id}");
        assert!(!sub.null_cb);
        sub.calls += 1;
        assert_eq!(sub.calls, 1, "callback of submission {id} ran twice");
        let (pair, buf, cb) = (sub.pair, sub.buf, sub.cb);
        note(w, format!("callback {cb:?} status {}", cpl.status));
        *w.frames
            .last_mut()
            .expect("callbacks run only inside process_completions or destroy") += 1;
        let h = buf.map_or(std::ptr::null_mut(), |b| w.bufs[b].h);
        assert_eq!(cpl.buf, h, "submission {id}: cpl->buf is not its buffer");
        if let Some(b) = buf {
            assert_eq!(w.bufs[b].state, BufState::InFlight(id));
            assert!(
                !in_flight_flag(h),
                "submission {id}: its buffer is still in flight in its callback"
            );
            if cpl.status == UPNVME_OK {
                assert!(
                    !data_of(h).is_null(),
                    "submission {id} succeeded but its buffer came back without memory"
                );
            }
            w.bufs[b].state = held_state(h);
        }
        let md = w.subs[id].md;
        let hm = md.map_or(std::ptr::null_mut(), |b| w.bufs[b].h);
        assert_eq!(
            cpl.md, hm,
            "submission {id}: cpl->md is not its metadata buffer"
        );
        if let Some(b) = md {
            assert_eq!(w.bufs[b].state, BufState::InFlight(id));
            assert!(
                !in_flight_flag(hm),
                "submission {id}: its metadata buffer is still in flight in its callback"
            );
            if cpl.status == UPNVME_OK {
                assert!(
                    !data_of(hm).is_null(),
                    "submission {id} succeeded but its metadata buffer came back without memory"
                );
            }
            w.bufs[b].state = held_state(hm);
        }
        (pair, w.pairs[pair].q, buf, cb)
    });
    match cb {
        Cb::Record => {}
        Cb::Resubmit => {
            submit(
                pair,
                1,
                Op::Flush,
                None,
                Cb::Record,
                false,
                None,
                None,
                None,
            );
            if let Some(b) = buf
                && w(|w| w.bufs[b].state) == BufState::Owned
            {
                let op = Op::Read {
                    slba: 0,
                    blocks: 1,
                    flags: None,
                };
                submit(pair, 1, op, Some(b), Cb::Record, false, None, None, None);
            }
        }
        Cb::TryDestroy => {
            // SAFETY: the live pair whose callback this is.
            let rc = unsafe { capi::upnvme_qpair_destroy(q) };
            assert_eq!(rc, UPNVME_EBUSY, "destroy from its own callback");
            let busy = w(|w| {
                w.bufs
                    .iter()
                    .find(|b| matches!(b.state, BufState::InFlight(_)))
                    .map(|b| b.h)
            });
            if let Some(h) = busy {
                // SAFETY: a live handle in flight.
                let rc = unsafe { capi::upnvme_buf_free(h) };
                assert_eq!(
                    rc, UPNVME_EBUSY,
                    "free of a buffer in flight, in a callback"
                );
            }
        }
        Cb::Nested(max) => {
            process(pair, max);
        }
        Cb::FreeBuf => {
            if let Some(b) = buf {
                free_buf(b);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Calls with their bookkeeping (also used from callbacks: no borrow of the
// world is held across a call into the library).
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Op {
    Read {
        slba: u64,
        blocks: u32,
        flags: Option<u32>,
    },
    Write {
        slba: u64,
        blocks: u32,
        flags: Option<u32>,
    },
    Flush,
    WriteZeroes {
        slba: u64,
        blocks: u32,
        deallocate: bool,
    },
    Deallocate,
    Copy {
        sdlba: u64,
    },
    Compare {
        slba: u64,
        blocks: u32,
    },
    Verify {
        slba: u64,
        blocks: u32,
    },
    WriteUncorrectable {
        slba: u64,
        blocks: u32,
    },
}

/// The `upnvme_io_ext` an `_ext` submission passes.
#[derive(Clone, Copy, Debug)]
struct ExtSpec {
    /// NULL instead of the struct.
    null: bool,
    size: u32,
    flags: u32,
    pi: u32,
    /// The metadata buffer (a harness buffer index).
    md: Option<usize>,
    ref_tag: u64,
    app_tag: u16,
    app_tag_mask: u16,
}

/// Copy's source ranges (`None`: a NULL array).
type CopyRanges = Option<Vec<qpair::upnvme_copy_range>>;

/// Where Deallocate's ranges are: the harness's memory, or a buffer's DMA
/// memory at any offset (buffer index, offset).
type RangesAt = Option<(Vec<upnvme_range>, Option<(usize, usize)>)>;

#[allow(clippy::too_many_arguments)]
fn submit(
    pair: usize,
    nsid: u32,
    op: Op,
    buf: Option<usize>,
    cb: Cb,
    null_cb: bool,
    ranges: RangesAt,
    copies: CopyRanges,
    ext: Option<ExtSpec>,
) -> c_int {
    let data = matches!(op, Op::Read { .. } | Op::Write { .. } | Op::Compare { .. });
    let md = ext.and_then(|e| if e.null { None } else { e.md });
    let (hm, md_before) = w(|w| {
        md.map_or((std::ptr::null_mut(), None), |b| {
            (w.bufs[b].h, Some(w.bufs[b].state))
        })
    });
    let md_data_before = (!hm.is_null()).then(|| data_of(hm));
    let (q, h, before, id, ending) = w(|w| {
        let id = w.subs.len();
        w.subs.push(Sub {
            pair,
            buf: if data { buf } else { None },
            md,
            accepted: false,
            null_cb,
            calls: 0,
            cb,
        });
        assert!(w.pairs[pair].alive);
        let h = buf.map_or(std::ptr::null_mut(), |b| w.bufs[b].h);
        (
            w.pairs[pair].q,
            h,
            buf.map(|b| w.bufs[b].state),
            id,
            w.destroying.contains(&pair),
        )
    });
    let data_before = (!h.is_null()).then(|| data_of(h));
    let cbp: qpair::upnvme_cmd_cb = if null_cb { None } else { Some(on_done) };
    let arg = id as *mut c_void;
    let e = ext.map(|e| qpair::upnvme_io_ext {
        size: e.size,
        flags: e.flags,
        md: hm,
        pi: e.pi,
        app_tag: e.app_tag,
        app_tag_mask: e.app_tag_mask,
        ref_tag: e.ref_tag,
    });
    let ep: *const qpair::upnvme_io_ext = match (ext, &e) {
        (Some(x), Some(e)) if !x.null => e,
        _ => std::ptr::null(),
    };
    // SAFETY: `q` is a live pair of this thread; `h` and `hm` are NULL or
    // live handles (the harness passes no freed one; a spare one only while
    // its pool lives, where the API promises to refuse it); the ranges are
    // valid for `count` reads; `ep` is NULL or the struct above, valid for
    // its `size` whenever that is at most its own size (`size` beyond it is
    // read only as far as the struct, as the header promises).
    let rc = unsafe {
        match (op, ext) {
            (Op::Read { slba, blocks, .. }, Some(_)) => {
                capi::upnvme_read_ext(q, nsid, h, slba, blocks, ep, cbp, arg)
            }
            (Op::Write { slba, blocks, .. }, Some(_)) => {
                capi::upnvme_write_ext(q, nsid, h, slba, blocks, ep, cbp, arg)
            }
            (Op::Compare { slba, blocks }, Some(_)) => {
                capi::upnvme_compare_ext(q, nsid, h, slba, blocks, ep, cbp, arg)
            }
            (Op::Verify { slba, blocks }, Some(_)) => {
                capi::upnvme_verify_ext(q, nsid, slba, blocks, ep, cbp, arg)
            }
            (
                Op::WriteZeroes {
                    slba,
                    blocks,
                    deallocate,
                },
                Some(_),
            ) => capi::upnvme_write_zeroes_ext(q, nsid, slba, blocks, deallocate, ep, cbp, arg),
            (op, _) => match op {
                Op::Read {
                    slba,
                    blocks,
                    flags: None,
                } => capi::upnvme_read(q, nsid, h, slba, blocks, cbp, arg),
                Op::Read {
                    slba,
                    blocks,
                    flags: Some(f),
                } => capi::upnvme_read_flags(q, nsid, h, slba, blocks, f, cbp, arg),
                Op::Write {
                    slba,
                    blocks,
                    flags: None,
                } => capi::upnvme_write(q, nsid, h, slba, blocks, cbp, arg),
                Op::Write {
                    slba,
                    blocks,
                    flags: Some(f),
                } => capi::upnvme_write_flags(q, nsid, h, slba, blocks, f, cbp, arg),
                Op::Compare { slba, blocks } => {
                    capi::upnvme_compare(q, nsid, h, slba, blocks, cbp, arg)
                }
                Op::Verify { slba, blocks } => capi::upnvme_verify(q, nsid, slba, blocks, cbp, arg),
                Op::WriteUncorrectable { slba, blocks } => {
                    capi::upnvme_write_uncorrectable(q, nsid, slba, blocks, cbp, arg)
                }
                Op::Flush => capi::upnvme_flush(q, nsid, cbp, arg),
                Op::WriteZeroes {
                    slba,
                    blocks,
                    deallocate,
                } => capi::upnvme_write_zeroes(q, nsid, slba, blocks, deallocate, cbp, arg),
                Op::Deallocate => match &ranges {
                    None => capi::upnvme_deallocate(q, nsid, std::ptr::null(), 0, cbp, arg),
                    Some((r, None)) => {
                        capi::upnvme_deallocate(q, nsid, r.as_ptr(), r.len() as u32, cbp, arg)
                    }
                    Some((r, Some((b, off)))) => {
                        let bh = w(|w| w.bufs[*b].h);
                        let base = data_of(bh).wrapping_add(*off).cast::<upnvme_range>();
                        for (i, x) in r.iter().enumerate() {
                            // Unaligned, in DMA memory the harness owns
                            // (checked to hold them when chosen).
                            base.wrapping_add(i).write_unaligned(*x);
                        }
                        capi::upnvme_deallocate(q, nsid, base, r.len() as u32, cbp, arg)
                    }
                },
                Op::Copy { sdlba } => match &copies {
                    None => capi::upnvme_copy(q, nsid, sdlba, std::ptr::null(), 1, cbp, arg),
                    Some(c) => {
                        capi::upnvme_copy(q, nsid, sdlba, c.as_ptr(), c.len() as u32, cbp, arg)
                    }
                },
            },
        }
    };
    check(&format!("submit {op:?} nsid {nsid}"), rc, SUBMIT);
    let kind = match op {
        Op::Read { .. } => "read",
        Op::Write { .. } => "write",
        Op::Flush => "flush",
        Op::WriteZeroes { .. } => "write_zeroes",
        Op::Deallocate => "deallocate",
        Op::Copy { .. } => "copy",
        Op::Compare { .. } => "compare",
        Op::Verify { .. } => "verify",
        Op::WriteUncorrectable { .. } => "write_uncorrectable",
    };
    let kind = if ext.is_some() {
        format!("{kind}_ext")
    } else {
        kind.to_string()
    };
    w(|w| note(w, format!("submit {kind} rc {rc}")));
    // The metadata handle: the command's when accepted; as it was otherwise.
    if let (Some(b), Some(mb)) = (md, md_before) {
        if rc == UPNVME_OK {
            assert_eq!(
                mb,
                BufState::Owned,
                "a submission took metadata buffer {b} in state {mb:?}"
            );
            assert!(
                in_flight_flag(hm),
                "an accepted metadata buffer is not in flight"
            );
            w(|w| {
                note(w, format!("{kind} accepted with a metadata buffer"));
                w.bufs[b].state = if null_cb {
                    BufState::NoCb(pair)
                } else {
                    BufState::InFlight(id)
                };
            });
        } else {
            match mb {
                BufState::Owned => {
                    assert!(
                        !in_flight_flag(hm),
                        "a refused submission left its metadata buffer in flight"
                    );
                    assert_eq!(
                        Some(data_of(hm)),
                        md_data_before,
                        "a refused submission changed its metadata buffer's memory"
                    );
                }
                BufState::InFlight(_) | BufState::NoCb(_) => assert!(
                    in_flight_flag(hm),
                    "a refused submission released another command's metadata buffer"
                ),
                _ => {}
            }
        }
    }
    if !data || h.is_null() {
        if rc == UPNVME_OK {
            w(|w| w.subs[id].accepted = true);
        }
        return rc;
    }
    let b = buf.expect("a handle");
    let before = before.expect("a state");
    if rc == UPNVME_OK {
        assert!(
            before == BufState::Owned,
            "a submission took buffer {b} in state {before:?}"
        );
        assert!(in_flight_flag(h), "an accepted buffer is not in flight");
        w(|w| {
            w.subs[id].accepted = true;
            w.bufs[b].state = if null_cb {
                BufState::NoCb(pair)
            } else {
                BufState::InFlight(id)
            };
        });
        return rc;
    }
    // Refused: the handle is as it was.
    // Checked before the buffer: unknown flag bits (refused first), another
    // NSID, a pair being destroyed.
    let bad_flags = matches!(
        op,
        Op::Read { flags: Some(f), .. } | Op::Write { flags: Some(f), .. } if f > 3
    );
    // An `_ext` submission's own checks (its struct, its metadata buffer)
    // come before the data buffer's.
    let refusal_ok = ending && rc == UPNVME_ENODEV || nsid != 1 || bad_flags || ext.is_some();
    match before {
        BufState::InFlight(_) if !refusal_ok => {
            let msg = last_error();
            assert_eq!(
                rc, UPNVME_EBUSY,
                "a buffer in flight submitted again: {msg}"
            )
        }
        BufState::Spare | BufState::Empty if !refusal_ok => {
            let msg = last_error();
            assert_eq!(
                rc, UPNVME_EINVAL,
                "submission of a {before:?} handle: {msg}"
            )
        }
        BufState::Owned => {
            assert!(
                !in_flight_flag(h),
                "a refused submission left its buffer in flight"
            );
            assert_eq!(
                Some(data_of(h)),
                data_before,
                "a refused submission changed its buffer's memory"
            );
        }
        _ => {}
    }
    rc
}

/// `upnvme_qpair_process_completions`, checking its count against the
/// callbacks it ran.
fn process(pair: usize, max: u32) -> c_int {
    let q = w(|w| {
        w.frames.push(0);
        w.pairs[pair].q
    });
    // SAFETY: a live pair of this thread.
    let rc = unsafe { capi::upnvme_qpair_process_completions(q, max) };
    // SAFETY: as above.
    let depth = unsafe { capi::upnvme_qpair_max_depth(q) };
    let ran = w(|w| w.frames.pop().expect("this call's frame"));
    check("process_completions", rc.min(0), &[UPNVME_ENODEV]);
    if rc >= 0 {
        // The count includes commands submitted without a callback.
        let nocb = w(|w| {
            w.subs
                .iter()
                .filter(|s| s.pair == pair && s.accepted && s.null_cb)
                .count() as u32
        });
        let n = rc as u32;
        assert!(
            ran <= n && n <= ran + nocb,
            "process_completions returned {n}: {ran} callbacks ran, {nocb} commands without one"
        );
        let cap = if max == 0 { depth.max(1) } else { max };
        assert!(n <= cap, "{n} completions for max {max} (depth {depth})");
    } else {
        assert_eq!(
            ran, 0,
            "callbacks ran but process_completions returned {rc}"
        );
    }
    rc
}

/// `upnvme_qpair_destroy`: `UPNVME_OK` only once every callback ran.
fn destroy(pair: usize) -> c_int {
    let q = w(|w| {
        w.frames.push(0);
        w.destroying.push(pair);
        w.pairs[pair].q
    });
    // SAFETY: a live pair of this thread, given up on success.
    let rc = unsafe { capi::upnvme_qpair_destroy(q) };
    w(|w| {
        w.frames.pop();
        w.destroying.pop();
    });
    check("qpair_destroy", rc, &[UPNVME_EBUSY]);
    w(|w| note(w, format!("destroy rc {rc}")));
    if rc == UPNVME_OK {
        w(|w| {
            w.pairs[pair].alive = false;
            for (i, s) in w.subs.iter().enumerate() {
                if s.pair == pair && s.accepted && !s.null_cb {
                    assert_eq!(s.calls, 1, "destroyed pair {pair}: submission {i}");
                }
            }
            for b in &mut w.bufs {
                if b.state == BufState::NoCb(pair) {
                    assert!(!in_flight_flag(b.h), "a destroyed pair's buffer in flight");
                    b.state = held_state(b.h);
                }
            }
        });
    }
    rc
}

/// `upnvme_buf_free` of a handle the harness holds: must succeed.
fn free_buf(b: usize) {
    let (h, state) = w(|w| (w.bufs[b].h, w.bufs[b].state));
    assert!(matches!(state, BufState::Owned | BufState::Empty));
    // SAFETY: a live handle the harness holds, given up.
    let rc = unsafe { capi::upnvme_buf_free(h) };
    assert_eq!(rc, UPNVME_OK, "free of a held buffer: {}", last_error());
    w(|w| w.bufs[b].state = BufState::Freed);
}

// ---------------------------------------------------------------------------
// The harness.
// ---------------------------------------------------------------------------

struct Harness {
    m: ModelController,
    ctrl: *mut upnvme_ctrl,
}

impl Harness {
    fn pick<T>(r: &mut Reader<'_>, v: &[T]) -> Option<usize> {
        (!v.is_empty()).then(|| r.below(v.len() as u32) as usize)
    }

    fn live_pair(&self, r: &mut Reader<'_>) -> Option<usize> {
        let live: Vec<usize> = w(|w| {
            w.pairs
                .iter()
                .enumerate()
                .filter(|(_, p)| p.alive)
                .map(|(i, _)| i)
                .collect()
        });
        Self::pick(r, &live).map(|i| live[i])
    }

    /// A buffer in one of `states` (a spare one only while its pool lives).
    fn buf_in(&self, r: &mut Reader<'_>, ok: impl Fn(BufState) -> bool) -> Option<usize> {
        let v: Vec<usize> = w(|w| {
            w.bufs
                .iter()
                .enumerate()
                .filter(|(_, b)| ok(b.state))
                .filter(|(_, b)| {
                    b.state != BufState::Spare || b.pool.is_some_and(|p| w.pools[p].alive)
                })
                .map(|(i, _)| i)
                .collect()
        });
        Self::pick(r, &v).map(|i| v[i])
    }

    fn add_buf(&self, h: *mut upnvme_buf, pool: Option<usize>) {
        w(|w| {
            if let Some(b) = w
                .bufs
                .iter_mut()
                .find(|b| b.h == h && b.state != BufState::Freed)
            {
                // A pool handing a spare handle out again.
                assert_eq!(b.state, BufState::Spare, "handle {h:?} handed out twice");
                assert_eq!(b.pool, pool);
                b.state = BufState::Owned;
            } else {
                w.bufs.push(Buf {
                    h,
                    pool,
                    state: BufState::Owned,
                });
            }
        });
    }

    fn step(&mut self, r: &mut Reader<'_>) {
        let action = r.below(26);
        match action {
            0 => self.open(r),
            1 => {
                if r.below(4) == 0 {
                    self.close();
                }
            }
            2 => self.create_pair(r),
            3 => {
                if let Some(p) = self.live_pair(r) {
                    destroy(p);
                }
            }
            4..=8 => self.submit(r),
            9 | 10 => {
                if let Some(p) = self.live_pair(r) {
                    let max = match r.below(4) {
                        0 => 0,
                        1 => u32::MAX,
                        _ => 1 + r.below(4),
                    };
                    process(p, max);
                }
            }
            11 => {
                if let Some(p) = self.live_pair(r) {
                    let q = w(|w| w.pairs[p].q);
                    // SAFETY: a live pair of this thread.
                    let rc = unsafe { capi::upnvme_qpair_ring(q) };
                    check("ring", rc, &[]);
                }
            }
            12 => self.alloc(r),
            13 => {
                if let Some(b) = self.buf_in(r, |s| matches!(s, BufState::Owned | BufState::Empty))
                {
                    free_buf(b);
                }
            }
            14 => self.pool_create_destroy(r),
            15 => self.pool_get_put(r),
            16 => self.misuse(r),
            17 => self.split(r),
            18 => self.admin(r),
            19 => {
                if !self.ctrl.is_null() {
                    // SAFETY: the live controller.
                    let rc = unsafe { capi::upnvme_ctrl_reset(self.ctrl) };
                    check("ctrl_reset", rc, &DEFINED);
                }
            }
            20 | 21 => self.fault(r),
            22 => {
                self.m.release_delayed();
            }
            23 => self.events(r),
            _ => self.info(r),
        }
        self.check_pairs();
        let stale: Vec<String> = self
            .m
            .take_violations()
            .into_iter()
            .filter(|v| v.contains("does not exist"))
            .collect();
        assert!(stale.is_empty(), "doorbell of a deleted queue: {stale:?}");
    }

    /// `upnvme_qpair_in_flight` against the books; a pair with nothing in
    /// flight hands its callback-less commands' buffers back.
    fn check_pairs(&self) {
        let pairs: Vec<(usize, *mut upnvme_qpair)> = w(|w| {
            w.pairs
                .iter()
                .enumerate()
                .filter(|(_, p)| p.alive)
                .map(|(i, p)| (i, p.q))
                .collect()
        });
        for (i, q) in pairs {
            // SAFETY: a live pair.
            let n = unsafe { capi::upnvme_qpair_in_flight(q) };
            w(|w| {
                let cb = w
                    .subs
                    .iter()
                    .filter(|s| s.pair == i && s.accepted && !s.null_cb && s.calls == 0)
                    .count() as u32;
                let nocb = w
                    .subs
                    .iter()
                    .filter(|s| s.pair == i && s.accepted && s.null_cb)
                    .count() as u32;
                assert!(
                    cb <= n && n <= cb + nocb,
                    "pair {i}: in_flight {n}, callbacks due {cb}, callback-less {nocb}"
                );
                if n == 0 {
                    for s in w.subs.iter_mut().filter(|s| s.pair == i && s.null_cb) {
                        // Done: no longer counted as possibly in flight.
                        s.accepted = false;
                    }
                    for b in &mut w.bufs {
                        if b.state == BufState::NoCb(i) {
                            assert!(!in_flight_flag(b.h), "pair {i} idle, its buffer in flight");
                            b.state = held_state(b.h);
                        }
                    }
                }
            });
        }
    }

    fn open(&mut self, r: &mut Reader<'_>) {
        if !self.ctrl.is_null() {
            return;
        }
        let mut o = ctrl::upnvme_ctrl_opts::default();
        // SAFETY: `o` is valid for its size.
        let rc = unsafe {
            capi::upnvme_ctrl_opts_init(&mut o, std::mem::size_of::<ctrl::upnvme_ctrl_opts>())
        };
        assert_eq!(rc, UPNVME_OK);
        o.shadow_doorbells = r.bool();
        o.io_queues = r.below(5) as u16;
        o.admin_timeout_ms = 1 + r.below(20);
        let clean = self.m.pending_faults().is_empty() && !self.m.is_unplugged();
        let mut out = std::ptr::null_mut();
        // SAFETY: a NUL-terminated address, valid options and out pointer.
        let rc = unsafe { capi::upnvme_ctrl_open(c"model".as_ptr(), &o, &mut out) };
        check("ctrl_open", rc, &DEFINED);
        if rc == UPNVME_OK {
            assert!(!out.is_null());
            self.ctrl = out;
        } else {
            assert!(out.is_null(), "a failed open left a handle");
            assert!(!clean, "open failed on a healthy model: {}", last_error());
        }
    }

    fn close(&mut self) {
        if self.ctrl.is_null() {
            return;
        }
        // SAFETY: the live controller, given up (no call on it running).
        let rc = unsafe { capi::upnvme_ctrl_close(self.ctrl) };
        check("ctrl_close", rc, &DEFINED);
        self.ctrl = std::ptr::null_mut();
    }

    fn create_pair(&mut self, r: &mut Reader<'_>) {
        if self.ctrl.is_null() || w(|w| w.pairs.len()) >= MAX_PAIRS {
            return;
        }
        let mut o = upnvme_qpair_opts::default();
        // SAFETY: `o` is valid for its size.
        let rc = unsafe {
            capi::upnvme_qpair_opts_init(&mut o, std::mem::size_of::<upnvme_qpair_opts>())
        };
        assert_eq!(rc, UPNVME_OK);
        o.entries = match r.below(6) {
            0 => 0,
            1 => 2,
            2 => r.below(80),
            _ => 2 + r.below(10),
        };
        o.shadow_doorbells = r.bool();
        o.reap_on_submit = r.bool();
        o.sq_announce_each_command = r.bool();
        o.delay_doorbell = r.bool();
        o.command_timeout_ms = match r.below(4) {
            0 => 1 + r.below(20),
            1 => u32::MAX,
            _ => 0,
        };
        let mut out = std::ptr::null_mut();
        // SAFETY: the live controller; valid options and out pointer.
        let rc = unsafe { capi::upnvme_qpair_create(self.ctrl, &o, &mut out) };
        check("qpair_create", rc, &DEFINED);
        if rc == UPNVME_OK {
            // SAFETY: the new live pair; a plain read of its queue ID.
            let qid = unsafe { (*out).0.qp.qid() };
            w(|w| {
                w.pairs.push(Pair {
                    q: out,
                    alive: true,
                    qid,
                })
            });
        } else {
            assert!(out.is_null());
        }
    }

    fn submit(&mut self, r: &mut Reader<'_>) {
        let Some(pair) = self.live_pair(r) else {
            return;
        };
        let lba = w(|w| w.lba);
        let nsid = match r.below(16) {
            0 => 0,
            1 => 2,
            2 => u32::MAX,
            3 => 3,
            _ => 1,
        };
        let slba = match r.below(8) {
            0 => r.u64(),
            1 => NS_BLOCKS - 1,
            _ => u64::from(r.below(NS_BLOCKS as u32)),
        };
        let blocks = match r.below(8) {
            0 => r.u32(),
            1 => 0,
            2 | 3 => 1 + r.below(8),
            _ => 1,
        };
        let flags = match r.below(4) {
            0 => Some(r.u8() as u32 & 0x7),
            _ => None,
        };
        let op = match r.below(10) {
            0..=2 => Op::Read {
                slba,
                blocks,
                flags,
            },
            3 | 4 => Op::Write {
                slba,
                blocks,
                flags,
            },
            5 => Op::Flush,
            6 => Op::WriteZeroes {
                slba,
                blocks,
                deallocate: r.bool(),
            },
            7 if r.bool() => Op::Deallocate,
            7 => Op::Copy { sdlba: slba },
            8 => Op::Compare { slba, blocks },
            _ if r.bool() => Op::Verify { slba, blocks },
            _ => Op::WriteUncorrectable { slba, blocks },
        };
        // One in four of the commands that have an `_ext` form goes through it.
        let ext = if matches!(
            op,
            Op::Read { .. }
                | Op::Write { .. }
                | Op::Compare { .. }
                | Op::Verify { .. }
                | Op::WriteZeroes { .. }
        ) && r.below(4) == 0
        {
            Some(self.ext_spec(r, blocks))
        } else {
            None
        };
        // Namespace 2, where the model has it, is the one with metadata.
        let nsid = if ext.is_some() && r.bool() { 2 } else { nsid };
        let cb = match r.below(8) {
            0 => Cb::Resubmit,
            1 => Cb::TryDestroy,
            2 => Cb::Nested(r.below(3)),
            3 => Cb::FreeBuf,
            _ => Cb::Record,
        };
        let null_cb = r.below(8) == 0;
        // The buffer: mostly one the harness holds, sometimes one the API
        // must refuse (in flight, put back into its live pool, kept).
        let buf = match r.below(8) {
            0 => None,
            1 => self.buf_in(r, |s| {
                matches!(s, BufState::InFlight(_) | BufState::Spare | BufState::Empty)
            }),
            _ => self.buf_in(r, |s| s == BufState::Owned),
        };
        let buf = match (buf, op) {
            (None, Op::Read { .. } | Op::Write { .. } | Op::Compare { .. }) if r.below(4) != 0 => {
                // Fill with a new buffer of about the right size.
                self.alloc_len(lba as usize * (blocks.clamp(1, 8) as usize))
            }
            (b, _) => b,
        };
        let ranges = if matches!(op, Op::Deallocate) {
            let n = match r.below(8) {
                0 => 0,
                1 => 257,
                _ => 1 + r.below(4) as usize,
            };
            let v: Vec<upnvme_range> = (0..n)
                .map(|_| upnvme_range {
                    slba: u64::from(r.below(NS_BLOCKS as u32 + 4)),
                    blocks: r.below(20),
                })
                .collect();
            if n == 0 && r.bool() {
                None
            } else {
                let at = if r.bool() {
                    let off = r.below(64) as usize;
                    let need = off + n * std::mem::size_of::<upnvme_range>();
                    self.buf_in(r, |s| s == BufState::Owned)
                        .filter(|&b| {
                            w(|w| {
                                // SAFETY: a live handle.
                                (unsafe { capi::upnvme_buf_len(w.bufs[b].h) }) >= need
                            })
                        })
                        .map(|b| (b, off))
                } else {
                    None
                };
                Some((v, at))
            }
        } else {
            None
        };
        // A Write's or Compare's data is the harness's to fill (ASan sees a stale one).
        if let (Some(b), Op::Write { .. } | Op::Compare { .. }) = (buf, op)
            && w(|w| w.bufs[b].state) == BufState::Owned
        {
            let h = w(|w| w.bufs[b].h);
            // SAFETY: a live handle the harness holds, with memory of its
            // length.
            unsafe { std::ptr::write_bytes(data_of(h), 0xa5, capi::upnvme_buf_len(h)) };
        }
        // Copy's source ranges: mostly a few, of namespace 1 (SNSID 0 or 1),
        // of namespace 2 (a cross-namespace Copy; a metadata format, so
        // the model fails it) or of one that may not exist; sometimes none,
        // a NULL array or more than one command carries.
        let copies = if let Op::Copy { .. } = op {
            let n = match r.below(8) {
                0 => 0,
                1 => 129,
                _ => 1 + r.below(4) as usize,
            };
            (n != 0 || r.bool()).then(|| {
                (0..n)
                    .map(|_| qpair::upnvme_copy_range {
                        slba: u64::from(r.below(NS_BLOCKS as u32 + 4)),
                        blocks: r.below(20),
                        snsid: match r.below(8) {
                            0 => 1,
                            1 => 2,
                            2 => r.below(5),
                            _ => 0,
                        },
                    })
                    .collect()
            })
        } else {
            None
        };
        submit(pair, nsid, op, buf, cb, null_cb, ranges, copies, ext);
    }

    /// An `upnvme_io_ext`: mostly well-formed, sometimes NULL, short, with
    /// unknown bits, a metadata buffer the API must refuse (in flight, put
    /// back, kept) or none.
    fn ext_spec(&self, r: &mut Reader<'_>, blocks: u32) -> ExtSpec {
        let full = std::mem::size_of::<qpair::upnvme_io_ext>() as u32;
        let null = r.below(8) == 0;
        let size = match r.below(8) {
            0 => r.below(full + 8),
            _ => full,
        };
        let flags = if r.below(4) == 0 {
            r.u8() as u32 & 0x7
        } else {
            0
        };
        let pi = match r.below(6) {
            0..=2 => 0,
            3 => r.u8() as u32 & 0x3f,
            4 => {
                capi::UPNVME_PI_PRACT | capi::UPNVME_PI_CHECK_GUARD | capi::UPNVME_PI_CHECK_REF_TAG
            }
            _ => capi::UPNVME_PI_CHECK_GUARD | capi::UPNVME_PI_CHECK_REF_TAG,
        };
        let md = match r.below(8) {
            0 | 1 => None,
            2 => self.buf_in(r, |s| {
                matches!(s, BufState::InFlight(_) | BufState::Spare | BufState::Empty)
            }),
            3 | 4 => self.buf_in(r, |s| s == BufState::Owned),
            _ => self.alloc_len(8 * blocks.clamp(1, 8) as usize),
        };
        let (ref_tag, app_tag, app_tag_mask) = if r.below(4) == 0 {
            (r.u64(), r.u16(), r.u16())
        } else {
            (0, 0, 0)
        };
        ExtSpec {
            null,
            size,
            flags,
            pi,
            md,
            ref_tag,
            app_tag,
            app_tag_mask,
        }
    }

    /// A new buffer of `len` bytes (when the controller is open).
    fn alloc_len(&self, len: usize) -> Option<usize> {
        if self.ctrl.is_null() || w(|w| w.bufs.len()) >= MAX_BUFS {
            return None;
        }
        let mut out = std::ptr::null_mut();
        // SAFETY: the live controller; a valid out pointer.
        let rc = unsafe { capi::upnvme_buf_alloc(self.ctrl, len, &mut out) };
        check("buf_alloc", rc, &[UPNVME_EINVAL, UPNVME_ENOMEM]);
        if rc != UPNVME_OK {
            assert!(out.is_null());
            return None;
        }
        // SAFETY: the new handle.
        let n = unsafe { capi::upnvme_buf_len(out) };
        assert!(n >= len && n % 4096 == 0, "buffer of {n} bytes for {len}");
        self.add_buf(out, None);
        Some(w(|w| w.bufs.len() - 1))
    }

    fn alloc(&mut self, r: &mut Reader<'_>) {
        let len = match r.below(8) {
            0 => 0,
            1 => r.u32() as usize % (1 << 20),
            _ => 1 + r.below(16384) as usize,
        };
        self.alloc_len(len);
    }

    fn pool_create_destroy(&mut self, r: &mut Reader<'_>) {
        let live: Vec<usize> = w(|w| {
            w.pools
                .iter()
                .enumerate()
                .filter(|(_, p)| p.alive)
                .map(|(i, _)| i)
                .collect()
        });
        if r.bool() || live.is_empty() {
            if self.ctrl.is_null() || w(|w| w.pools.len()) >= MAX_POOLS {
                return;
            }
            let len = match r.below(4) {
                0 => 0,
                _ => 1 + r.below(9000) as usize,
            };
            let count = r.below(6) as usize;
            let mut out = std::ptr::null_mut();
            // SAFETY: the live controller; a valid out pointer.
            let rc = unsafe { capi::upnvme_pool_create(self.ctrl, len, count, &mut out) };
            check("pool_create", rc, &[UPNVME_EINVAL, UPNVME_ENOMEM]);
            if rc == UPNVME_OK {
                w(|w| {
                    w.pools.push(Pool {
                        p: out,
                        alive: true,
                    })
                });
            }
            return;
        }
        let p = live[r.below(live.len() as u32) as usize];
        let pp = w(|w| {
            w.pools[p].alive = false;
            w.pools[p].p
        });
        // SAFETY: a live pool, given up.
        unsafe { capi::upnvme_pool_destroy(pp) };
        // Its spare handles are gone; those handed out stay valid.
        w(|w| {
            for b in w.bufs.iter_mut().filter(|b| b.pool == Some(p)) {
                if b.state == BufState::Spare {
                    b.state = BufState::Freed;
                }
            }
        });
    }

    fn pool_get_put(&mut self, r: &mut Reader<'_>) {
        let live: Vec<usize> = w(|w| {
            w.pools
                .iter()
                .enumerate()
                .filter(|(_, p)| p.alive)
                .map(|(i, _)| i)
                .collect()
        });
        let Some(i) = Self::pick(r, &live) else {
            return;
        };
        let p = live[i];
        let pp = w(|w| w.pools[p].p);
        if r.bool() {
            // SAFETY: a live pool.
            let avail = unsafe { capi::upnvme_pool_available(pp) };
            // SAFETY: a live pool.
            let h = unsafe { capi::upnvme_pool_get(pp) };
            if h.is_null() {
                assert_eq!(avail, 0, "pool_get NULL with {avail} available");
                let _ = last_error();
            } else {
                assert!(avail > 0);
                assert!(!data_of(h).is_null() && !in_flight_flag(h));
                self.add_buf(h, Some(p));
            }
            return;
        }
        // Put: a handle the harness holds, this pool's or not, or one the
        // API must refuse.
        let Some(b) = self.buf_in(r, |s| {
            matches!(
                s,
                BufState::Owned | BufState::Empty | BufState::InFlight(_) | BufState::Spare
            )
        }) else {
            return;
        };
        let (h, state, own) = w(|w| (w.bufs[b].h, w.bufs[b].state, w.bufs[b].pool == Some(p)));
        // SAFETY: a live pool; a live handle (a spare one only while its
        // pool lives).
        let rc = unsafe { capi::upnvme_pool_put(pp, h) };
        check("pool_put", rc, &[UPNVME_EBUSY, UPNVME_EINVAL]);
        let want = match state {
            BufState::InFlight(_) => UPNVME_EBUSY,
            BufState::Owned if own => UPNVME_OK,
            _ => UPNVME_EINVAL,
        };
        assert_eq!(rc, want, "pool_put of a {state:?} handle (own pool: {own})");
        if rc == UPNVME_OK {
            w(|w| w.bufs[b].state = BufState::Spare);
            // SAFETY: the handle lives in its pool (a stale pointer the
            // library promises to recognise).
            assert!(data_of(h).is_null() && unsafe { capi::upnvme_buf_len(h) } == 0);
        }
    }

    /// Uses of handles the API promises to refuse.
    fn misuse(&mut self, r: &mut Reader<'_>) {
        let Some(b) = self.buf_in(r, |s| {
            matches!(s, BufState::InFlight(_) | BufState::Spare | BufState::Empty)
        }) else {
            return;
        };
        let (h, state) = w(|w| (w.bufs[b].h, w.bufs[b].state));
        w(|w| {
            note(
                w,
                format!("misuse of {state:?}")
                    .split('(')
                    .next()
                    .unwrap_or(""),
            )
        });
        match r.below(3) {
            0 => {
                // SAFETY: a live handle (spare: while its pool lives).
                let rc = unsafe { capi::upnvme_buf_free(h) };
                match state {
                    BufState::InFlight(_) => assert_eq!(rc, UPNVME_EBUSY, "free in flight"),
                    BufState::Spare => assert_eq!(rc, UPNVME_EINVAL, "free of a spare handle"),
                    _ => {
                        // Empty: freeing it is its documented end.
                        assert_eq!(rc, UPNVME_OK, "free of an empty handle");
                        w(|w| w.bufs[b].state = BufState::Freed);
                    }
                }
            }
            1 => {
                let mut pieces = [std::ptr::null_mut(); 4];
                let mut count = 0usize;
                // SAFETY: a live handle; `pieces` holds 4; `count` valid.
                let rc =
                    unsafe { capi::upnvme_buf_split(h, 4096, pieces.as_mut_ptr(), 4, &mut count) };
                let want = match state {
                    BufState::InFlight(_) => UPNVME_EBUSY,
                    _ => UPNVME_EINVAL,
                };
                assert_eq!(rc, want, "split of a {state:?} handle: {}", last_error());
            }
            _ => {
                if state == BufState::Spare {
                    // SAFETY: a handle back in its live pool.
                    assert!(data_of(h).is_null() && unsafe { capi::upnvme_buf_len(h) } == 0);
                    // SAFETY: as above.
                    assert_eq!(unsafe { capi::upnvme_buf_iova(h) }, 0);
                } else if state == BufState::Empty {
                    // SAFETY: a live handle.
                    assert_eq!(unsafe { capi::upnvme_buf_len(h) }, 0);
                } else {
                    // In flight: its address stays readable (not its data).
                    let _ = data_of(h);
                }
            }
        }
    }

    fn split(&mut self, r: &mut Reader<'_>) {
        let Some(b) = self.buf_in(r, |s| s == BufState::Owned) else {
            return;
        };
        let piece = match r.below(4) {
            0 => 0,
            _ => 512 * (1 + r.below(16) as usize),
        };
        let cap = r.below(12) as usize;
        let h = w(|w| w.bufs[b].h);
        // SAFETY: a live handle.
        let len = unsafe { capi::upnvme_buf_len(h) };
        let mut pieces = vec![std::ptr::null_mut(); cap];
        let mut count = usize::MAX;
        // SAFETY: a live handle the harness holds; `pieces` valid for `cap`
        // writes; `count` valid.
        let rc = unsafe { capi::upnvme_buf_split(h, piece, pieces.as_mut_ptr(), cap, &mut count) };
        check("buf_split", rc, &[UPNVME_EINVAL]);
        if rc != UPNVME_OK {
            assert!(
                !data_of(h).is_null(),
                "a refused split left the buffer empty"
            );
            return;
        }
        assert_eq!(count, len.div_ceil(piece));
        w(|w| w.bufs[b].state = BufState::Freed);
        let mut total = 0;
        for &p in &pieces[..count] {
            // SAFETY: a new handle.
            total += unsafe { capi::upnvme_buf_len(p) };
            self.add_buf(p, None);
        }
        assert_eq!(total, len);
    }

    fn admin(&mut self, r: &mut Reader<'_>) {
        if self.ctrl.is_null() {
            return;
        }
        let mut cmd = upnvme_admin_cmd {
            timeout_ms: r.below(10),
            ..Default::default()
        };
        let mut len = 0usize;
        let mut expect = None;
        match r.below(8) {
            0 | 1 => {
                cmd.opcode = 0x06; // Identify Controller
                cmd.cdw10 = 1;
                len = if r.below(4) == 0 {
                    r.below(4096) as usize
                } else {
                    4096
                };
            }
            2 => {
                cmd.opcode = 0x0a; // Get Features
                cmd.cdw10 = r.below(16);
            }
            3 => {
                cmd.opcode = 0x02; // Get Log Page, SMART, 512 bytes
                cmd.nsid = u32::MAX;
                cmd.cdw10 = 0x02 | (127 << 16);
                len = 512;
            }
            4 => {
                // Commands the library owns: refused.
                cmd.opcode = [0x01, 0x05, 0x0c, 0x7c][r.below(4) as usize];
                expect = Some(UPNVME_EINVAL);
            }
            5 => {
                cmd.opcode = 0x06;
                cmd.rsvd = [1, 0, 0];
                len = 4096;
                expect = Some(UPNVME_EINVAL);
            }
            _ => {
                cmd.opcode = r.u8();
                cmd.nsid = r.u32();
                cmd.cdw10 = r.u32();
                cmd.cdw11 = r.u32();
                len = r.below(8193) as usize;
            }
        }
        let null_data = len > 0 && r.below(8) == 0;
        if null_data {
            expect = Some(UPNVME_EINVAL);
        }
        // The data: the harness's memory, or a buffer's DMA memory.
        let mut own = vec![0u8; len];
        let in_buf = if len > 0 && r.bool() {
            self.buf_in(r, |s| s == BufState::Owned).and_then(|b| {
                let h = w(|w| w.bufs[b].h);
                // SAFETY: a live handle.
                (unsafe { capi::upnvme_buf_len(h) } >= len).then_some(h)
            })
        } else {
            None
        };
        let data: *mut c_void = if null_data {
            std::ptr::null_mut()
        } else if let Some(h) = in_buf {
            data_of(h).cast()
        } else if len == 0 {
            std::ptr::null_mut()
        } else {
            own.as_mut_ptr().cast()
        };
        let mut cpl = upnvme_admin_cpl::default();
        let cplp: *mut upnvme_admin_cpl = if r.below(4) == 0 {
            std::ptr::null_mut()
        } else {
            &mut cpl
        };
        // SAFETY: the live controller; `cmd` valid; `data` valid for `len`
        // reads and writes (or NULL, which the library must refuse when
        // `len` is not 0); `cplp` NULL or valid.
        let rc = unsafe { capi::upnvme_ctrl_admin_passthru(self.ctrl, &cmd, data, len, cplp) };
        check(
            &format!("admin_passthru {:#x}", cmd.opcode),
            rc,
            &[
                UPNVME_EIO,
                UPNVME_EINVAL,
                UPNVME_ECANCELED,
                UPNVME_ETIMEDOUT,
                UPNVME_EAGAIN,
                UPNVME_ENODEV,
                UPNVME_ENOTSUP,
                UPNVME_ENOMEM,
            ],
        );
        if let Some(want) = expect {
            assert_eq!(
                rc,
                want,
                "admin_passthru {cmd:?} len {len}: {}",
                last_error()
            );
        }
    }

    fn fault(&mut self, r: &mut Reader<'_>) {
        if self.m.pending_faults().len() >= 6 {
            return;
        }
        let qid = match self.live_pair(r) {
            Some(p) if r.below(4) != 0 => w(|w| w.pairs[p].qid),
            _ => 0,
        };
        let on = match r.below(8) {
            0 => Match::Next,
            1 => Match::Nth(u64::from(r.below(32))),
            _ => Match::Queue(qid),
        };
        let f = match r.below(16) {
            0 | 1 => Fault::DropCompletion(on),
            2..=4 => Fault::DelayCompletion {
                on,
                doorbells: if r.bool() { None } else { Some(r.below(4)) },
            },
            5 | 6 => Fault::DuplicateCompletion(on),
            7 => Fault::CorruptCid { on, xor: r.u16() },
            8 => Fault::BadSqHead { on, sqhd: r.u16() },
            9 => Fault::WrongPhase(on),
            10..=12 => Fault::Status {
                on,
                status: Status::new(r.below(8) as u8, r.u8()),
            },
            13 => Fault::FatalOn(on),
            14 if r.below(4) == 0 => Fault::UnplugOn(on),
            _ => Fault::Status {
                on,
                status: Status::ABORT_REQUESTED,
            },
        };
        self.m.inject(f);
    }

    fn events(&mut self, r: &mut Reader<'_>) {
        if self.ctrl.is_null() {
            return;
        }
        if r.bool() {
            self.m.raise_async_event(r.below(8) as u8, r.u8(), r.u8());
            return;
        }
        let cap = r.below(5);
        let mut ev = [upnvme_async_event::default(); 4];
        let p = if cap == 0 && r.bool() {
            std::ptr::null_mut()
        } else {
            ev.as_mut_ptr()
        };
        let cap = cap.min(4);
        // SAFETY: the live controller; `p` valid for `cap` writes (NULL
        // only with 0).
        let rc = unsafe { capi::upnvme_ctrl_poll_async_events(self.ctrl, p, cap) };
        check("poll_async_events", rc.min(0), &DEFINED);
        assert!(rc <= cap as c_int, "{rc} events for cap {cap}");
    }

    fn info(&mut self, r: &mut Reader<'_>) {
        if self.ctrl.is_null() {
            return;
        }
        let nsid = r.below(4);
        let mut info = upnvme_ns_info::default();
        // SAFETY: the live controller; `info` valid.
        let rc = unsafe { capi::upnvme_ns_get_info(self.ctrl, nsid, &mut info) };
        check("ns_get_info", rc, &[UPNVME_EINVAL, UPNVME_ENODEV]);
        let mut ids = [0u32; 2];
        // SAFETY: the live controller; `ids` valid for 2 writes.
        let n = unsafe { capi::upnvme_ctrl_namespaces(self.ctrl, ids.as_mut_ptr(), 2) };
        check("ctrl_namespaces", n.min(0), &[UPNVME_EINVAL, UPNVME_ENODEV]);
        let mut ci = ctrl::upnvme_ctrl_info::default();
        let size = r.below(std::mem::size_of::<ctrl::upnvme_ctrl_info>() as u32 + 8) as usize;
        let size = size.min(std::mem::size_of::<ctrl::upnvme_ctrl_info>());
        // SAFETY: `ci` valid for `size` (at most its size) bytes.
        let rc = unsafe { capi::upnvme_ctrl_get_info_sized(self.ctrl, &mut ci, size) };
        check("ctrl_get_info", rc, &[UPNVME_EINVAL]);
        // SAFETY: the live controller.
        let _ = unsafe { capi::upnvme_ctrl_max_transfer(self.ctrl) };
        // SAFETY: the live controller.
        let _ = unsafe { capi::upnvme_ctrl_max_queue_entries(self.ctrl) };
    }

    /// End of input: faults off, a reset, every pair drained and destroyed
    /// (after a close when its commands cannot complete otherwise); every
    /// accepted command's callback ran exactly once; everything freed.
    fn finish(mut self) {
        self.m.clear_faults();
        self.m.release_delayed();
        let live = |_: &()| -> Vec<usize> {
            w(|w| {
                w.pairs
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.alive)
                    .map(|(i, _)| i)
                    .collect()
            })
        };
        for round in 0..3 {
            if round == 1 && !self.ctrl.is_null() && !self.m.is_unplugged() {
                // SAFETY: the live controller.
                let rc = unsafe { capi::upnvme_ctrl_reset(self.ctrl) };
                check("ctrl_reset", rc, &DEFINED);
            }
            for p in live(&()) {
                process(p, 0);
            }
            self.check_pairs();
        }
        for p in live(&()) {
            if destroy(p) == UPNVME_EBUSY {
                // Commands that can still complete but did not: close the
                // controller, so that they cannot, and destroy ends them.
                self.close();
                assert_eq!(
                    destroy(p),
                    UPNVME_OK,
                    "destroy after close: {}",
                    last_error()
                );
            }
        }
        w(|w| {
            for (i, s) in w.subs.iter().enumerate() {
                if s.accepted && !s.null_cb {
                    assert_eq!(s.calls, 1, "submission {i}'s callback ({:?})", s.cb);
                }
            }
        });
        let held: Vec<usize> = w(|w| {
            w.bufs
                .iter()
                .enumerate()
                .filter(|(_, b)| matches!(b.state, BufState::Owned | BufState::Empty))
                .map(|(i, _)| i)
                .collect()
        });
        for b in held {
            free_buf(b);
        }
        let pools: Vec<*mut upnvme_pool> =
            w(|w| w.pools.iter().filter(|p| p.alive).map(|p| p.p).collect());
        for p in pools {
            // SAFETY: a live pool, given up.
            unsafe { capi::upnvme_pool_destroy(p) };
        }
        let left = w(|w| {
            w.bufs
                .iter()
                .filter(|b| !matches!(b.state, BufState::Freed | BufState::Spare))
                .map(|b| b.state)
                .collect::<Vec<_>>()
        });
        assert!(left.is_empty(), "handles never settled: {left:?}");
        self.close();
        assert_eq!(
            self.m.dma_faults(),
            0,
            "DMA faults: {:?}",
            self.m.dma_fault_log()
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader::new(data);
    let lba = if r.bool() { 4096 } else { 512 };
    let mut oncs = ModelConfig::default().oncs;
    if r.below(4) == 0 {
        oncs &= !(ModelConfig::ONCS_DSM | ModelConfig::ONCS_WRITE_ZEROES);
    }
    if r.bool() {
        oncs |= ModelConfig::ONCS_COPY;
    }
    if r.bool() {
        oncs |= ModelConfig::ONCS_VERIFY | ModelConfig::ONCS_WRITE_UNCORRECTABLE;
    } else if r.bool() {
        oncs &= !ModelConfig::ONCS_COMPARE;
    }
    // Copy Descriptor Formats: none reported, 0h/1h, or every one (the
    // library then enables 2h/3h through Host Behavior Support).
    let ocfs = [0, 0x3, 0xf][r.below(3) as usize];
    let mut namespaces = vec![NamespaceConfig {
        nsid: 1,
        lba_size: lba,
        blocks: NS_BLOCKS,
        ..NamespaceConfig::default()
    }];
    if r.bool() {
        // Metadata: the plain Read and Write refuse it (ENOTSUP); the
        // `_ext` functions take it, separate or extended, with or without
        // protection information.
        namespaces.push(NamespaceConfig {
            nsid: 2,
            lba_size: 512,
            blocks: NS_BLOCKS,
            ms: 8,
            extended: r.bool(),
            pi_type: r.below(3) as u8,
            ..NamespaceConfig::default()
        });
    }
    let m = ModelController::new(ModelConfig {
        mqes: 2 + r.below(64) as u16,
        max_ioqpairs: 1 + r.below(4) as u16,
        oacs_dbbc: r.bool(),
        vwc: r.bool(),
        oncs,
        ocfs,
        namespaces,
        ..Default::default()
    });
    MODEL.with(|x| *x.borrow_mut() = Some(m.clone()));
    WORLD.with(|x| {
        *x.borrow_mut() = Some(World {
            bufs: Vec::new(),
            pools: Vec::new(),
            pairs: Vec::new(),
            subs: Vec::new(),
            frames: Vec::new(),
            destroying: Vec::new(),
            lba,
            stats: Default::default(),
        })
    });
    let mut h = Harness {
        m,
        ctrl: std::ptr::null_mut(),
    };
    // A controller and a queue pair to start from (later actions close,
    // destroy and make them again).
    h.open(&mut r);
    h.create_pair(&mut r);
    let mut steps = 0;
    while !r.is_empty() && steps < MAX_ACTIONS {
        h.step(&mut r);
        steps += 1;
    }
    h.finish();
    let w = WORLD.with(|x| x.borrow_mut().take());
    if std::env::var_os("UPNVME_FUZZ_DEBUG").is_some_and(|v| v == "1")
        && let Some(w) = w
    {
        eprintln!("capi_sequence: {:?}", w.stats);
    }
    MODEL.with(|x| *x.borrow_mut() = None);
});
