//! Property tests: command identifier allocation against a model, and
//! detection of unknown, stale and duplicate completions.

mod common;

use proptest::prelude::*;
use std::collections::HashMap;
use upnvme_queues::{CidError, CidTable};

#[derive(Clone, Debug)]
enum Op {
    Alloc,
    /// Complete the i-th (mod len) command in flight.
    Complete(usize),
    /// Replay the i-th (mod len) previously completed CID (duplicate/stale).
    Replay(usize),
    /// Complete an arbitrary 16-bit CID.
    Random(u16),
    /// Cancel the i-th (mod len) command in flight.
    Cancel(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Alloc),
        3 => any::<usize>().prop_map(Op::Complete),
        2 => any::<usize>().prop_map(Op::Replay),
        2 => any::<u16>().prop_map(Op::Random),
        1 => any::<usize>().prop_map(Op::Cancel),
    ]
}

proptest! {
    #![proptest_config(common::config(512))]

    #[test]
    fn cid_table_detects_bad_completions(
        slots in 1u16..=300,
        ops in prop::collection::vec(op(), 0..common::scale(500)),
    ) {
        let mut t: CidTable = CidTable::new(slots);
        // cid -> slot for commands in flight.
        let mut live: HashMap<u16, u16> = HashMap::new();
        let mut done: Vec<u16> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc => match t.alloc() {
                    Some(c) => {
                        prop_assert!(c.slot < slots);
                        prop_assert_ne!(c.value, 0xffff);
                        prop_assert_eq!(t.slot_of(c.value), c.slot);
                        prop_assert!(live.insert(c.value, c.slot).is_none(), "CID reused while live");
                        prop_assert!(live.values().filter(|&&s| s == c.slot).count() == 1);
                    }
                    None => prop_assert_eq!(live.len(), usize::from(slots)),
                },
                Op::Complete(i) | Op::Cancel(i) if !live.is_empty() => {
                    let mut keys: Vec<u16> = live.keys().copied().collect();
                    keys.sort_unstable();
                    let cid = keys[i % keys.len()];
                    let slot = live.remove(&cid).unwrap();
                    if matches!(op, Op::Complete(_)) {
                        prop_assert_eq!(t.complete(cid), Ok(slot));
                    } else {
                        prop_assert_eq!(t.cancel(slot), Ok(()));
                    }
                    done.push(cid);
                }
                Op::Complete(_) | Op::Cancel(_) => {}
                Op::Replay(i) if !done.is_empty() => {
                    let cid = done[i % done.len()];
                    let r = t.complete(cid);
                    if live.contains_key(&cid) {
                        // The generation wrapped around to the same CID: it
                        // legitimately names the current command.
                        prop_assert_eq!(r, Ok(live.remove(&cid).unwrap()));
                        done.push(cid);
                    } else {
                        prop_assert!(
                            matches!(r, Err(CidError::NotInFlight(_)) | Err(CidError::StaleGeneration { .. })),
                            "replayed CID {:#x} accepted: {:?}", cid, r
                        );
                    }
                }
                Op::Replay(_) => {}
                Op::Random(cid) => {
                    let r = t.complete(cid);
                    match live.remove(&cid) {
                        Some(slot) => {
                            prop_assert_eq!(r, Ok(slot));
                            done.push(cid);
                        }
                        None => prop_assert!(r.is_err()),
                    }
                }
            }
            prop_assert_eq!(t.in_flight() as usize, live.len());
        }
    }
}
