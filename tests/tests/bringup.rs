//! Host tests of controller bring-up and shutdown against the in-memory model:
//! the register sequence (CC.EN = 0 / RDY = 0, AQA/ASQ/ACQ, CC fields, EN = 1),
//! the admin commands of bring-up in order, Identify data reaching
//! `Controller::identify()`, namespaces of 512- and 4096-byte LBAs, granted
//! queues, Doorbell Buffer Config, Asynchronous Event Requests, every bounded
//! wait (NeverReady, CFS, device gone, NeverShutdownComplete) and
//! open → close → open on one model.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{
    Access, Front, Hooks, Spy, admin_op, assert_clean, config_one_ns, model, open, opts, reg,
};
use upnvme::{Controller, ControllerOptions, Device, Error, QueuePairOptions, Reject};
use upnvme_tests::{Fault, Match, ModelConfig, ModelController, NamespaceConfig, Status};

/// Enables the model by hand (as a previous user of the device would have
/// left it), so that bring-up has to disable it first.
fn leave_enabled(m: &ModelController) -> Vec<upnvme::DmaBuffer> {
    let sq = m.alloc_dma(4096).unwrap();
    let cq = m.alloc_dma(4096).unwrap();
    m.write32(reg::AQA, 1 | 1 << 16);
    m.write64(reg::ASQ, sq.iova());
    m.write64(reg::ACQ, cq.iova());
    m.write32(reg::CC, 0x0046_0001);
    assert!((0..100).any(|_| m.read32(reg::CSTS) & 1 == 1), "RDY");
    vec![sq, cq]
}

#[test]
fn register_sequence_disable_configure_enable() {
    let m = ModelController::new(ModelConfig {
        ready_delay_reads: 3,
        ..Default::default()
    });
    let _old = leave_enabled(&m);
    let spy = Spy::new(m.clone());
    let c = Controller::with_device(spy.clone(), opts()).unwrap();
    let log = spy.log();

    let pos = |pred: &dyn Fn(&Access) -> bool| log.iter().position(pred);
    // 1. CC.EN = 0 first.
    let disable =
        pos(&|a| matches!(a, Access::W32(reg::CC, v) if v & 1 == 0)).expect("CC.EN = 0 written");
    // 2. ... then CSTS read until RDY = 0.
    let rdy0 = pos(&|a| matches!(a, Access::R32(reg::CSTS, v) if v & 1 == 0))
        .expect("CSTS.RDY = 0 observed");
    assert!(disable < rdy0);
    // With ready_delay_reads = 3 the driver had to poll: RDY = 1 reads between.
    let polls = log[disable..rdy0]
        .iter()
        .filter(|a| matches!(a, Access::R32(reg::CSTS, v) if v & 1 == 1))
        .count();
    assert!(
        polls >= 3,
        "driver polled CSTS {polls} times before RDY = 0"
    );
    // 3. AQA / ASQ / ACQ only after RDY = 0.
    let aqa = pos(&|a| matches!(a, Access::W32(reg::AQA, _))).expect("AQA written");
    let asq = pos(&|a| matches!(a, Access::W64(reg::ASQ, _))).expect("ASQ written");
    let acq = pos(&|a| matches!(a, Access::W64(reg::ACQ, _))).expect("ACQ written");
    assert!(rdy0 < aqa && rdy0 < asq && rdy0 < acq);
    let Access::W32(_, aqa_v) = log[aqa] else {
        unreachable!()
    };
    assert_eq!(aqa_v, 31 | 31 << 16, "AQA = 32 entries (0-based) both ways");
    for i in [asq, acq] {
        let Access::W64(_, iova) = log[i] else {
            unreachable!()
        };
        assert!(iova != 0 && iova % 4096 == 0, "queue base {iova:#x}");
    }
    // 4. CC with the fields and EN = 1, written after the admin queue setup.
    let enable =
        pos(&|a| matches!(a, Access::W32(reg::CC, v) if v & 1 == 1)).expect("CC.EN = 1 written");
    assert!(aqa < enable && asq < enable && acq < enable);
    let Access::W32(_, cc) = log[enable] else {
        unreachable!()
    };
    assert_eq!((cc >> 16) & 0xf, 6, "IOSQES");
    assert_eq!((cc >> 20) & 0xf, 4, "IOCQES");
    assert_eq!((cc >> 7) & 0xf, 0, "MPS");
    assert_eq!((cc >> 4) & 0x7, 0, "CSS = NVM");
    assert_eq!((cc >> 14) & 0x3, 0, "SHN");
    assert_eq!(m.cc(), cc);
    // 5. No doorbell before CSTS.RDY = 1 was seen after the enable.
    let rdy1 = log[enable..]
        .iter()
        .position(|a| matches!(a, Access::R32(reg::CSTS, v) if v & 1 == 1))
        .map(|i| i + enable)
        .expect("CSTS.RDY = 1 observed");
    let first_db =
        pos(&|a| matches!(a, Access::W32(o, _) if *o >= reg::DOORBELLS)).expect("admin doorbell");
    assert!(rdy1 < first_db);
    // The CC was never changed while enabled (the model would record it).
    c.close().unwrap();
    assert_eq!(m.cc() & 1, 0, "closed controller is disabled");
    assert_clean(&m);
}

