//! Notice gaps (driver/src/namespace_list.rs, `AdminQueue::notice_masked`):
//! where no namespace notice can come every `poll_async_events` checks every
//! handle, and only there — a Notice whose log was read before it was handed
//! out, or that a reset unmasked, leaves no gap; a check cut by a controller
//! failure retires nothing it could not check; notices the application turns
//! off itself are a gap; a transient Identify status keeps a handle for the
//! next poll, and a namespace attached in a gap is announced once. (From
//! the thirty-sixth session's review of the notice-gap change and the
//! thirty-seventh session's follow-up: each test failed against the version
//! before its fix.)

mod common;

use std::time::Duration;

use common::{ns, setup};
use upnvme::ControllerOptions;
use upnvme::{Controller, NamespaceChanges};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig, Status};

fn two_namespaces_cfg() -> ModelConfig {
    ModelConfig {
        namespaces: vec![ns(1, 512, 4096), ns(2, 512, 4096)],
        ..ModelConfig::default()
    }
}

/// Admin commands one poll sends when nothing happens.
fn poll_cost(m: &ModelController, c: &Controller<ModelController>) -> u64 {
    let before = m.commands_fetched();
    let ev = c.poll_async_events().unwrap();
    assert!(ev.is_empty(), "{ev:?}");
    m.commands_fetched() - before
}

// ---------------------------------------------------------------- notices

/// The application reads the Firmware Slot log (RAE clear) after the
/// controller posted Firmware Activation Starting but before
/// `poll_async_events` hands the event out: the controller's Notice mask is
/// cleared, so no poll afterwards checks the handles (the first version
/// marked the log unread at hand-out and checked every handle for good).
#[test]
fn a_notice_whose_log_was_read_before_it_was_handed_out_leaves_no_gap() {
    let (m, c) = setup(two_namespaces_cfg());
    assert_eq!(poll_cost(&m, &c), 0, "no gap at start");
    m.raise_async_event(2, 0x01, 0x03);
    // E.g. a firmware tool on another thread confirms the activation.
    c.get_log_page(0x03, 0xffff_ffff, 512, 0).unwrap();
    let ev = c.poll_async_events().unwrap();
    assert_eq!(ev.len(), 1, "{ev:?}");
    // The controller's mask is clear: a namespace change would be noticed.
    let cost = poll_cost(&m, &c);
    assert_eq!(
        cost, 0,
        "every poll now checks every handle ({cost} admin commands) though the log was read"
    );
}

/// A Notice the controller posted before a reset is kept and handed out
/// after it; the reset cleared the controller's masks (CC.EN = 0), so it
/// leaves no gap.
#[test]
fn a_notice_kept_across_a_reset_leaves_no_gap() {
    let (m, c) = setup(two_namespaces_cfg());
    m.raise_async_event(2, 0x01, 0x03);
    c.reset().unwrap();
    let ev = c.poll_async_events().unwrap();
    assert_eq!(ev.len(), 1, "kept across the reset: {ev:?}");
    // The model's masks were cleared by the reset: a notice can come.
    let cost = poll_cost(&m, &c);
    assert_eq!(
        cost, 0,
        "every poll checks every handle ({cost} admin commands) after the reset cleared the mask"
    );
}

/// In a gap (here: no AER configured, `async_events: 0`) every poll sends
/// Identify Namespace for every handle. An Identify that gets no answer
/// marks the controller failed: the check stops there, retires nothing it
/// could not check, and the reset checks again — nothing changed, nothing
/// is stale (the first version retired every handle after the failure).
#[test]
fn a_check_cut_by_an_admin_timeout_retires_no_unchanged_handle() {
    let m = ModelController::new(two_namespaces_cfg());
    let c = common::open(
        &m,
        upnvme::ControllerOptions {
            async_events: 0,
            admin_timeout: Some(Duration::from_millis(300)),
            ..common::opts()
        },
    );
    let one = c.namespace(1).unwrap().clone();
    let two = c.namespace(2).unwrap().clone();
    let cost = poll_cost(&m, &c);
    assert!(cost >= 3, "blind poll: {cost}");
    m.inject(Fault::DropCompletion(Match::Identify { cns: 0, nsid: 1 }));
    let r = c.poll_async_events();
    eprintln!("poll during the failure: {r:?}");
    c.reset().unwrap();
    eprintln!("one stale {}, two stale {}", one.is_stale(), two.is_stale());
    assert!(
        !two.is_stale(),
        "namespace 2 unchanged, retired because the controller was marked failed"
    );
}

