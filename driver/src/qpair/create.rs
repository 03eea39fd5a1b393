//! Creating a queue pair (Create I/O Completion Queue, then Create I/O
//! Submission Queue) and deleting it on drop.

use std::cell::Cell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::sync::Arc;

use upnvme_dma::{CqMemory, DmaBuffer, DmaPages, ListPages, SqMemory};
use upnvme_queues::prp::list_pages;
use upnvme_queues::regs::{cq_head_doorbell, sq_tail_doorbell};
use upnvme_queues::shadow::{cq_head_offset, sq_tail_offset};
use upnvme_queues::{CidTable, CqRing, SqRing, Sqe};

use super::SglMode;
use super::doorbell::{CqHeadPolicy, Doorbells, ShadowSlots};
use super::{IoQueuePair, PAGE, PERIODIC_POLLS, QueuePairOptions, QueueStats, clock};
use crate::controller::{Controller, CreateFailure, Inner};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::options::MAX_TRANSFER_CAP;

const SQE_BYTES: usize = upnvme_dma::queue_memory::SQE_BYTES;
const CQE_BYTES: usize = upnvme_dma::queue_memory::CQE_BYTES;

impl<D: Device> Controller<D> {
    /// Creates an I/O queue pair: Create I/O Completion Queue (PC = 1, IEN = 0,
    /// no interrupt vector), then Create I/O Submission Queue bound to it.
    ///
    /// Fails with [`Error::NoQueuesLeft`] when every queue the controller
    /// granted is in use.
    pub fn io_queue_pair(&self, options: QueuePairOptions) -> Result<IoQueuePair<D>> {
        IoQueuePair::create(self.inner.clone(), options)
    }
}

