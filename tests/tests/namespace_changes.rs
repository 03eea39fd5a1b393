//! Namespaces changed by someone else (another host formats, resizes,
//! detaches or attaches one): the driver enables Namespace Attribute Notices,
//! and `poll_async_events` retires the handles whose geometry no longer
//! holds before a transfer is sized by it; `refresh_namespaces` hands out the
//! new ones (driver/src/namespace_list.rs).

mod common;

use common::{assert_clean, ns, pattern, read_back, run_io, setup};
use upnvme::{Controller, Error, IoCommand, IoData, NamespaceChanges, QueuePairOptions, Reject};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController};

fn two_namespaces() -> (ModelController, Controller<ModelController>) {
    setup(ModelConfig {
        namespaces: vec![ns(1, 512, 4096), ns(2, 512, 4096)],
        ..ModelConfig::default()
    })
}

/// Polls the asynchronous events and returns how many were Namespace
/// Attribute Changed notices.
fn notices(c: &Controller<ModelController>) -> usize {
    c.poll_async_events()
        .unwrap()
        .iter()
        .filter(|e| e.is_namespace_attribute_changed())
        .count()
}

#[test]
fn another_hosts_format_retires_the_handle_before_a_transfer_is_sized_by_it() {
    let (m, mut c) = two_namespaces();
    let old = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Someone else formats namespace 1 to 4 KiB blocks.
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    assert_eq!(notices(&c), 1);
    assert!(old.is_stale(), "the handle still says 512-byte blocks");
    // A Read of one "512-byte" block would now move 4096 bytes.
    let buf = c.alloc_dma(4096).unwrap();
    let refused = qp
        .submit_io(
            IoCommand::Read {
                ns: &old,
                slba: 0,
                blocks: 1,
            },
            IoData::slice(buf, 0, 512),
            1,
        )
        .unwrap_err();
    assert_eq!(refused.reason, Reject::StaleNamespace { nsid: 1 });
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(
        changes,
        NamespaceChanges {
            changed: vec![1],
            ..NamespaceChanges::default()
        }
    );
    let new = c.namespace(1).unwrap().clone();
    assert_eq!((new.lba_size(), new.lba_count()), (4096, 512));
    m.write_namespace_data(1, 3, &pattern(9, 4096));
    let r = run_io(
        &mut qp,
        IoCommand::Read {
            ns: &new,
            slba: 3,
            blocks: 1,
        },
        IoData::buffer(c.alloc_dma(4096).unwrap()),
    );
    assert!(r.result.is_ok(), "{:?}", r.result);
    assert_eq!(
        read_back(r.buffer.as_ref().unwrap(), 4096),
        pattern(9, 4096)
    );
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn an_unchanged_namespace_keeps_its_handle_and_a_later_change_still_retires_it() {
    let (m, mut c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    // Namespace 2 grows; namespace 1 is not touched.
    m.change_namespace(2, Some(ns(2, 512, 8192)));
    assert_eq!(notices(&c), 1);
    assert!(!one.is_stale());
    assert!(two.is_stale(), "its size (NSZE) changed");
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(changes.changed, vec![2]);
    assert!(changes.added.is_empty() && changes.removed.is_empty());
    assert_eq!(c.namespace(2).unwrap().lba_count(), 8192);
    // The application's clone of namespace 1 is the controller's handle
    // still: a change to namespace 1 now retires it.
    assert!(!one.is_stale());
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    assert_eq!(notices(&c), 1, "the notice was re-armed by reading log 04h");
    assert!(one.is_stale());
    assert!(!c.namespace(2).unwrap().is_stale());
    // A refresh with nothing changed changes nothing.
    assert_eq!(c.refresh_namespaces().unwrap().changed, vec![1]);
    assert!(c.refresh_namespaces().unwrap().is_empty());
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_detached_namespace_is_retired_and_a_new_one_listed() {
    let (m, mut c) = two_namespaces();
    let two = c.namespace(2).unwrap().clone();
    m.change_namespace(2, None);
    assert_eq!(notices(&c), 1);
    assert!(two.is_stale());
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(changes.removed, vec![2]);
    assert!(matches!(
        c.namespace(2),
        Err(Error::NoSuchNamespace { nsid: 2, .. })
    ));
    m.change_namespace(2, Some(ns(2, 4096, 1024)));
    assert_eq!(notices(&c), 1);
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(changes.added, vec![2]);
    assert_eq!(c.namespace(2).unwrap().lba_size(), 4096);
    assert!(!c.namespace(1).unwrap().is_stale());
    drop(c);
    assert_clean(&m);
}

/// A change that flips only FLBAS bit 4 (extended LBA) of a namespace
/// without metadata moves no byte of any transfer: the handle stays
/// current. Before, the layout was compared whatever MS was, and the
/// handle was retired (the namespace_changes fuzz target found it: the
/// namespace deleted and created again with the same NGUID and geometry
/// but the bit set).
#[test]
fn a_layout_bit_without_metadata_keeps_the_handle() {
    let cfg = |extended| upnvme_tests::NamespaceConfig {
        nguid: [0xa1; 16],
        extended,
        ..ns(1, 512, 4096)
    };
    let (m, c) = setup(ModelConfig {
        namespaces: vec![cfg(false)],
        ..ModelConfig::default()
    });
    let one = c.namespace(1).unwrap().clone();
    assert_eq!(one.identify().flbas & 0x10, 0);
    m.change_namespace(1, Some(cfg(true)));
    assert_eq!(notices(&c), 1);
    assert!(!one.is_stale(), "only FLBAS bit 4 changed, and MS is 0");
    // Metadata does make the layout count: 8 bytes, extended, is another
    // format.
    m.change_namespace(
        1,
        Some(upnvme_tests::NamespaceConfig { ms: 8, ..cfg(true) }),
    );
    assert_eq!(notices(&c), 1);
    assert!(one.is_stale());
    drop(c);
    assert_clean(&m);
}

/// A namespace deleted and created again under its NSID with the same
/// geometry is another namespace (its NGUID differs): the old handle is
/// retired, whether a notice or only `refresh_namespaces` finds it. Before,
/// the geometry alone was compared, and a handle of the deleted namespace
/// went on reading and writing its successor (a review found it).
#[test]
fn a_namespace_deleted_and_created_again_with_the_same_geometry_retires_its_handle() {
    let with_nguid = |nsid, id: u8| upnvme_tests::NamespaceConfig {
        nguid: [id; 16],
        ..ns(nsid, 512, 4096)
    };
    let (m, mut c) = setup(ModelConfig {
        namespaces: vec![with_nguid(1, 0xa1), with_nguid(2, 0xa2)],
        ..ModelConfig::default()
    });
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    assert_eq!(one.identify().nguid, [0xa1; 16]);
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // Namespace 1 is re-created by another host, same size and format: the
    // notice retires its handle before a write reaches the new namespace.
    m.change_namespace(1, Some(with_nguid(1, 0xb1)));
    assert_eq!(notices(&c), 1);
    assert!(one.is_stale(), "another namespace now has NSID 1");
    assert!(!two.is_stale());
    let w = qp
        .submit_io(
            IoCommand::Write {
                ns: &one,
                slba: 0,
                blocks: 1,
            },
            IoData::buffer(c.alloc_dma(512).unwrap()),
            1,
        )
        .unwrap_err();
    assert_eq!(w.reason, Reject::StaleNamespace { nsid: 1 });
    // A change of namespace 1 that keeps its identity and geometry (another
    // host formats it to the same format) keeps the handle, as before.
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(changes.changed, vec![1]);
    let one = c.namespace(1).unwrap().clone();
    assert_eq!(one.identify().nguid, [0xb1; 16]);
    m.change_namespace(1, Some(with_nguid(1, 0xb1)));
    assert_eq!(notices(&c), 1);
    assert!(!one.is_stale());
    // Namespace 2 is re-created without the driver polling the events: the
    // refresh finds it by its NGUID and reports it changed.
    m.change_namespace(2, Some(with_nguid(2, 0xb2)));
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(
        changes,
        NamespaceChanges {
            changed: vec![2],
            ..NamespaceChanges::default()
        }
    );
    assert!(two.is_stale());
    let new = c.namespace(2).unwrap().clone();
    assert_eq!(new.identify().nguid, [0xb2; 16]);
    m.write_namespace_data(2, 0, &pattern(3, 512));
    let r = run_io(
        &mut qp,
        IoCommand::Read {
            ns: &new,
            slba: 0,
            blocks: 1,
        },
        IoData::buffer(c.alloc_dma(512).unwrap()),
    );
    assert!(r.result.is_ok(), "{:?}", r.result);
    assert_eq!(read_back(r.buffer.as_ref().unwrap(), 512), pattern(3, 512));
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn notices_are_enabled_again_after_a_reset() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    // A reset sets the features back to their defaults (the model's
    // controller does, as the specification's Controller Level Reset).
    c.reset().unwrap();
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    assert_eq!(notices(&c), 1);
    assert!(one.is_stale());
    drop(c);
    assert_clean(&m);
}

#[test]
fn more_than_1024_changes_re_read_every_namespace() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    m.change_namespace(2, Some(ns(2, 4096, 512)));
    // 1024 more (inactive NSIDs): the list overflows (first entry
    // FFFFFFFFh) and names none of them.
    for nsid in 100..1124 {
        m.change_namespace(nsid, None);
    }
    assert_eq!(notices(&c), 1);
    assert!(two.is_stale(), "found by reading every namespace again");
    assert!(!one.is_stale(), "unchanged");
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_notice_posted_before_a_reset_is_still_handed_out_after_it() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    // The notice completes an Asynchronous Event Request: it sits in the
    // admin CQ when the reset begins, and CC.EN = 0 would forget it.
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    c.reset().unwrap();
    assert!(one.is_stale(), "retired by the reset's own check");
    assert!(!two.is_stale(), "unchanged");
    assert_eq!(notices(&c), 1, "the notice survived the reset");
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_namespace_changed_while_a_reset_had_the_notices_off_is_found() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    // Namespace 1 is formatted when the reset's Identify Controller is
    // fetched: after CC.EN = 0 (features back to defaults, no notices) and
    // before Set Features turns the notices on again. No event is raised.
    m.inject(Fault::ChangeNamespaceOn {
        on: Match::Identify { cns: 1, nsid: 0 },
        nsid: 1,
        to: Some(ns(1, 4096, 512)),
    });
    c.reset().unwrap();
    assert!(m.pending_faults().is_empty(), "the change happened");
    assert!(one.is_stale(), "the reset checked every handle");
    assert!(!two.is_stale(), "unchanged");
    assert_eq!(notices(&c), 1, "the driver announces what it found");
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_namespace_attached_while_a_reset_had_the_notices_off_is_announced() {
    let (m, mut c) = two_namespaces();
    m.change_namespace(2, None);
    assert_eq!(notices(&c), 1);
    assert_eq!(c.refresh_namespaces().unwrap().removed, vec![2]);
    let one = c.namespace(1).unwrap().clone();
    // Namespace 2 is attached again inside the reset, with the notices off:
    // no handle changes, so only the Active Namespace ID list shows it.
    m.inject(Fault::ChangeNamespaceOn {
        on: Match::Identify { cns: 1, nsid: 0 },
        nsid: 2,
        to: Some(ns(2, 512, 1024)),
    });
    c.reset().unwrap();
    assert!(m.pending_faults().is_empty(), "the attach happened");
    assert!(!one.is_stale(), "unchanged");
    assert_eq!(notices(&c), 1, "the driver announces the new namespace");
    assert_eq!(notices(&c), 0, "once");
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(changes.added, vec![2]);
    // Known now: a reset with nothing attached announces nothing.
    c.reset().unwrap();
    assert_eq!(notices(&c), 0, "nothing new after the refresh");
    drop(c);
    assert_clean(&m);
}

#[test]
fn a_changed_namespace_list_read_by_the_application_first_still_retires() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    // The application reads log 04h itself (Retain Asynchronous Event
    // clear): the list the driver reads next is empty.
    let list = c.get_log_page(0x04, 0xffff_ffff, 4096, 0).unwrap();
    assert_eq!(&list[..4], &1u32.to_le_bytes());
    assert_eq!(notices(&c), 1);
    assert!(
        one.is_stale(),
        "an empty list after a notice checks every handle"
    );
    assert!(!two.is_stale(), "unchanged");
    drop(c);
    assert_clean(&m);
}

#[test]
fn after_an_automatic_reset_the_next_event_poll_checks_every_handle() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    // A fatal controller error on the pair's Read: the pair resets the
    // controller itself, and namespace 1 changes inside that reset.
    m.inject(Fault::FatalOn(Match::Opcode {
        qid: qp.qid(),
        opcode: 0x02,
    }));
    m.inject(Fault::ChangeNamespaceOn {
        on: Match::Identify { cns: 1, nsid: 0 },
        nsid: 1,
        to: Some(ns(1, 4096, 512)),
    });
    let failed = qp
        .read_blocking(
            &two,
            0,
            1,
            c.alloc_dma(512).unwrap(),
            std::time::Duration::from_secs(30),
        )
        .unwrap_err();
    assert!(matches!(failed.error, Error::Io { .. }), "{}", failed.error);
    assert_eq!(c.resets(), 1);
    assert!(m.pending_faults().is_empty(), "the change happened");
    assert!(!one.is_stale(), "nothing has checked yet");
    assert_eq!(notices(&c), 1, "the driver announces what it found");
    assert!(
        one.is_stale(),
        "the poll after the reset checked every handle"
    );
    assert!(!two.is_stale(), "unchanged");
    drop((qp, c));
    assert_clean(&m);
}

/// A namespace another host changes while the controller is brought up is
/// never left usable with its old geometry: the notices are enabled before
/// the namespaces are identified, so a change before that is read as it is,
/// and one during the scan raises a notice. (A review found the other order:
/// a change between the scan and the notices raised none, and the handle
/// kept 512-byte blocks on a namespace of 4 KiB blocks for good.)
#[test]
fn a_namespace_changed_during_bring_up_is_not_left_with_its_old_geometry() {
    for (when, what) in [
        // Before the notices are on (the first Get Features is the
        // Asynchronous Event Configuration's).
        (
            Match::Opcode {
                qid: 0,
                opcode: 0x0a,
            },
            "before the notices",
        ),
        // After namespace 1 was identified, while the scan goes on.
        (Match::Identify { cns: 0, nsid: 2 }, "during the scan"),
    ] {
        let m = ModelController::new(ModelConfig {
            namespaces: vec![ns(1, 512, 4096), ns(2, 512, 4096)],
            ..ModelConfig::default()
        });
        m.inject(Fault::ChangeNamespaceOn {
            on: when,
            nsid: 1,
            to: Some(ns(1, 4096, 512)),
        });
        let mut c = common::open(&m, common::opts());
        assert!(m.pending_faults().is_empty(), "{what}: the change happened");
        let one = c.namespace(1).unwrap().clone();
        for _ in 0..3 {
            c.poll_async_events().unwrap();
        }
        assert!(
            one.is_stale() || one.lba_size() == 4096,
            "{what}: namespace 1's handle says {}-byte blocks and is not retired",
            one.lba_size()
        );
        if one.is_stale() {
            c.refresh_namespaces().unwrap();
        }
        assert_eq!(c.namespace(1).unwrap().lba_size(), 4096, "{what}");
    }
}

/// An Asynchronous Event Request the controller ends with an error is posted
/// again when the error is transient (DNR clear): otherwise the notices
/// stopped for good and a namespace another host formatted kept a usable
/// handle of its old geometry. One ended for good (DNR set) makes the poll
/// that reaps it check every handle, as after a reset, so a change it may
/// have carried is still found. (A review found neither.)
#[test]
fn aers_ended_by_an_error_are_posted_again_or_the_handles_checked() {
    use upnvme_tests::Status;
    let aer = Match::Opcode {
        qid: 0,
        opcode: 0x0c,
    };
    let one_aer = || upnvme::ControllerOptions {
        async_events: 1,
        ..common::opts()
    };
    let noticed = |c: &Controller<ModelController>| {
        (0..3).any(|_| {
            c.poll_async_events()
                .unwrap()
                .iter()
                .any(|e| e.is_namespace_attribute_changed())
        })
    };
    // Transient: the AER the reset posts ends with Internal Error; the poll
    // that reaps it posts it again, and the change after that is noticed.
    let m = ModelController::new(ModelConfig {
        namespaces: vec![ns(1, 512, 4096)],
        ..ModelConfig::default()
    });
    let c = common::open(&m, one_aer());
    m.inject(Fault::Status {
        on: aer,
        status: Status::INTERNAL_ERROR,
    });
    c.reset().unwrap();
    c.poll_async_events().unwrap();
    assert_eq!(m.outstanding_async_requests(), 1, "re-posted");
    let one = c.namespace(1).unwrap().clone();
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    assert!(
        noticed(&c) && one.is_stale(),
        "transient: {}",
        one.lba_size()
    );
    // For good: the AER bring-up posts ends with DNR set; a change made
    // before the poll that reaps it is found by checking every handle.
    let m = ModelController::new(ModelConfig {
        namespaces: vec![ns(1, 512, 4096)],
        ..ModelConfig::default()
    });
    m.inject(Fault::Status {
        on: aer,
        status: Status::INTERNAL_ERROR.with_dnr(),
    });
    let c = common::open(&m, one_aer());
    let one = c.namespace(1).unwrap().clone();
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    assert!(noticed(&c) && one.is_stale(), "DNR: {}", one.lba_size());
    assert_eq!(m.outstanding_async_requests(), 0, "not posted again");
}

/// Polls three times; how many Namespace Attribute Changed events came out.
fn notices_over_three_polls(c: &Controller<ModelController>) -> usize {
    (0..3).map(|_| notices(c)).sum()
}

/// A read of the Changed Namespace List that fails leaves Notices masked at
/// the controller (the log was not read with RAE clear): the driver reads
/// it again at the next poll, so a later change by another host still
/// raises a notice and retires the handle. (Before, one failed read
/// silenced every later notice and the old handle sized a read of
/// 4 KiB blocks as 512 bytes.)
#[test]
fn a_failed_changed_namespace_list_read_is_retried_and_later_notices_still_come() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    // The driver's Get Log Page of log 04h fails once.
    m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 0,
            opcode: 0x02,
        },
        status: upnvme_tests::Status::INTERNAL_ERROR,
    });
    m.change_namespace(2, Some(ns(2, 4096, 512)));
    assert_eq!(notices_over_three_polls(&c), 1);
    assert!(m.pending_faults().is_empty(), "the log read failed");
    assert!(two.is_stale(), "every handle checked after the failed read");
    assert!(!one.is_stale());
    // Another host formats namespace 1: the notice comes and is followed.
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    assert_eq!(notices_over_three_polls(&c), 1);
    assert!(one.is_stale());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let r = qp
        .submit_io(
            IoCommand::Read {
                ns: &one,
                slba: 0,
                blocks: 1,
            },
            IoData::buffer(c.alloc_dma(512).unwrap()),
            1,
        )
        .unwrap_err();
    assert_eq!(r.reason, Reject::StaleNamespace { nsid: 1 });
}