/// Same with a fatal controller status on one Identify (CSTS.CFS;
/// `with_admin` resets automatically): the namespace did not change, its
/// handle stays current and a refresh finds nothing.
#[test]
fn a_check_cut_by_a_fatal_controller_retires_no_unchanged_handle() {
    let m = ModelController::new(two_namespaces_cfg());
    let mut c = common::open(
        &m,
        upnvme::ControllerOptions {
            async_events: 0,
            ..common::opts()
        },
    );
    let one = c.namespace(1).unwrap().clone();
    m.inject(Fault::FatalOn(Match::Identify { cns: 0, nsid: 1 }));
    let r = c.poll_async_events();
    eprintln!("poll: {r:?}");
    let r2 = c.poll_async_events();
    eprintln!("poll 2: {r2:?}");
    let changes = c.refresh_namespaces().unwrap();
    eprintln!("refresh: {changes:?}");
    assert!(!one.is_stale(), "namespace 1 unchanged but retired");
    assert_eq!(changes, NamespaceChanges::default());
}

/// The application turns Namespace Attribute Notices off itself (Set
/// Features Asynchronous Event Configuration without bit 8, through
/// `set_features` or `admin_passthrough`): that is a gap, so polls check
/// every handle and another host's format retires the old one (the first
/// version recorded no gap: the handle stayed live).
#[test]
fn notices_turned_off_by_the_application_make_polls_check_every_handle() {
    let (m, c) = setup(two_namespaces_cfg());
    let one = c.namespace(1).unwrap().clone();
    let aec = c.get_features(0x0b, 0, 0).unwrap();
    assert_ne!(aec & (1 << 8), 0, "the driver turned the notices on");
    c.set_features(0x0b, aec & !(1 << 8), false).unwrap();
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    let mut n = 0;
    for _ in 0..3 {
        n += c
            .poll_async_events()
            .unwrap()
            .iter()
            .filter(|e| e.is_namespace_attribute_changed())
            .count();
    }
    assert!(
        one.is_stale(),
        "notices off by Set Features: {n} notices, handle still says 512-byte blocks"
    );
    // A reset sets the application's value again: still no notices, still
    // checked.
    c.reset().unwrap();
    assert_eq!(c.get_features(0x0b, 0, 0).unwrap() & (1 << 8), 0);
    assert!(poll_cost(&m, &c) >= 3, "every poll checks every handle");
    // Notices on again: one last check (a change while they were off raised
    // no notice), then none.
    c.set_features(0x0b, aec, false).unwrap();
    assert!(
        poll_cost(&m, &c) >= 3,
        "the check of what changed while off"
    );
    assert_eq!(poll_cost(&m, &c), 0);
}

/// Two Notices whose log is 03h: the second is raised while the first one
/// masks the Notice type, so the controller keeps it. The application reads
/// log 03h (RAE clear): the controller unmasks, at once posts the kept
/// Notice (masking the type again) and completes the Get Log Page. The
/// admin queue reaps both in the same wait; the read clears only a Notice
/// reaped before it was sent, so the type stays masked in the driver's
/// view too, and another host's format of namespace 1 is still found by
/// the polls (a review found the first version cleared it: no poll checked
/// the handle).
#[test]
fn a_notice_posted_at_the_log_read_still_masks_the_namespace_notice() {
    let (m, c) = setup(two_namespaces_cfg());
    let one = c.namespace(1).unwrap().clone();
    m.raise_async_event(2, 0x01, 0x03);
    m.raise_async_event(2, 0x01, 0x03); // kept by the controller: masked
    c.get_log_page(0x03, 0xffff_ffff, 512, 0).unwrap();
    let ev = c.poll_async_events().unwrap();
    eprintln!("events: {ev:?}");
    assert_eq!(ev.len(), 2, "both Notices handed out: {ev:?}");
    // The second Notice's log was never read after it: the controller masks
    // the namespace notice.
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    for _ in 0..3 {
        let _ = c.poll_async_events().unwrap();
    }
    assert!(
        one.is_stale(),
        "the Notice type is masked again (the kept Notice was posted at the read), yet no poll \
         checked the handles: namespace 1 still says 512-byte blocks"
    );
}