impl<D: Device> IoQueuePair<D> {
    fn create(ctrl: Arc<Inner<D>>, opts: QueuePairOptions) -> Result<Self> {
        ctrl.check_usable()?;
        let mqes = ctrl.cap().max_queue_entries().min(65536);
        let check = |what: &str, n: u32| {
            if !(2..=mqes).contains(&n) {
                return Err(Error::InvalidArgument(format!(
                    "{what} of {n}: must be 2..={mqes} (CAP.MQES + 1)"
                )));
            }
            Ok(n)
        };
        if opts.command_timeout == Some(std::time::Duration::ZERO) {
            return Err(Error::InvalidArgument(
                "QueuePairOptions::command_timeout of 0: every command still in flight at the \
                 first timeout scan would be aborted (and the controller reset); pass None to \
                 disable command timeouts, or a positive duration (the default is 30 s)"
                    .into(),
            ));
        }
        let sq_entries = match opts.entries {
            Some(n) => check("queue entries", n)?,
            None => 256.min(mqes / 2).max(2),
        };
        let cq_entries = match opts.cq_entries {
            Some(n) => check("completion queue entries", n)?,
            None => (sq_entries * 2).min(mqes),
        };
        let max_depth = (sq_entries - 1)
            .min(cq_entries - 1)
            .min(upnvme_queues::cid::MAX_SLOTS as u32);
        let cq_slack = cq_entries - 1 - max_depth;
        let cq_threshold = match opts.cq_head_policy {
            CqHeadPolicy::Adaptive { batch } if batch > 0 => cq_slack.min(batch - 1),
            _ => cq_slack,
        };
        // PRP list pages are preallocated per tracker for the largest transfer:
        // cap it so an MDTS of 2 GiB (or none) does not pin gigabytes per queue.
        let max_transfer = ctrl
            .max_transfer()
            .unwrap_or(MAX_TRANSFER_CAP)
            .min(MAX_TRANSFER_CAP);
        // A transfer of max_transfer bytes at any dword offset touches at most
        // this many memory pages; PRP1 covers the first.
        let list_entries = max_transfer / PAGE + 1;
        let list_pages_per_slot = list_pages(list_entries, PAGE).max(1);
        let sgl = ctrl.sgl_support();
        if opts.sgl == SglMode::Always && !sgl.supported() {
            return Err(Error::Unsupported {
                device: ctrl.name().to_string(),
                what: "SGLs for data transfers (QueuePairOptions::sgl = SglMode::Always): \
                       Identify Controller SGLS bits 1:0 are 00b; use SglMode::Auto"
                    .to_string(),
            });
        }

        let dev = ctrl.dev();
        // The SQ and the list pages are only read by the controller: mapped
        // without its write permission where the IOMMU allows.
        let sq = SqMemory::new(
            dev.alloc_dma_device_read_only(sq_entries as usize * SQE_BYTES)?,
            sq_entries,
        )?;
        let cq = CqMemory::new(dev.alloc_dma(cq_entries as usize * CQE_BYTES)?, cq_entries)?;
        let trackers: CidTable<super::Tracker> = CidTable::new(max_depth as u16);
        // One list area per CID slot (slots `0..slots()` are handed out).
        let slots = usize::from(trackers.slots());
        let lists = ListPages::new(
            dev.alloc_dma_device_read_only(slots * list_pages_per_slot * PAGE)?,
            slots as u32,
            list_pages_per_slot * PAGE,
        )?;

        let dstrd = ctrl.cap().dstrd();
        let qid = ctrl.alloc_qid()?;
        let sq_db = sq_tail_doorbell(qid, dstrd);
        let cq_db = cq_head_doorbell(qid, dstrd);
        if cq_db + 4 > dev.bar_len() {
            ctrl.free_qid(qid);
            return Err(Error::Unsupported {
                device: ctrl.name().to_string(),
                what: format!(
                    "doorbells of queue {qid} lie beyond BAR0 ({} bytes)",
                    dev.bar_len()
                ),
            });
        }
        let shadow = match ctrl.shadow() {
            Some(s) => {
                let slots = ShadowSlots {
                    sq: sq_tail_offset(qid, dstrd),
                    cq: cq_head_offset(qid, dstrd),
                };
                // A re-used qid may have left values in the shadow buffer: the
                // new queues start at tail 0 / head 0.
                let zero = |b: &upnvme_dma::SharedWords| -> Result<()> {
                    b.store_release_u32(slots.sq, 0)?;
                    b.store_release_u32(slots.cq, 0)?;
                    Ok(())
                };
                if let Err(e) = zero(&s.doorbells).and_then(|()| zero(&s.event_idx)) {
                    ctrl.free_qid(qid);
                    return Err(e);
                }
                Some(slots)
            }
            None => None,
        };

        let created = match ctrl.create_io_queues(
            Sqe::create_io_cq(qid, cq_entries, cq.buffer().iova(), false, 0),
            Sqe::create_io_sq(qid, sq_entries, sq.buffer().iova(), qid, 0),
            qid,
            "",
        ) {
            Ok(g) => g,
            Err(CreateFailure { error, cq_left, .. }) => {
                let (mut sq, mut cq) = (sq, cq);
                if !matches!(error, Error::Command { .. }) {
                    // No answer (timeout, device fault, controller gone or
                    // fatal): the controller may yet create the queues and
                    // use their memory, so it stays until the controller is
                    // disabled (which such a failure calls for anyway).
                    ctrl.quarantine(vec![sq.detach_pages(), cq.detach_pages()]);
                    ctrl.free_qid(qid);
                } else if let Some(generation) = cq_left {
                    // The SQ was refused and the CQ could not be deleted
                    // again: it exists, on this memory, under this ID, until
                    // the controller is next disabled.
                    ctrl.quarantine(vec![cq.detach_pages()]);
                    ctrl.hold_qid(qid, generation);
                } else {
                    // A status answer, and the CQ (if created) deleted
                    // again: nothing exists.
                    ctrl.free_qid(qid);
                }
                return Err(error);
            }
        };
        let timeout_ticks = opts.command_timeout.map_or(0, |d| clock::ticks(d).max(1));
        let announce_shadow = if opts.shadow_doorbells {
            opts.sq_announce.free_below(trackers.usable())
        } else {
            0
        };
        let generation = created.generation;
        let (slots, shadow) = (shadow, shadow.filter(|_| created.shadow_on));
        let domain = sq.buffer().domain();
        let mut qp = IoQueuePair {
            expect_state: 0,
            sq,
            sq_ring: SqRing::new(sq_entries).map_err(|e| Error::InvalidArgument(e.to_string()))?,
            cq,
            cq_ring: CqRing::new(cq_entries).map_err(|e| Error::InvalidArgument(e.to_string()))?,
            trackers,
            doorbells: Doorbells {
                sq_db,
                cq_db,
                shadow,
                slots,
                use_event_idx: opts.shadow_doorbells,
                last_sq: 0,
                last_cq: 0,
            },
            cq_threshold,
            qid,
            qid_dw2: u32::from(qid) << 16,
            announce_free_below: if shadow.is_some() { announce_shadow } else { 0 },
            announce_shadow,
            // `cq_threshold` is at most the CQ size: no overflow.
            reap_due_at: if opts.cq_head_policy == CqHeadPolicy::EveryReap {
                0
            } else {
                cq_threshold + 1
            },
            reap_on_submit: opts.reap_on_submit,
            poll_countdown: PERIODIC_POLLS,
            csts_due: 0,
            instance: ctrl.instance(),
            domain,
            max_transfer,
            sgl,
            sgl_mode: opts.sgl,
            sgl_threshold: ctrl
                .sgl_descriptor_threshold()
                .map_or(usize::MAX, usize::from),
            oncs: ctrl.oncs(),
            limits: super::limits::SizeLimits::new(ctrl.nvm_limits, ctrl.cap().min_page_size()),
            inline_prp_end: if opts.sgl == SglMode::Always {
                0
            } else {
                2 * PAGE
            },
            stats: QueueStats::default(),
            ready: VecDeque::with_capacity(max_depth as usize),
            splits: super::split::Splits::default(),
            max_depth,
            pending: 0,
            failed: false,
            needs_recreate: false,
            recreated_maybe: false,
            recreate_retry: Default::default(),
            deleted: false,
            closing: false,
            drain_deadline: None,
            generation,
            lists,
            prp_scratch: vec![0u64; list_pages_per_slot * PAGE / 8].into_boxed_slice(),
            backoff: opts.backoff,
            timeout_ticks,
            ctrl,
            _not_sync: PhantomData::<Cell<()>>,
        };
        qp.refresh_expect_state();
        Ok(qp)
    }
}

