//! Property tests: every parser of device-provided data accepts arbitrary
//! bytes of any length without panicking, and encoders round-trip.

mod common;

use proptest::prelude::*;
use upnvme_queues::{
    AsyncEvent, Cqe, FirmwareSlotLog, IdentifyController, IdentifyNamespace, SmartLog, Sqe, Status,
    parse_error_log, parse_ns_list,
};

proptest! {
    #![proptest_config(common::config(128))]

    #[test]
    fn parsers_never_panic(buf in prop::collection::vec(any::<u8>(), 0..5000)) {
        if let Ok(c) = IdentifyController::parse(&buf) {
            let _ = c.version().to_string();
            prop_assert_eq!(IdentifyController::parse(&c.to_bytes()).map(|x| x.vid), Ok(c.vid));
        } else {
            prop_assert!(buf.len() < 4096);
        }
        if let Ok(ns) = IdentifyNamespace::parse(&buf) {
            let _ = (ns.lba_size(), ns.metadata_size(), ns.size_bytes(), ns.current_lba_format());
            prop_assert!(ns.lbaf.len() <= 64);
            prop_assert_eq!(
                ns.lbaf.len(),
                (usize::from(ns.nlbaf) + 1 + usize::from(ns.nulbaf)).min(64)
            );
            if let Some(s) = ns.lba_size() {
                prop_assert!((512..=1 << 31).contains(&s));
            }
        } else {
            prop_assert!(buf.len() < 4096);
        }
        let ids = parse_ns_list(&buf);
        prop_assert!(ids.len() <= 1024 && !ids.contains(&0));
        let _ = SmartLog::parse(&buf);
        let _ = FirmwareSlotLog::parse(&buf);
        prop_assert!(parse_error_log(&buf).len() <= buf.len() / 64);
    }

    #[test]
    fn cqe_and_status_total(dw: [u32; 4]) {
        let c = Cqe { dw };
        let b = c.to_le_bytes();
        prop_assert_eq!(Cqe::from_le_bytes(&b), c);
        let s = c.status();
        prop_assert_eq!(s, Status(((dw[3] >> 17) & 0x7fff) as u16));
        let _ = s.to_string();
        prop_assert_eq!(
            &Cqe::new(c.dw0(), c.sqhd(), c.sqid(), c.cid(), c.phase(), s).dw[2..],
            &c.dw[2..]
        );
        let _ = AsyncEvent::from_dw0(dw[0]).to_string();
    }

    #[test]
    fn sqe_bytes_roundtrip(dw: [u32; 16]) {
        let s = Sqe { dw };
        prop_assert_eq!(Sqe::from_le_bytes(&s.to_le_bytes()), s);
    }

    #[test]
    fn smart_roundtrip(buf in prop::collection::vec(any::<u8>(), 512)) {
        let s = SmartLog::parse(&buf).unwrap();
        prop_assert_eq!(SmartLog::parse(&s.to_bytes()).unwrap(), s);
    }
}