/// The application turns the notices off, a poll checks (nothing changed
/// yet), another host formats namespace 1 (no notice: bit 8 is clear), the
/// application turns the notices on again. Nothing raises a notice for the
/// change made while they were off, so the gap's end makes the next poll
/// check every handle once (a review found the handle left live).
#[test]
fn notices_turned_back_on_check_what_changed_while_they_were_off() {
    let (m, c) = setup(two_namespaces_cfg());
    let one = c.namespace(1).unwrap().clone();
    let aec = c.get_features(0x0b, 0, 0).unwrap();
    c.set_features(0x0b, aec & !(1 << 8), false).unwrap();
    assert!(poll_cost(&m, &c) >= 3, "blind while off");
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    c.set_features(0x0b, aec, false).unwrap();
    let mut n = 0;
    for _ in 0..3 {
        n += c
            .poll_async_events()
            .unwrap()
            .iter()
            .filter(|e| e.is_namespace_attribute_changed())
            .count();
    }
    assert!(
        one.is_stale(),
        "changed while the notices were off, then turned on: {n} notices, handle still live"
    );
}

/// Same through `admin_passthrough` (Set Features FID 0Bh).
#[test]
fn notices_turned_back_on_by_passthrough_check_what_changed_while_off() {
    let (m, c) = setup(two_namespaces_cfg());
    let one = c.namespace(1).unwrap().clone();
    let aec = c.get_features(0x0b, 0, 0).unwrap();
    let set = |v: u32| {
        let sqe = upnvme::Sqe::set_features(0x0b, v, false);
        c.admin_passthrough(sqe, 0, None).unwrap();
    };
    set(aec & !(1 << 8));
    assert!(poll_cost(&m, &c) >= 3, "blind while off");
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    set(aec);
    for _ in 0..3 {
        let _ = c.poll_async_events().unwrap();
    }
    assert!(one.is_stale(), "handle still live after the gap ended");
}

// ------------------------------------------- transient statuses, attaches

fn blind_setup() -> (ModelController, Controller<ModelController>) {
    let m = ModelController::new(two_namespaces_cfg());
    let c = common::open(
        &m,
        upnvme::ControllerOptions {
            async_events: 0,
            ..common::opts()
        },
    );
    (m, c)
}

fn not_ready(dnr: bool) -> Fault {
    Fault::Status {
        on: Match::Identify { cns: 0, nsid: 1 },
        status: if dnr {
            Status::new(0, 0x82).with_dnr()
        } else {
            Status::new(0, 0x82)
        },
    }
}

/// A check whose Identify Namespace gets Namespace Not Ready with DNR clear
/// (another host formats the namespace) keeps the handle and checks again
/// at the next poll, which retires it when the geometry changed. Before, a
/// transient status retired the handle as any refusal does. With DNR set
/// the status says what the namespace is: retired.
#[test]
fn a_transient_identify_status_keeps_the_handle_and_checks_again() {
    let (m, c) = blind_setup();
    let one = c.namespace(1).unwrap().clone();
    m.inject(not_ready(false));
    let ev = c.poll_async_events().unwrap();
    assert!(
        ev.is_empty(),
        "nothing retired, nothing to announce: {ev:?}"
    );
    assert!(
        !one.is_stale(),
        "retired on Namespace Not Ready (DNR clear)"
    );
    let _ = c.poll_async_events().unwrap();
    assert!(!one.is_stale(), "unchanged");
    // The format ends with another geometry: the next check retires it.
    m.inject(not_ready(false));
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    let _ = c.poll_async_events().unwrap();
    assert!(!one.is_stale(), "kept while not ready");
    let ev = c.poll_async_events().unwrap();
    assert!(one.is_stale(), "changed and ready again, still live");
    assert!(
        ev.iter().any(|e| e.is_namespace_attribute_changed()),
        "{ev:?}"
    );
    // DNR set: retired at once.
    let two = c.namespace(2).unwrap().clone();
    m.inject(Fault::Status {
        on: Match::Identify { cns: 0, nsid: 2 },
        status: Status::new(0, 0x82).with_dnr(),
    });
    let _ = c.poll_async_events().unwrap();
    assert!(two.is_stale(), "Namespace Not Ready with DNR set");
}

/// With notices on: a Namespace Attribute Changed notice whose Identify
/// meets a transient status keeps the handle, and the next poll (no new
/// notice) checks it again.
#[test]
fn a_notice_checked_during_a_transient_status_is_checked_again_at_the_next_poll() {
    let (m, c) = setup(two_namespaces_cfg());
    let one = c.namespace(1).unwrap().clone();
    m.inject(not_ready(false));
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    let _ = c.poll_async_events().unwrap();
    assert!(!one.is_stale(), "kept while not ready");
    let ev = c.poll_async_events().unwrap();
    assert!(one.is_stale(), "the poll after did not check it again");
    assert!(
        ev.iter().any(|e| e.is_namespace_attribute_changed()),
        "{ev:?}"
    );
    assert_eq!(poll_cost(&m, &c), 0, "and then no more checks");
}