#[test]
fn bringup_admin_commands_in_order() {
    let m = model();
    let c = open(&m, opts());
    let admin: Vec<u8> = m
        .commands_seen()
        .iter()
        .filter(|(q, _, _)| *q == 0)
        .map(|&(_, op, _)| op)
        .collect();
    // Identify Controller, the NVM Command Set's Identify Controller (CNS
    // 06h: size limits), Number of Queues, Get and Set Features Asynchronous
    // Event Configuration (Namespace Attribute Notices, OAES bit 8: before
    // the namespaces are read, so a change after that raises a notice),
    // namespace list, namespace 1, Doorbell Buffer Config, then the AERs.
    assert_eq!(
        &admin[..8],
        &[
            admin_op::IDENTIFY,
            admin_op::IDENTIFY,
            admin_op::SET_FEATURES,
            admin_op::GET_FEATURES,
            admin_op::SET_FEATURES,
            admin_op::IDENTIFY,
            admin_op::IDENTIFY,
            admin_op::DBBC
        ]
    );
    assert!(admin[8..].iter().all(|&op| op == admin_op::AER));
    assert_eq!(admin.len() - 8, 4);
    drop(c);
    assert_clean(&m);
}

#[test]
fn identify_fields_reach_the_controller() {
    let m = ModelController::new(ModelConfig {
        serial: "SN-HOST-42".into(),
        model: "upnvme host test ctrl".into(),
        firmware: "9.8".into(),
        vid: 0x1234,
        cntlid: 7,
        mdts: 5,
        oncs: ModelConfig::ONCS_COMPARE,
        ..Default::default()
    });
    let c = open(&m, opts());
    let id = c.identify();
    assert_eq!(id.sn.trim_end(), "SN-HOST-42");
    assert_eq!(id.mn.trim_end(), "upnvme host test ctrl");
    assert_eq!(id.fr.trim_end(), "9.8");
    assert_eq!(id.vid, 0x1234);
    assert_eq!(id.cntlid, 7);
    assert_eq!(id.mdts, 5);
    assert_eq!(id.oncs, ModelConfig::ONCS_COMPARE);
    assert_eq!(c.max_transfer_bytes(), Some(4096 << 5));
    assert_eq!(c.cap().mqes(), 2047);
    assert_eq!(c.version().major(), 1);
    assert_eq!(c.version().minor(), 4);
    // Identify read now agrees with the data captured at bring-up.
    assert_eq!(c.identify_controller().unwrap().sn, id.sn);
    drop(c);
    assert_clean(&m);
}

#[test]
fn namespaces_of_both_lba_sizes_sparse_nsids() {
    let m = ModelController::new(ModelConfig {
        namespaces: vec![
            NamespaceConfig {
                nsid: 1,
                lba_size: 512,
                blocks: 2048,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 2,
                lba_size: 4096,
                blocks: 1000,
                ..NamespaceConfig::default()
            },
            NamespaceConfig {
                nsid: 5,
                lba_size: 512,
                blocks: 77,
                ..NamespaceConfig::default()
            },
        ],
        ..Default::default()
    });
    let c = open(&m, opts());
    let got: Vec<(u32, u32, u64, u64)> = c
        .namespaces()
        .iter()
        .map(|n| (n.id(), n.lba_size(), n.lba_count(), n.size_bytes()))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, 512, 2048, 2048 * 512),
            (2, 4096, 1000, 1000 * 4096),
            (5, 512, 77, 77 * 512)
        ]
    );
    assert_eq!(c.identify().nn, 5);
    assert_eq!(c.namespace(2).unwrap().lba_size(), 4096);
    match c.namespace(3) {
        Err(Error::NoSuchNamespace { nsid, active, .. }) => {
            assert_eq!(nsid, 3);
            assert_eq!(active, vec![1, 2, 5]);
        }
        other => panic!("namespace 3: {other:?}"),
    }
    assert_eq!(c.active_namespace_ids(1).unwrap(), vec![2, 5]);
    assert_eq!(c.identify_namespace(5).unwrap().nsze, 77);
    drop(c);
    assert_clean(&m);
}

