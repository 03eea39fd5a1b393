//! Property tests: SQ/CQ ring state against a simple absolute-counter model,
//! for arbitrary (not only power-of-two) queue sizes.

mod common;

use proptest::prelude::*;
use upnvme_queues::{CqRing, RingError, SqRing};

#[derive(Clone, Debug)]
enum Op {
    Push,
    Commit,
    /// Device reports consumption of `k` more committed entries (clamped).
    Consume(u32),
    /// Device reports an arbitrary SQHD.
    Bogus(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Push),
        2 => Just(Op::Commit),
        2 => (0u32..8).prop_map(Op::Consume),
        1 => any::<u16>().prop_map(Op::Bogus),
    ]
}

/// The reference: absolute (never wrapping) counters; slot = counter % n.
#[derive(Debug)]
struct Model {
    n: u64,
    head: u64,
    committed: u64,
    tail: u64,
}

impl Model {
    fn in_window(&self, sqhd: u16) -> Option<u64> {
        (self.head..=self.committed).find(|abs| abs % self.n == u64::from(sqhd))
    }
}

proptest! {
    #![proptest_config(common::config(512))]

    #[test]
    fn sq_ring_matches_model(n in 2u32..=common::scale(1024) as u32, ops in prop::collection::vec(op(), 0..common::scale(400))) {
        let mut sq = SqRing::new(n).unwrap();
        let mut m = Model { n: u64::from(n), head: 0, committed: 0, tail: 0 };
        for op in ops {
            match op {
                Op::Push => {
                    let got = sq.push();
                    if m.tail - m.head < m.n - 1 {
                        prop_assert_eq!(got, Some((m.tail % m.n) as u16));
                        m.tail += 1;
                    } else {
                        prop_assert_eq!(got, None);
                    }
                }
                Op::Commit => {
                    let got = sq.commit();
                    if m.committed != m.tail {
                        prop_assert_eq!(got, Some((m.tail % m.n) as u16));
                        m.committed = m.tail;
                    } else {
                        prop_assert_eq!(got, None);
                    }
                }
                Op::Consume(k) => {
                    let abs = (m.head + u64::from(k)).min(m.committed);
                    prop_assert_eq!(sq.update_head((abs % m.n) as u16), Ok(()));
                    m.head = abs;
                }
                Op::Bogus(h) => {
                    let r = sq.update_head(h);
                    if u64::from(h) >= m.n {
                        prop_assert!(
                            matches!(r, Err(RingError::SqHeadOutOfRange { .. })),
                            "expected SqHeadOutOfRange, got {:?}", r
                        );
                    } else if let Some(abs) = m.in_window(h) {
                        prop_assert_eq!(r, Ok(()));
                        m.head = abs;
                    } else {
                        prop_assert!(
                            matches!(r, Err(RingError::SqHeadOutsideWindow { .. })),
                            "expected SqHeadOutsideWindow, got {:?}", r
                        );
                    }
                }
            }
            prop_assert_eq!(u64::from(sq.outstanding()), m.tail - m.head);
            prop_assert_eq!(u64::from(sq.free_slots()), m.n - 1 - (m.tail - m.head));
            prop_assert_eq!(sq.is_full(), m.tail - m.head == m.n - 1);
            prop_assert_eq!(u64::from(sq.head()), m.head % m.n);
            prop_assert_eq!(u64::from(sq.tail()), m.tail % m.n);
            prop_assert_eq!(u64::from(sq.committed_tail()), m.committed % m.n);
        }
    }

    /// Every SQHD outside [head, committed tail] is rejected and leaves the
    /// ring unchanged.
    #[test]
    fn sqhd_outside_window_rejected(
        n in 2u32..=common::scale(300) as u32,
        pushes in 0u32..300,
        consumed in 0u32..300,
        extra in 0u32..300,
    ) {
        let mut sq = SqRing::new(n).unwrap();
        // Rotate the ring so the window can straddle the wrap point.
        for _ in 0..(extra % n) {
            sq.push().unwrap();
            sq.commit();
            sq.update_head(sq.tail()).unwrap();
        }
        let pushes = pushes % n; // at most n - 1 fit
        for _ in 0..pushes {
            sq.push().unwrap();
        }
        sq.commit();
        let consumed = consumed % (pushes + 1);
        let start = u32::from(sq.head());
        sq.update_head(((start + consumed) % n) as u16).unwrap();
        let before = sq.clone();
        let head = u32::from(sq.head());
        let window = pushes - consumed;
        for h in 0..n {
            let dist = (h + n - head) % n;
            let mut probe = before.clone();
            let r = probe.update_head(h as u16);
            if dist <= window {
                prop_assert_eq!(r, Ok(()));
            } else {
                prop_assert!(r.is_err());
                prop_assert_eq!(&probe, &before);
            }
        }
    }

    #[test]
    fn cq_ring_phase(n in 2u32..=common::scale(1024) as u32, steps in 0u32..common::scale(5000) as u32) {
        let mut cq = CqRing::new(n).unwrap();
        for i in 1..=u64::from(steps) {
            cq.advance();
            prop_assert_eq!(u64::from(cq.head()), i % u64::from(n));
            prop_assert_eq!(cq.phase(), (i / u64::from(n)) % 2 == 0);
        }
        prop_assert_eq!(cq.commit().is_some(), steps > 0);
    }
}

/// The issue asks for every queue size 2..64 explicitly: wrap at least three
/// times and check head, phase and doorbell values at each step.
#[test]
fn every_small_size_wraps() {
    let max = if cfg!(miri) { 8 } else { 64 };
    for n in 2..=max {
        let mut sq = SqRing::new(n).unwrap();
        let mut cq = CqRing::new(n).unwrap();
        for i in 0..(3 * n + 1) {
            let slot = sq.push().unwrap();
            assert_eq!(u32::from(slot), i % n);
            assert_eq!(sq.commit(), Some(((i + 1) % n) as u16));
            sq.update_head(sq.tail()).unwrap();
            assert_eq!(u32::from(cq.head()), i % n);
            assert_eq!(cq.phase(), (i / n) % 2 == 0);
            cq.advance();
            assert_eq!(cq.commit(), Some(((i + 1) % n) as u16));
        }
    }
}