/// In a gap every poll reads the Active Namespace ID list; a namespace
/// attached there is announced (a synthesized Namespace Attribute Changed)
/// once, not at every poll until the application refreshes; after the
/// refresh, the next one attached is announced again.
#[test]
fn a_namespace_attached_in_a_gap_is_announced_once() {
    // NN 4 (the largest configured NSID): 2 and 3 can be attached.
    let m = ModelController::new(ModelConfig {
        namespaces: vec![ns(1, 512, 4096), ns(4, 512, 4096)],
        ..ModelConfig::default()
    });
    let mut c = common::open(
        &m,
        upnvme::ControllerOptions {
            async_events: 0,
            ..common::opts()
        },
    );
    let announced = |c: &Controller<ModelController>| {
        c.poll_async_events()
            .unwrap()
            .iter()
            .filter(|e| e.is_namespace_attribute_changed())
            .count()
    };
    assert_eq!(announced(&c), 0);
    m.change_namespace(2, Some(ns(2, 512, 4096)));
    assert_eq!(announced(&c), 1, "attached");
    assert_eq!(announced(&c), 0, "announced again");
    assert_eq!(announced(&c), 0, "announced again");
    let changes: NamespaceChanges = c.refresh_namespaces().unwrap();
    assert_eq!(changes.added, vec![2]);
    assert_eq!(announced(&c), 0, "after the refresh");
    m.change_namespace(3, Some(ns(3, 512, 4096)));
    assert_eq!(announced(&c), 1, "the next attach");
    assert_eq!(announced(&c), 0);
}

// ------------------------------------- review of the transient and attach rules

fn blind_open(m: &ModelController) -> Controller<ModelController> {
    common::open(
        m,
        ControllerOptions {
            async_events: 0,
            ..common::opts()
        },
    )
}

fn nacs(c: &Controller<ModelController>) -> usize {
    c.poll_async_events()
        .unwrap()
        .iter()
        .filter(|e| e.is_namespace_attribute_changed())
        .count()
}

/// NN 4 with namespaces 1 and 4: 2 and 3 can be attached.
fn one_and_four() -> ModelConfig {
    ModelConfig {
        namespaces: vec![ns(1, 512, 4096), ns(4, 512, 4096)],
        ..ModelConfig::default()
    }
}

/// In one blind check namespace 1 is reformatted (handle retired) and
/// namespace 2 attached: one event covers both, and the next poll announces
/// nothing (the first version's `retired || (unverified && attached())`
/// skipped recording the attach, so the next poll announced it again).
#[test]
fn a_retire_and_an_attach_in_one_check_are_announced_once() {
    let m = ModelController::new(one_and_four());
    let c = blind_open(&m);
    let one = c.namespace(1).unwrap().clone();
    assert_eq!(nacs(&c), 0);
    m.change_namespace(1, Some(ns(1, 4096, 512)));
    m.change_namespace(2, Some(ns(2, 512, 4096)));
    assert_eq!(nacs(&c), 1, "retired and attached");
    assert!(one.is_stale());
    assert_eq!(
        nacs(&c),
        0,
        "nothing changed since the last poll, announced again (namespace 2 recorded only now)"
    );
}

/// Notices on: namespace 2 attached, the controller's own notice is handed
/// out (its Changed Namespace List names 2). A later reset's check does not
/// announce it a second time before the application's refresh.
#[test]
fn an_attach_the_controller_announced_is_not_announced_again_by_a_reset() {
    let m = ModelController::new(one_and_four());
    let c = common::open(&m, common::opts());
    m.change_namespace(2, Some(ns(2, 512, 4096)));
    assert_eq!(nacs(&c), 1, "the controller's notice");
    c.reset().unwrap();
    assert_eq!(
        nacs(&c),
        0,
        "the attach was announced already (by the controller) and nothing changed since"
    );
}