impl<D: Device> IoQueuePair<D> {
    /// Delete I/O SQ, then Delete I/O CQ (the controller completes or aborts
    /// every command of the SQ before that deletion completes). True when
    /// the device can no longer touch the queues or any command's buffer:
    /// both deletions succeeded, or a reset already deleted the queues. With
    /// `between` the CQ is reaped after the SQ is gone (what the deletion
    /// ended is delivered to it) and before the CQ goes.
    pub(super) fn delete_queues(&mut self, mut between: impl FnMut(&mut Self)) -> bool {
        if self.deleted {
            return true;
        }
        let generation = self.ctrl.generation();
        if generation != self.generation || (self.needs_recreate && !self.recreated_maybe) {
            // A reset disabled the controller since these queues were created
            // (and no re-creation is pending an answer): they no longer exist
            // and nothing can reach their memory.
            self.deleted = true;
            return true;
        }
        let sq = self.ctrl.is_usable()
            && self
                .ctrl
                .admin_command(Sqe::delete_io_sq(self.qid), "Delete I/O Submission Queue")
                .is_ok();
        if sq {
            between(self);
            if self.ctrl.generation() != generation {
                // A reset came in between (seen by `between`'s reap, or
                // from another thread): it disabled the controller, which
                // deleted the CQ too. Asking for that deletion now would be
                // refused (no such queue) and leave the pair believing its
                // queues live.
                self.deleted = true;
                return true;
            }
        }
        let deleted = sq
            && self
                .ctrl
                .admin_command(Sqe::delete_io_cq(self.qid), "Delete I/O Completion Queue")
                .is_ok();
        self.deleted = deleted;
        deleted
    }
}

/// Dropping a pair deletes its queues. Commands still in flight are not
/// delivered: once the controller confirmed the deletion (or a reset
/// disabled it meanwhile) their buffers are freed; if it did not (a failed
/// controller), the buffers and the queues' memory are quarantined until
/// the controller is disabled. To get every
/// command back, exactly once, call [`IoQueuePair::close`] instead.
impl<D: Device> Drop for IoQueuePair<D> {
    fn drop(&mut self) {
        // After a close whose deletion was not confirmed, no second try: it
        // could succeed and free buffers whose commands close did not hand
        // back (the close's contract is to keep them until the controller
        // is disabled).
        let deleted = if self.closing {
            self.deleted
        } else {
            // A reset from another thread that disabled the controller while
            // the deletion waited (it then failed: no such queue) removed the
            // queues as well: nothing can reach their memory any more.
            self.delete_queues(|_| {}) || self.generation_changed()
        };
        if !deleted {
            // The device may still DMA: keep everything it could touch alive
            // until the controller is disabled.
            let mut keep: Vec<DmaPages> = self
                .trackers
                .values_mut()
                .flat_map(super::Tracker::take_buffers)
                .map(DmaBuffer::into_pages)
                .collect();
            keep.extend(self.splits.take_buffers().map(DmaBuffer::into_pages));
            keep.push(self.sq.detach_pages());
            keep.push(self.cq.detach_pages());
            keep.push(self.lists.detach_pages());
            self.ctrl.quarantine(keep);
            // The queues may still exist under this ID: a Create with it
            // would fail until the controller is next disabled.
            self.ctrl.hold_qid(self.qid, self.generation);
            return;
        }
        self.ctrl.free_qid(self.qid);
    }
}