/// Events are masked per type (NVMe 2.0 §5.2): a Firmware Activation
/// Starting notice the application does not follow with a read of its log
/// (03h) masks the Namespace Attribute Changed notice too. Meanwhile every
/// poll checks every handle, so another host's format is still found; once
/// the application reads log 03h, notices come again and the polls stop
/// checking.
#[test]
fn an_unread_notice_makes_polls_check_every_handle_until_its_log_is_read() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    // Notice (2h) / Firmware Activation Starting (01h), log 03h.
    m.raise_async_event(2, 0x01, 0x03);
    let events = c.poll_async_events().unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(!events[0].is_namespace_attribute_changed());
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    assert_eq!(
        notices_over_three_polls(&c),
        1,
        "the driver's own event for the handle it retired"
    );
    assert!(one.is_stale());
    // The application reads log 03h: the Notice type is armed again, the
    // notice it held back comes out, and then a poll sends no Identify
    // while nothing is noticed.
    c.get_log_page(0x03, 0xffff_ffff, 512, 0).unwrap();
    assert_eq!(notices_over_three_polls(&c), 1, "the notice held back");
    let before = m.commands_fetched();
    assert_eq!(notices(&c), 0);
    assert_eq!(
        m.commands_fetched(),
        before,
        "nothing checked without a gap"
    );
    m.change_namespace(2, Some(ns(2, 4096, 512)));
    assert_eq!(notices_over_three_polls(&c), 1, "the controller's notice");
    assert!(two.is_stale());
}