/// A transient status (Namespace Not Ready, DNR clear) on the NVM Command
/// Set Identify Namespace (CNS 05h, read for every handle on a controller
/// with CTRATT.ELBAS) keeps the handle as on CNS 00h (it was taken as a
/// refusal: no guard size, so a namespace with PI was retired as unusable).
#[test]
fn a_transient_status_on_the_elbaf_identify_keeps_the_handle() {
    let pi_ns = NamespaceConfig {
        nsid: 1,
        lba_size: 512,
        blocks: 4096,
        ms: 16,
        extended: true,
        pi_type: 1,
        pif: 2,
        ..NamespaceConfig::default()
    };
    let m = ModelController::new(ModelConfig {
        elbas: true,
        sgls: 1,
        namespaces: vec![pi_ns],
        ..ModelConfig::default()
    });
    let c = blind_open(&m);
    let one = c.namespace(1).unwrap().clone();
    assert_eq!(nacs(&c), 0);
    m.inject(Fault::Status {
        on: Match::Identify { cns: 5, nsid: 1 },
        status: Status::new(0, 0x82),
    });
    let _ = c.poll_async_events().unwrap();
    assert!(
        !one.is_stale(),
        "retired on Namespace Not Ready (DNR clear) of Identify CNS 05h"
    );
}

/// The application refreshes (as told after an event) while namespace 1
/// answers Namespace Not Ready (DNR clear): its current handle is kept and
/// checked again at the next poll (it was filed unusable and retired, and
/// nothing said when it was ready again).
#[test]
fn a_namespace_not_ready_at_a_refresh_is_not_left_unusable_in_silence() {
    let m = ModelController::new(ModelConfig {
        namespaces: vec![ns(1, 512, 4096), ns(2, 512, 4096)],
        ..ModelConfig::default()
    });
    let mut c = blind_open(&m);
    m.inject(Fault::Status {
        on: Match::Identify { cns: 0, nsid: 1 },
        status: Status::new(0, 0x82),
    });
    let one = c.namespace(1).unwrap().clone();
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(changes, upnvme::NamespaceChanges::default(), "{changes:?}");
    assert!(!one.is_stale(), "retired while not ready");
    // Ready again (the fault was one-shot).
    let mut told = 0;
    for _ in 0..3 {
        told += nacs(&c);
    }
    assert!(
        c.namespace(1).is_ok() || told > 0,
        "namespace 1 ready again, still unusable ({:?}) and nothing announced",
        c.namespace(1).err()
    );
}

/// An attach is announced; the application's refresh fails (the Active
/// Namespace ID list gets no answer: timeout, controller failed); the
/// application resets. The attach is announced again (the first version
/// emptied the announced list only after a refresh that succeeded, so an
/// application that refreshes on events never learned of namespace 2).
#[test]
fn an_attach_whose_refresh_failed_is_announced_again() {
    let m = ModelController::new(one_and_four());
    let mut c = common::open(
        &m,
        ControllerOptions {
            async_events: 0,
            admin_timeout: Some(Duration::from_millis(300)),
            ..common::opts()
        },
    );
    m.change_namespace(2, Some(ns(2, 512, 4096)));
    assert_eq!(nacs(&c), 1, "attached");
    m.inject(Fault::DropCompletion(Match::Identify { cns: 2, nsid: 0 }));
    let r = c.refresh_namespaces();
    assert!(r.is_err(), "{r:?}");
    c.reset().unwrap();
    let mut told = 0;
    for _ in 0..3 {
        told += nacs(&c);
    }
    assert!(
        told > 0,
        "the refresh the announcement asked for failed; namespace 2 never announced again"
    );
}

/// A namespace attached while not ready (a scan meets Namespace Not Ready
/// on it, no handle yet) is listed unusable with why, checked at every
/// poll, and announced once it is ready; the refresh then hands out its
/// handle.
#[test]
fn a_namespace_not_ready_at_its_first_scan_is_announced_when_ready() {
    let m = ModelController::new(one_and_four());
    let mut c = blind_open(&m);
    m.change_namespace(2, Some(ns(2, 512, 4096)));
    assert_eq!(nacs(&c), 1, "attached");
    m.inject(Fault::Status {
        on: Match::Identify { cns: 0, nsid: 2 },
        status: Status::new(0, 0x82),
    });
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(changes.added, vec![2]);
    let e = c.namespace(2).unwrap_err().to_string();
    assert!(e.contains("not ready now"), "{e}");
    // Still not ready at the next poll: nothing to say yet.
    m.inject(Fault::Status {
        on: Match::Identify { cns: 0, nsid: 2 },
        status: Status::new(0, 0x82),
    });
    assert_eq!(nacs(&c), 0, "announced while still not ready");
    assert_eq!(nacs(&c), 1, "ready now: announced");
    assert_eq!(nacs(&c), 0, "once");
    let changes = c.refresh_namespaces().unwrap();
    assert_eq!(changes.changed, vec![2], "{changes:?}");
    assert_eq!(c.namespace(2).unwrap().lba_size(), 512);
}