#[test]
fn granted_queues_are_min_of_requested_and_supported() {
    for (max, requested, granted) in [(4u16, 64u16, 4u16), (64, 2, 2), (8, 8, 8), (3, 1, 1)] {
        let m = ModelController::new(ModelConfig {
            max_ioqpairs: max,
            ..Default::default()
        });
        let c = open(
            &m,
            ControllerOptions {
                io_queues: requested,
                ..opts()
            },
        );
        assert_eq!(
            c.granted_io_queues(),
            granted,
            "max {max} requested {requested}"
        );
        assert_eq!(m.granted_queues(), Some((granted, granted)));
        // Exactly `granted` queue pairs can be created.
        let pairs: Vec<_> = (0..granted)
            .map(|_| c.io_queue_pair(QueuePairOptions::default()).unwrap())
            .collect();
        match c.io_queue_pair(QueuePairOptions::default()) {
            Err(Error::NoQueuesLeft { granted: g, .. }) => assert_eq!(g, granted),
            other => panic!("expected NoQueuesLeft, got {other:?}"),
        }
        drop(pairs);
        drop(c);
        assert_clean(&m);
    }
}

#[test]
fn doorbell_buffer_config_iff_oacs_and_option() {
    // The default is MMIO doorbells only, even where OACS offers the buffer
    // (docs/benchmarks.md, "Twenty-sixth session").
    assert!(!ControllerOptions::default().shadow_doorbells);
    for (oacs, option, expected) in [
        (true, true, true),
        (true, false, false),
        (false, true, false),
        (false, false, false),
    ] {
        let m = ModelController::new(ModelConfig {
            oacs_dbbc: oacs,
            ..Default::default()
        });
        let c = open(
            &m,
            ControllerOptions {
                shadow_doorbells: option,
                ..opts()
            },
        );
        let issued = m
            .commands_seen()
            .iter()
            .any(|&(q, op, _)| q == 0 && op == admin_op::DBBC);
        assert_eq!(issued, expected, "OACS {oacs} option {option}");
        assert_eq!(c.shadow_doorbells(), expected);
        assert_eq!(m.shadow_config().is_some(), expected);
        let qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
        assert_eq!(qp.shadow_doorbells(), expected);
        drop(qp);
        drop(c);
        assert_clean(&m);
    }
}

#[test]
fn a_refused_doorbell_buffer_config_leaves_mmio_doorbells() {
    // Shadow doorbells are an optimisation: a controller that advertises
    // Doorbell Buffer Config but refuses it still comes up, with MMIO
    // doorbells, and moves data.
    let m = model();
    m.inject(Fault::Status {
        on: Match::Opcode {
            qid: 0,
            opcode: admin_op::DBBC,
        },
        status: upnvme_tests::Status::INVALID_FIELD.with_dnr(),
    });
    let c = open(&m, opts());
    assert!(!c.shadow_doorbells());
    assert!(m.shadow_config().is_none());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert!(!qp.shadow_doorbells());
    let ns = c.namespace(1).unwrap().clone();
    let buf = c.alloc_dma(4096).unwrap();
    buf.fill(0, 4096, 0x5a).unwrap();
    let buf = qp
        .write_blocking(&ns, 3, 1, buf, Duration::from_secs(5))
        .unwrap();
    drop(buf);
    let back = qp
        .read_blocking(
            &ns,
            3,
            1,
            c.alloc_dma(4096).unwrap(),
            Duration::from_secs(5),
        )
        .unwrap();
    assert!(back.to_vec()[..512].iter().all(|&b| b == 0x5a));
    drop(qp);
    drop(c);
    assert_clean(&m);
}

#[test]
fn async_event_requests_posted_up_to_aerl_plus_one() {
    for (aerl, option, expected) in [
        (3u8, 4u8, 4usize),
        (3, 10, 4),
        (1, 4, 2),
        (3, 1, 1),
        (3, 0, 0),
    ] {
        let m = ModelController::new(ModelConfig {
            aerl,
            ..Default::default()
        });
        let c = open(
            &m,
            ControllerOptions {
                async_events: option,
                ..opts()
            },
        );
        assert_eq!(
            m.outstanding_async_requests(),
            expected,
            "AERL {aerl} option {option}"
        );
        // No request was refused with AER Limit Exceeded: nothing surfaced.
        assert!(c.poll_async_events().unwrap().is_empty());
        assert_eq!(m.outstanding_async_requests(), expected);
        drop(c);
        assert_clean(&m);
    }
}