/// Once every Asynchronous Event Request has ended for good (DNR), no
/// notice can come: every poll checks every handle, so another host's
/// format is still found.
#[test]
fn with_no_async_event_request_left_every_poll_checks_every_handle() {
    let m = ModelController::new(ModelConfig {
        namespaces: vec![ns(1, 512, 4096)],
        ..ModelConfig::default()
    });
    m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 0,
            opcode: 0x0c,
        },
        status: upnvme_tests::Status::INTERNAL_ERROR.with_dnr(),
    });
    let c = common::open(
        &m,
        upnvme::ControllerOptions {
            async_events: 1,
            ..common::opts()
        },
    );
    let one = c.namespace(1).unwrap().clone();
    c.poll_async_events().unwrap();
    assert_eq!(m.outstanding_async_requests(), 0);
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    assert_eq!(notices_over_three_polls(&c), 1);
    assert!(one.is_stale());
}

/// A reset sets Asynchronous Event Configuration again; when the controller
/// refuses it now, the notices are off, and every poll checks every handle
/// (the status was ignored before: `reset` said Ok, notices never came, and
/// the handle kept its old geometry).
#[test]
fn a_notice_setting_refused_after_a_reset_makes_polls_check_every_handle() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    // The reset's admin commands: Identify Controller, Set Features Number
    // of Queues, Set Features Asynchronous Event Configuration, ...
    let n = m.commands_fetched();
    m.inject(Fault::Status {
        on: Match::Nth(n + 2),
        status: upnvme_tests::Status::INVALID_FIELD.with_dnr(),
    });
    c.reset().unwrap();
    assert!(m.pending_faults().is_empty(), "the fault applied");
    let seen = m.commands_seen();
    assert_eq!(seen[n as usize + 2].1, 0x09, "a Set Features was refused");
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    assert_eq!(notices_over_three_polls(&c), 1);
    assert!(one.is_stale());
    // A later reset that sets the notices again ends the per-poll checks.
    c.reset().unwrap();
    c.poll_async_events().unwrap();
    let before = m.commands_fetched();
    assert_eq!(notices(&c), 0);
    assert_eq!(
        m.commands_fetched(),
        before,
        "no checks with the notices on"
    );
}

/// The application reads the Changed Namespace List itself (RAE clear)
/// after another host changed namespace 1 and before the driver followed
/// the notice; namespace 2 changes afterwards. The list the driver reads
/// names only namespace 2: namespace 1's handle must still be retired (the
/// notice the driver holds says a change it has not followed happened).
#[test]
fn a_changed_namespace_list_the_application_read_between_two_changes_still_retires_both() {
    let (m, c) = two_namespaces();
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    let list = c.get_log_page(0x04, 0xffff_ffff, 4096, 0).unwrap();
    assert_eq!(&list[..8], &[1, 0, 0, 0, 0, 0, 0, 0]);
    m.change_namespace(2, Some(ns(2, 4096, 512)));
    let noticed: usize = (0..3).map(|_| notices(&c)).sum();
    assert!(noticed >= 1);
    assert!(two.is_stale(), "listed");
    assert!(
        one.is_stale(),
        "namespace 1's change went to the application's read; its handle still says 512-byte \
         blocks"
    );
    drop(c);
    assert_clean(&m);
}