/// Without a caller's bound, the enable wait lasts the longer of CAP.TO and,
/// when CAP.CRMS.CRWMS is set, CRTO.CRWMT (NVMe 2.0): a controller that
/// needs longer than CAP.TO can say is not given up on early.
#[test]
fn the_default_ready_bound_is_the_longer_of_cap_to_and_crto_crwmt() {
    for (cap_to, crwmt, at_least) in [
        // CAP.TO 500 ms, CRWMT 1 s: CRWMT.
        (1u8, Some(2u16), Duration::from_secs(1)),
        // CAP.TO 1 s, CRWMT 500 ms: CAP.TO (CRWMT never shortens it).
        (2, Some(1), Duration::from_secs(1)),
    ] {
        let m = ModelController::new(ModelConfig {
            cap_to,
            crwmt,
            ..Default::default()
        });
        m.inject(Fault::NeverReady);
        let r = Controller::with_device(
            m.clone(),
            ControllerOptions {
                ready_timeout: None,
                ..opts()
            },
        );
        match r {
            Err(Error::Timeout { what, after }) => {
                assert!(what.contains("RDY = 1"), "{what}");
                assert!(
                    after >= at_least,
                    "CAP.TO {cap_to}, CRWMT {crwmt:?}: gave up after {after:?}"
                );
            }
            other => panic!("expected Timeout, got {other:?}"),
        }
    }
}

#[test]
fn never_ready_times_out_with_the_callers_bound() {
    // CAP.TO of 30 s: the caller's 100 ms must win, and the call must not hang.
    let m = ModelController::new(ModelConfig {
        cap_to: 60,
        ..Default::default()
    });
    m.inject(Fault::NeverReady);
    let start = Instant::now();
    let r = Controller::with_device(
        m.clone(),
        ControllerOptions {
            ready_timeout: Some(Duration::from_millis(100)),
            ..opts()
        },
    );
    let took = start.elapsed();
    match r {
        Err(Error::Timeout { what, after }) => {
            assert!(what.contains("RDY"), "{what}");
            assert!(what.contains("Enable"), "names the bring-up step: {what}");
            assert!(after >= Duration::from_millis(100));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(took < Duration::from_secs(3), "took {took:?}");
    // The fault was one-shot: the same model comes up now.
    let c = open(&m, opts());
    assert_eq!(c.namespaces().len(), 1);
    drop(c);
    assert_clean(&m);
}

#[test]
fn failed_enable_step_leaves_the_controller_disabled() {
    let m = model();
    m.inject(Fault::NeverReady);
    let r = Controller::with_device(
        m.clone(),
        ControllerOptions {
            ready_timeout: Some(Duration::from_millis(50)),
            ..opts()
        },
    );
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    // ASQ/ACQ point at memory the driver has just freed: the controller must
    // not be left enabled on them.
    assert_eq!(m.cc() & 1, 0, "CC {:#x}", m.cc());
    assert_clean(&m);
}

/// Short bounds for the wedged-controller tests (every wait times out).
fn quick() -> ControllerOptions {
    ControllerOptions {
        ready_timeout: Some(Duration::from_millis(50)),
        admin_timeout: Some(Duration::from_millis(200)),
        shutdown_timeout: Some(Duration::from_millis(50)),
        ..opts()
    }
}

#[test]
fn a_controller_that_cannot_be_disabled_at_bring_up_is_released_and_its_memory_freed() {
    // Enable times out, and so does the disable after it: the admin queue
    // may still be in use. The device is released (it says its DMA has
    // stopped) and only then is the memory freed — it used to be leaked,
    // which kept a VFIO container open and made every later open fail.
    let m = model();
    m.inject(Fault::Wedged);
    let r = Controller::with_device(m.clone(), quick());
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert_eq!(m.csts() & 1, 1, "the model is wedged ready");
    assert!(m.is_released(), "the device was released");
    assert_eq!(m.live_dma_buffers(), 0, "the admin queue was freed");
}

#[test]
fn memory_a_wedged_controller_may_use_is_kept_when_the_device_cannot_be_released() {
    // The same through a device that cannot say its DMA stopped (a `Spy`,
    // whose `release` returns false): the admin queue stays allocated.
    let m = model();
    m.inject(Fault::Wedged);
    let r = Controller::with_device(Spy::new(m.clone()), quick());
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(!m.is_released());
    assert_eq!(m.live_dma_buffers(), 2, "admin SQ and CQ kept");
}

#[test]
fn a_controller_that_cannot_be_shut_down_is_released_before_its_memory_goes() {
    for (releasable, close_first) in [(true, false), (false, false), (true, true), (false, true)] {
        let m = model();
        let mut o = quick();
        o.admin_timeout = Some(Duration::from_secs(2));
        let c = if releasable {
            ControllerOrSpy::Model(open(&m, o))
        } else {
            ControllerOrSpy::Spy(Controller::with_device(Spy::new(m.clone()), o).unwrap())
        };
        // A reset whose enable wedges: the controller keeps running on
        // admin queue memory and ignores CC from then on, so the drop's
        // shutdown and disable both time out.
        m.inject(Fault::Wedged);
        let r = match &c {
            ControllerOrSpy::Model(c) => c.reset(),
            ControllerOrSpy::Spy(c) => c.reset(),
        };
        assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
        assert!(m.live_dma_buffers() > 0);
        if close_first {
            // A close that fails leaves the memory to the drop, which must
            // not free it because the shutdown was tried already.
            let r = match c {
                ControllerOrSpy::Model(c) => c.close(),
                ControllerOrSpy::Spy(c) => c.close(),
            };
            assert!(r.is_err(), "{r:?}");
        } else {
            drop(c);
        }
        assert_eq!(m.csts() & 1, 1, "the model is wedged ready");
        if releasable {
            assert!(m.is_released(), "released before the memory went");
            assert_eq!(m.live_dma_buffers(), 0, "everything freed");
        } else {
            assert!(!m.is_released());
            assert!(
                m.live_dma_buffers() >= 2,
                "the admin queue kept: {} buffers",
                m.live_dma_buffers()
            );
        }
    }
}

/// A controller on the model itself (releasable) or behind a [`Spy`]
/// (whose `release` returns false).
enum ControllerOrSpy {
    Model(Controller<ModelController>),
    Spy(Controller<Spy>),
}

/// The model behind a BAR0 that ends right after the admin SQ tail
/// doorbell (the admin CQ head doorbell, at 0x1004 with CAP.DSTRD 0, is
/// beyond it).
#[derive(Clone)]
struct ShortBar(ModelController);

impl Hooks for ShortBar {
    fn model(&self) -> &ModelController {
        &self.0
    }
    fn bar_len(&self) -> usize {
        0x1004
    }
}

#[test]
fn admin_doorbells_beyond_bar0_are_refused_at_bring_up() {
    let m = model();
    match Controller::with_device(Front(ShortBar(m.clone())), opts()) {
        Err(Error::Unsupported { what, .. }) => {
            assert!(
                what.contains("CAP.DSTRD 0") && what.contains("BAR0"),
                "{what}"
            )
        }
        other => panic!("expected Unsupported, got {:?}", other.err()),
    }
    assert_eq!(m.cc() & 1, 0, "never enabled");
}

#[test]
fn never_ready_bound_comes_from_cap_to_by_default() {
    // CAP.TO = 1: 500 ms.
    let m = ModelController::new(ModelConfig {
        cap_to: 1,
        ..Default::default()
    });
    m.inject(Fault::NeverReady);
    let start = Instant::now();
    let r = Controller::with_device(
        m.clone(),
        ControllerOptions {
            ready_timeout: None,
            ..opts()
        },
    );
    let took = start.elapsed();
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(took >= Duration::from_millis(500), "took {took:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert_clean(&m);
}

#[test]
fn fatal_status_during_bringup_is_controller_fatal() {
    let m = model();
    // CSTS.CFS when Identify Controller is fetched.
    m.inject(Fault::FatalOn(Match::Opcode {
        qid: 0,
        opcode: admin_op::IDENTIFY,
    }));
    let start = Instant::now();
    let r = Controller::with_device(m.clone(), opts());
    assert!(matches!(r, Err(Error::ControllerFatal { .. })), "{r:?}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "no waiting for timeouts"
    );
    // The failed bring-up reset the controller (CFS cleared by CC.EN = 0)...
    assert_eq!(m.csts() & 2, 0, "CFS cleared by the reset");
    assert_eq!(m.cc() & 1, 0, "left disabled");
    // ... so it can be opened again.
    let c = open(&m, opts());
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn fatal_status_before_bringup_is_controller_fatal() {
    let m = model();
    m.set_fatal();
    let r = Controller::with_device(m.clone(), opts());
    assert!(matches!(r, Err(Error::ControllerFatal { .. })), "{r:?}");
    assert_clean(&m);
}

#[test]
fn unplugged_device_is_controller_gone() {
    let m = model();
    m.unplug();
    let start = Instant::now();
    let r = Controller::with_device(m.clone(), opts());
    match r {
        Err(e @ Error::ControllerGone { .. }) => {
            assert!(e.to_string().contains("all ones"), "{e}");
        }
        other => panic!("expected ControllerGone, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(1));
    assert_clean(&m);
}

#[test]
fn unplug_during_bringup_is_controller_gone() {
    let m = model();
    m.inject(Fault::UnplugOn(Match::Opcode {
        qid: 0,
        opcode: admin_op::SET_FEATURES,
    }));
    let start = Instant::now();
    let r = Controller::with_device(m.clone(), opts());
    assert!(matches!(r, Err(Error::ControllerGone { .. })), "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert_clean(&m);
}

#[test]
fn shutdown_that_never_completes_times_out_without_hanging() {
    let m = model();
    let c = open(
        &m,
        ControllerOptions {
            shutdown_timeout: Some(Duration::from_millis(150)),
            ..opts()
        },
    );
    m.inject(Fault::NeverShutdownComplete);
    let start = Instant::now();
    match c.close() {
        Err(Error::Timeout { what, .. }) => assert!(what.contains("SHST"), "{what}"),
        other => panic!("expected Timeout, got {other:?}"),
    }
    let took = start.elapsed();
    assert!(took >= Duration::from_millis(150), "took {took:?}");
    assert!(took < Duration::from_secs(3), "took {took:?}");
    // Disabled anyway, and reusable.
    assert_eq!(m.cc() & 1, 0);
    let c = open(&m, opts());
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn slow_shutdown_is_waited_for() {
    let m = ModelController::new(ModelConfig {
        shutdown_delay_reads: 50,
        ready_delay_reads: 5,
        ..Default::default()
    });
    let c = open(&m, opts());
    c.close().unwrap();
    // SHN was written and completed before the disable.
    assert_eq!(m.cc() & 1, 0);
    let c = open(&m, opts());
    let smart = c.smart_log().unwrap();
    assert_eq!(smart.unsafe_shutdowns, 0, "the shutdown was a clean one");
    c.close().unwrap();
    assert_clean(&m);
}

#[test]
fn open_close_open_keeps_data_and_counts_power_cycles() {
    let m = model();
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let data = common::pattern(7, 4096);
    let buf = common::buffer_with(&c, &data);
    qp.write_blocking(&ns, 3, 1, buf, common::T).unwrap();
    drop(qp);
    c.close().unwrap();
    assert_eq!(m.cc() & 1, 0);
    assert!(!m.queue_exists(0));

    let c = open(&m, opts());
    // A new controller: a new namespace handle (the old one is refused).
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    assert_eq!(qp.qid(), 1);
    let buf = c.alloc_dma(4096).unwrap();
    let buf = qp.read_blocking(&ns, 3, 1, buf, common::T).unwrap();
    assert_eq!(common::read_back(&buf, 4096), data);
    let smart = c.smart_log().unwrap();
    assert_eq!(smart.power_cycles, 2);
    assert_eq!(smart.unsafe_shutdowns, 0);
    drop(qp);
    drop(c); // drop shuts down as close does
    assert_eq!(m.cc() & 1, 0);
    assert_clean(&m);
}

#[test]
fn two_controllers_with_different_options_in_one_process() {
    let a = model();
    let b = ModelController::new(ModelConfig {
        serial: "OTHER".into(),
        ..Default::default()
    });
    let ca = open(
        &a,
        ControllerOptions {
            shadow_doorbells: true,
            async_events: 2,
            admin_queue_entries: 8,
            ..opts()
        },
    );
    let cb = open(
        &b,
        ControllerOptions {
            shadow_doorbells: false,
            async_events: 0,
            admin_queue_entries: 64,
            ..opts()
        },
    );
    assert!(ca.shadow_doorbells() && !cb.shadow_doorbells());
    assert_eq!(a.outstanding_async_requests(), 2);
    assert_eq!(b.outstanding_async_requests(), 0);
    assert_eq!(ca.admin_queue_entries(), 8);
    assert_eq!(cb.admin_queue_entries(), 64);
    assert_eq!(cb.identify().sn.trim_end(), "OTHER");
    ca.close().unwrap();
    // Closing one leaves the other working.
    assert!(cb.smart_log().is_ok());
    assert_eq!(a.cc() & 1, 0, "closed controller disabled");
    assert!(!a.queue_exists(0));
    cb.close().unwrap();
    assert_clean(&a);
    assert_clean(&b);
}

#[test]
fn submit_after_close_returns_closed_with_the_buffer() {
    let m = model();
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    c.close().unwrap();
    let buf = m.alloc_dma(4096).unwrap();
    let f = qp
        .submit(
            upnvme::IoCommand::Read {
                ns: &ns,
                slba: 0,
                blocks: 1,
            },
            Some(buf),
            1,
        )
        .expect_err("submit on a closed controller");
    assert_eq!(f.reason, Reject::Unusable, "{:?}", f.reason);
    let e = qp.describe(f.reason);
    assert!(matches!(e, Error::Closed { .. }), "{e:?}");
    assert!(f.buffer.is_some(), "buffer handed back");
    let buf = m.alloc_dma(4096).unwrap();
    let f = qp.read_blocking(&ns, 0, 1, buf, common::T).unwrap_err();
    assert!(matches!(f.error, Error::Closed { .. }), "{:?}", f.error);
    assert!(f.buffer.is_some());
    // Dropping the pair after close sends nothing to the disabled controller.
    let seen = m.commands_fetched();
    drop(qp);
    assert_eq!(m.commands_fetched(), seen);
    assert_clean(&m);
}

#[test]
fn process_completions_after_close_returns_closed() {
    let m = model();
    let c = open(&m, opts());
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    c.close().unwrap();
    // A caller polling for completions must learn that none will come.
    let r = qp.process_completions(8, |_, _| {});
    assert!(matches!(r, Err(Error::Closed { .. })), "{r:?}");
    drop(qp);
    assert_clean(&m);
}

#[test]
fn in_flight_commands_complete_once_after_close() {
    let m = model();
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    m.inject(Fault::DelayCompletion {
        on: Match::Queue(qp.qid()),
        doorbells: None,
    });
    let buf = m.alloc_dma(4096).unwrap();
    let iova = buf.iova();
    qp.submit(
        upnvme::IoCommand::Read {
            ns: &ns,
            slba: 0,
            blocks: 1,
        },
        Some(buf),
        5,
    )
    .unwrap();
    // The controller is disabled by close(): the device can no longer touch
    // the buffer, so the command must end (once, with an error) and hand it
    // back.
    let from = m.commands_seen().len();
    c.close().unwrap();
    let admin: Vec<u8> = m.commands_seen()[from..]
        .iter()
        .filter(|(sqid, _, _)| *sqid == 0)
        .map(|(_, opcode, _)| *opcode)
        .collect();
    assert_eq!(
        admin,
        [0x00, 0x04],
        "close deletes the live pair's SQ, then its CQ, before CC.SHN"
    );
    assert_eq!(m.delayed_completions(), 0, "the SQ deletion ended it");
    let mut got = Vec::new();
    for _ in 0..3 {
        let _ = qp.process_completions(8, |_, cpl| got.push(cpl));
    }
    assert_eq!(
        got.len(),
        1,
        "exactly one completion for the in-flight command"
    );
    assert_eq!(got[0].tag, 5);
    assert!(got[0].result.is_err());
    assert_eq!(got[0].buffer.as_ref().map(|b| b.iova()), Some(iova));
    drop(qp);
    assert_clean(&m);
}

#[test]
fn queued_commands_are_not_rung_after_close() {
    let m = model();
    let c = open(&m, opts());
    let ns = c.namespace(1).unwrap().clone();
    let mut qp = c.io_queue_pair(QueuePairOptions::default()).unwrap();
    let buf = m.alloc_dma(4096).unwrap();
    qp.queue(
        upnvme::IoCommand::Read {
            ns: &ns,
            slba: 0,
            blocks: 1,
        },
        Some(buf),
        9,
    )
    .unwrap();
    c.close().unwrap();
    let (sq_before, _) = m.doorbell_writes(qp.qid());
    qp.ring();
    let _ = qp.process_completions(8, |_, _| {});
    assert_eq!(
        m.doorbell_writes(qp.qid()).0,
        sq_before,
        "no doorbell write to a disabled controller"
    );
    drop(qp);
    assert_clean(&m);
}

/// The model behind a device that can rewrite what some registers read and
/// records, for every CC write that clears CC.EN, how many DMA buffers of
/// the model were still allocated at that moment.
#[derive(Clone)]
struct RegisterWrap {
    m: ModelController,
    /// Bits of CAP cleared on read.
    cap_clear: u64,
    /// VS value to report instead of the model's.
    vs: Option<u32>,
    /// Live DMA buffers at each CC write with EN = 0.
    at_disable: Arc<Mutex<Vec<usize>>>,
}

impl RegisterWrap {
    fn new(m: &ModelController) -> RegisterWrap {
        RegisterWrap {
            m: m.clone(),
            cap_clear: 0,
            vs: None,
            at_disable: Arc::default(),
        }
    }
}

impl Hooks for RegisterWrap {
    fn model(&self) -> &ModelController {
        &self.m
    }
    fn read32(&self, offset: usize) -> u32 {
        match (offset, self.vs) {
            (0x08, Some(vs)) => vs,
            _ => self.m.read32(offset),
        }
    }
    fn write32(&self, offset: usize, value: u32) {
        if offset == reg::CC && value & 1 == 0 {
            self.at_disable
                .lock()
                .unwrap()
                .push(self.m.live_dma_buffers());
        }
        self.m.write32(offset, value)
    }
    fn read64(&self, offset: usize) -> u64 {
        let v = self.m.read64(offset);
        if offset == reg::CAP {
            v & !self.cap_clear
        } else {
            v
        }
    }
    fn release(&self) -> bool {
        false
    }
}

/// A Doorbell Buffer Config that gets no answer fails bring-up, and its two
/// buffers stay allocated until the controller is disabled: the controller
/// may have taken the command and write EventIdx values there (they were
/// freed before `Inner`'s drop disabled it).
#[test]
fn unanswered_doorbell_buffer_config_keeps_its_buffers_until_disabled() {
    let m = ModelController::new(ModelConfig::default());
    m.inject(Fault::DropCompletion(Match::Opcode {
        qid: 0,
        opcode: admin_op::DBBC,
    }));
    let w = RegisterWrap::new(&m);
    let r = Controller::with_device(
        Front(w.clone()),
        ControllerOptions {
            admin_timeout: Some(Duration::from_millis(200)),
            ..opts()
        },
    );
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    let at = w.at_disable.lock().unwrap().clone();
    let last = *at
        .last()
        .expect("the failed bring-up disabled the controller");
    // Admin SQ + CQ, and the two buffers the unanswered command named.
    assert!(
        last >= 4,
        "only {last} DMA buffers were alive when CC.EN = 0 was written: the shadow \
         doorbell and EventIdx buffers of the unanswered Doorbell Buffer Config were \
         freed while the controller was still enabled (records {at:?})"
    );
}

/// With RTD3E 0h (not reported) the shutdown wait is not CAP.TO (500 ms
/// here) but at least 5 s, as Linux waits: giving up early clears CC.EN in
/// the middle of shutdown processing.
#[test]
fn shutdown_with_rtd3e_zero_outlasts_cap_to() {
    let m = ModelController::new(ModelConfig {
        cap_to: 1,
        rtd3e_us: 0,
        // At least 5500 CSTS reads x 100 us sleep: >= 0.55 s, well under 1 s
        // on an idle machine.
        shutdown_delay_reads: 5500,
        ..ModelConfig::default()
    });
    let c = open(
        &m,
        ControllerOptions {
            ready_timeout: None,
            shutdown_timeout: None,
            ..opts()
        },
    );
    let start = Instant::now();
    let r = c.close();
    let took = start.elapsed();
    assert!(
        r.is_ok(),
        "close gave up after {took:?} on a shutdown still in progress: {r:?}"
    );
}

/// A controller reporting CAP.MQES 0h (invalid: at least 1h) fails
/// bring-up as the device's fault, not as the caller's invalid
/// `admin_queue_entries`.
#[test]
fn cap_mqes_zero_is_not_the_callers_invalid_argument() {
    let m = ModelController::new(ModelConfig::default());
    let mut w = RegisterWrap::new(&m);
    w.cap_clear = 0xffff;
    let r = Controller::with_device(Front(w), opts());
    match r {
        Err(Error::InvalidArgument(what)) => {
            panic!("the device's CAP.MQES 0 reported as the caller's invalid argument: {what}")
        }
        other => assert!(other.is_err(), "{:?}", other.err()),
    }
}

/// An NVMe 1.0 controller (VS 1.0.0), which has no Identify Active
/// Namespace ID list (CNS 02h came with 1.1) and refuses it, comes up: its
/// NSIDs are probed with Identify Namespace (CNS 00h) instead.
#[test]
fn an_nvme_1_0_controller_without_the_active_namespace_list_comes_up() {
    let m = ModelController::new(config_one_ns(4096, 1024));
    m.inject(Fault::Status {
        on: Match::Identify { cns: 0x02, nsid: 0 },
        status: Status::INVALID_FIELD.with_dnr(),
    });
    // Were CNS 06h asked (a 1.0 controller's one-bit CNS field may answer
    // another structure with success), these bytes would read as limits.
    m.set_identify_data(0x06, 0, Some(vec![1, 1, 1, 1, 2, 0, 0, 0, 3]));
    let mut w = RegisterWrap::new(&m);
    w.vs = Some(0x0001_0000);
    let c = Controller::with_device(Front(w), opts());
    match c {
        Ok(c) => {
            assert!(c.namespace(1).is_ok());
            assert_eq!(
                c.nvm_limits(),
                upnvme::queues::IdentifyControllerNvm::default()
            );
        }
        Err(e) => panic!("bring-up of an NVMe 1.0 controller: {e}"),
    }
}

/// A controller at VS 1.1 or later that refuses the Active Namespace ID
/// list (CNS 02h) with a status comes up too: its NSIDs are probed with
/// Identify Namespace. Its NVM Command Set limits (CNS 06h, asked from VS
/// 1.2 on) are read.
#[test]
fn a_controller_that_refuses_the_active_namespace_list_comes_up() {
    let m = ModelController::new(ModelConfig {
        nvm_limits: upnvme_tests::NvmLimitsConfig {
            dmrsl: 64,
            ..Default::default()
        },
        ..config_one_ns(4096, 1024)
    });
    m.inject(Fault::Status {
        on: Match::Identify { cns: 0x02, nsid: 0 },
        status: Status::INVALID_FIELD.with_dnr(),
    });
    let mut w = RegisterWrap::new(&m);
    w.vs = Some(0x0001_0400);
    let c = Controller::with_device(Front(w), opts()).unwrap();
    assert_eq!(c.namespaces().len(), 1);
    assert!(c.namespace(1).is_ok());
    assert_eq!(c.nvm_limits().dmrsl, 64);
}
