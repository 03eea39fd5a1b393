//! The controller's namespace list: reading it (bring-up,
//! [`Controller::refresh_namespaces`]) and following its changes.
//!
//! A namespace can change under the driver's handles without anything the
//! driver sent: another host (or another controller of the subsystem)
//! formats it, resizes it, detaches it. A handle that kept the old geometry
//! would size transfers wrongly — a Read of one block into a 512-byte
//! buffer moving 4096 bytes after a format to 4 KiB blocks. So, when the
//! controller offers Namespace Attribute Notices (Identify Controller OAES
//! bit 8), the driver enables them (Set Features, Asynchronous Event
//! Configuration bit 8) at bring-up, and every reset sets the configuration
//! again (the driver's, or the one the application set last, which may
//! leave them off: a notice gap, below). When
//! [`Controller::poll_async_events`] meets a Notice / Namespace Attribute
//! Changed event, it reads the Changed Namespace List (log 04h, which also
//! re-arms the event) and Identify Namespace of each namespace listed, and
//! retires every handle whose geometry changed or whose namespace is gone —
//! including one deleted and created again under the same NSID, which
//! Identify Namespace tells by its NGUID or EUI64: queue pairs refuse it
//! ([`crate::Reject::StaleNamespace`]).
//! [`Controller::refresh_namespaces`] then reads the list again and hands
//! out new handles.
//!
//! What no notice can close: a command submitted between the change and the
//! poll that retires the handle still carries the old geometry. Poll the
//! events regularly (a management thread) where other hosts share the
//! namespaces.
//!
//! When the notices cannot be relied on (`NoticeGaps`: the controller has
//! them off, the Changed Namespace List could not be read, another Notice's
//! log page is unread, or no Asynchronous Event Request is outstanding),
//! every poll checks every handle instead of waiting for a notice that
//! cannot come.
//!
//! A check that meets a transient status (`Status::is_transient`: the
//! namespace is not ready while another host formats it) keeps that handle
//! and checks it again at the next poll. A namespace found attached without
//! a notice is announced (an event of the driver's own) once per
//! [`Controller::refresh_namespaces`].

use std::sync::atomic::{AtomicBool, Ordering};

use upnvme_queues::{AsyncEvent, IdentifyNamespace, Sqe, cns, feature, log_id, parse_ns_list};

use crate::controller::{Controller, Inner};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::namespace::Namespace;

/// Why a Namespace Attribute Changed notice may not come although a
/// namespace changed, beyond a reset (`Inner::namespaces_unverified`).
/// While any holds, [`Controller::poll_async_events`] checks every handle
/// at every call.
#[derive(Debug, Default)]
pub(crate) struct NoticeGaps {
    /// The notices are off: the controller does not offer them (Identify
    /// Controller OAES bit 8), or refused the Asynchronous Event
    /// Configuration at bring-up or after the last reset.
    off: AtomicBool,
    /// A read of the Changed Namespace List (log 04h) failed: the
    /// controller keeps Notices masked until that log is read with Retain
    /// Asynchronous Event clear, which every poll tries again.
    list_owed: AtomicBool,
    // (A Notice whose log page is unread is the admin queue's to know:
    // `AdminQueue::notice_masked`, set when it reaps the event and cleared
    // when a Get Log Page of that log with RAE clear completes.)
}

impl NoticeGaps {
    /// The notices are on (`false`) or off (`true`).
    pub(crate) fn set_off(&self, off: bool) {
        self.off.store(off, Ordering::Release);
    }

    /// A controller reset cleared every event mask.
    pub(crate) fn reset(&self) {
        self.list_owed.store(false, Ordering::Release);
    }

    /// Whether any gap holds now.
    pub(crate) fn any(&self) -> bool {
        self.off.load(Ordering::Acquire) || self.list_owed.load(Ordering::Acquire)
    }

    /// Log `lid` was read with RAE clear by the application. Returns whether
    /// it was the Changed Namespace List: the controller cleared it, so
    /// what it named (changes the driver has not followed yet: owed after
    /// a failed read, or behind a notice not yet handed out) the driver's
    /// next read will not name, and every handle must be checked once.
    /// (Before, only an owed list was: a change the application's read took
    /// between a notice and the poll that followed it left its handle
    /// current when a later change made the driver's list non-empty.)
    pub(crate) fn log_read(&self, lid: u8) -> bool {
        if lid != log_id::CHANGED_NS_LIST {
            return false;
        }
        self.list_owed.store(false, Ordering::Release);
        true
    }
}

/// Asynchronous Event Configuration (Feature 0Bh) bit 8: Namespace Attribute
/// Notices.
const AEC_NAMESPACE_ATTRIBUTE_NOTICES: u32 = 1 << 8;

/// How many NSIDs a controller without the Active Namespace ID list (NVMe
/// 1.0) is probed for, one Identify Namespace each: namespaces above it are
/// not found. Such controllers report a handful (NN).
const PROBED_NSIDS_MAX: u32 = 1024;

/// The Changed Namespace List's size: 1024 NSIDs.
const CHANGED_NS_LIST_LEN: usize = 4096;

/// The Changed Namespace List's first entry when more than 1024 namespaces
/// changed.
const CHANGED_NS_LIST_OVERFLOW: u32 = 0xffff_ffff;

/// What one namespace's Identify told a check ([`Controller::follow_namespace_changes`]).
enum Checked {
    /// Its current geometry, as a handle.
    Handle(Namespace),
    /// Inactive, unusable or refused: a handle of it is retired (the safe
    /// side).
    Unusable,
    /// Not known now (a transient status): kept, checked again.
    Transient,
    /// The controller failed or went away: the check stops there.
    ControllerDown,
}

/// What a scan of the namespace list found.
pub(crate) struct Scanned {
    /// The active namespaces the driver can use.
    pub(crate) namespaces: Vec<Namespace>,
    /// Those it cannot, with why.
    pub(crate) unusable: Vec<(u32, String)>,
    /// Those of `unusable` whose Identify met a transient status (not
    /// ready now): checked again at every poll ([`Inner::note_unready`]).
    pub(crate) unready: Vec<u32>,
}

/// What [`Controller::refresh_namespaces`] found, by NSID (ascending).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceChanges {
    /// Namespaces listed now and not before (attached or created), usable
    /// or not.
    pub added: Vec<u32>,
    /// Namespaces listed before and gone now (detached or deleted): their
    /// handles are retired.
    pub removed: Vec<u32>,
    /// Namespaces whose geometry (size, LBA format, metadata, protection
    /// information) or identity (NGUID, EUI64: deleted and created again
    /// under the same NSID) changed, or that became usable or unusable: old
    /// handles are retired, [`Controller::namespace`] gives the new one.
    pub changed: Vec<u32>,
}

impl NamespaceChanges {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

impl<D: Device> Inner<D> {
    /// The Asynchronous Event Configuration a reset sets again, if any.
    pub(crate) fn aec_to_restore(&self) -> Option<u32> {
        let v = self.aec.load(Ordering::Acquire);
        (v >> 32 != 0).then_some(v as u32)
    }

    /// The application set Asynchronous Event Configuration to `cdw11`
    /// (a Set Features the controller accepted): resets set that value
    /// again, and without Namespace Attribute Notices in it (or on a
    /// controller that does not offer them) no namespace notice comes —
    /// every poll then checks every handle.
    pub(crate) fn aec_set_by_application(&self, cdw11: u32) {
        self.aec
            .store(1 << 32 | u64::from(cdw11), Ordering::Release);
        self.notice_gaps.set_off(!self.notices_on_with(cdw11));
        // A namespace changed while they were off raised no notice, and
        // none comes for it now: the next poll checks every handle.
        self.namespaces_unverified.store(true, Ordering::Release);
    }

    /// Records `nsids` (attached namespaces no handle or unusable entry
    /// names) as announced to the application; true when one was not
    /// before (an event is due). Emptied by `refresh_namespaces`.
    pub(crate) fn announced_attached(&self, nsids: impl Iterator<Item = u32>) -> bool {
        let mut announced = self
            .attached_announced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let before = announced.len();
        for n in nsids {
            if !announced.contains(&n) {
                announced.push(n);
            }
        }
        announced.len() > before
    }

    /// The namespaces a scan found not ready (`Scanned::unready`) replace
    /// those noted before; while any is noted, every poll checks them.
    pub(crate) fn note_unready(&self, nsids: Vec<u32>) {
        let any = !nsids.is_empty();
        *self
            .unready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = nsids;
        if any {
            self.namespaces_unverified.store(true, Ordering::Release);
        }
    }

    /// The namespaces noted not ready.
    pub(crate) fn unready(&self) -> Vec<u32> {
        self.unready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Namespace `nsid` is no longer to be checked as not ready (it is
    /// ready, or unusable for good: the application's refresh says which).
    pub(crate) fn ready_again(&self, nsid: u32) {
        self.unready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|&n| n != nsid);
    }

    /// Whether Asynchronous Event Configuration `aec`, once accepted,
    /// turns Namespace Attribute Notices on (the controller offers them and
    /// bit 8 is set).
    pub(crate) fn notices_on_with(&self, aec: u32) -> bool {
        self.identify.oaes_namespace_attribute_notices()
            && aec & AEC_NAMESPACE_ATTRIBUTE_NOTICES != 0
    }

    /// Identify Active Namespace ID list (CNS 02h), then Identify Namespace of
    /// each: the handles, and the namespaces that cannot be used with why.
    ///
    /// The list is untrusted: only NSIDs 1..=min(NN, FFFFFFFEh), each once, in
    /// ascending order; a list that does not advance ends the paging (a device
    /// that ignores the starting NSID would otherwise loop forever).
    pub(crate) fn scan_namespaces(&self) -> Result<Scanned> {
        let nsids = self.active_nsids()?;
        let mut namespaces = Vec::new();
        let mut unusable = Vec::new();
        let mut unready = Vec::new();
        for nsid in nsids {
            // One namespace the driver cannot use (an Identify refused with a
            // status, a format it has no code for) does not fail the others.
            match self.namespace_handle(nsid) {
                Ok(Ok(ns)) => namespaces.push(ns),
                Ok(Err(why)) => unusable.push((nsid, why)),
                Err(e @ Error::Command { status, .. }) if status.is_transient() => {
                    unusable.push((
                        nsid,
                        format!(
                            "not ready now ({e}): every Controller::poll_async_events checks it \
                             again and returns a Namespace Attribute Changed event once it is; \
                             Controller::refresh_namespaces then hands out its handle"
                        ),
                    ));
                    unready.push(nsid);
                }
                Err(e @ Error::Command { .. }) => {
                    unusable.push((nsid, format!("Identify Namespace failed: {e}")));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Scanned {
            namespaces,
            unusable,
            unready,
        })
    }

    /// Identify Active Namespace ID list (CNS 02h), every page: the active
    /// NSIDs, ascending, each once (the list is untrusted, see
    /// [`Inner::scan_namespaces`]).
    ///
    /// NVMe 1.0 has no such list (CNS 02h came with 1.1): below VS 1.1, or
    /// when the controller refuses CNS 02h with a status, the NSIDs are
    /// probed one by one instead ([`Inner::probe_nsids`]), as Linux and SPDK
    /// do.
    pub(crate) fn active_nsids(&self) -> Result<Vec<u32>> {
        let max_nsid = self.identify.nn.min(0xffff_fffe);
        if (self.vs.major(), self.vs.minor()) < (1, 1) {
            return self.probe_nsids(max_nsid);
        }
        let mut nsids = Vec::new();
        let mut start = 0u32;
        for _page in 0..4096 {
            let data = match self.identify_raw(cns::ACTIVE_NSID_LIST, start) {
                Ok(d) => d,
                Err(Error::Command { .. }) if start == 0 => return self.probe_nsids(max_nsid),
                Err(e) => return Err(e),
            };
            let ids = parse_ns_list(&data);
            let full = ids.len() == 1024;
            let last = ids.iter().copied().max();
            nsids.extend(
                ids.into_iter()
                    .filter(|&n| n > start && n >= 1 && n <= max_nsid),
            );
            match last {
                Some(l) if full && l > start && l < max_nsid => start = l,
                _ => break,
            }
        }
        nsids.sort_unstable();
        nsids.dedup();
        Ok(nsids)
    }

    /// The active NSIDs without the Active Namespace ID list: Identify
    /// Namespace (CNS 00h) of NSIDs 1..=min(`max_nsid`,
    /// [`PROBED_NSIDS_MAX`]), each active when its NSZE is not 0. An NSID
    /// the controller refuses with a status (Invalid Namespace or Format) is
    /// not active.
    fn probe_nsids(&self, max_nsid: u32) -> Result<Vec<u32>> {
        let mut nsids = Vec::new();
        for nsid in 1..=max_nsid.min(PROBED_NSIDS_MAX) {
            let data = match self.identify_raw(cns::NAMESPACE, nsid) {
                Ok(d) => d,
                Err(Error::Command { .. }) => continue,
                Err(e) => return Err(e),
            };
            let idns = IdentifyNamespace::parse(&data)
                .map_err(|e| self.fault(format!("Identify Namespace {nsid}: {e}")))?;
            if idns.is_active() {
                nsids.push(nsid);
            }
        }
        Ok(nsids)
    }

    /// Enables Namespace Attribute Notices when the controller offers them
    /// (OAES bit 8): Get Features then Set Features Asynchronous Event
    /// Configuration with bit 8 added to its current value. Returns the
    /// value set (for the resets to set again), `None` when not offered or
    /// refused with a status (no notices then: a namespace changed by
    /// someone else goes unnoticed, as on a controller without them).
    pub(crate) fn enable_namespace_notices(&self) -> Result<Option<u32>> {
        // (See `aec_set_by_application` for a value set later.)
        if !self.identify.oaes_namespace_attribute_notices() {
            return Ok(None);
        }
        let what = "Get Features (Asynchronous Event Configuration)";
        let current = match self.execute(
            Sqe::get_features(feature::ASYNC_EVENT_CONFIG, 0, 0),
            None,
            what,
        ) {
            Ok((cqe, _)) => cqe.dw0(),
            Err(Error::Command { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let aec = current | AEC_NAMESPACE_ATTRIBUTE_NOTICES;
        let what = "Set Features (Asynchronous Event Configuration, Namespace Attribute Notices)";
        match self.execute(
            Sqe::set_features(feature::ASYNC_EVENT_CONFIG, aec, false),
            None,
            what,
        ) {
            Ok(_) => Ok(Some(aec)),
            Err(Error::Command { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl<D: Device> Controller<D> {
    /// After `events` came in: for a Namespace Attribute Changed notice,
    /// reads the Changed Namespace List (log 04h, Retain Asynchronous Event
    /// clear: the notice is re-armed) and retires the handles of every
    /// listed namespace whose geometry or identity (NGUID, EUI64) changed
    /// or that is gone. When the
    /// list cannot be read, is empty (someone else read it first: the
    /// notice still says something changed), or says more than 1024
    /// namespaces changed, every handle is checked; a handle whose
    /// Identify is refused with a status, or answers data that does not
    /// parse or says the namespace is inactive, is retired (the safe side;
    /// [`Controller::refresh_namespaces`] then says what is left). A
    /// controller-level failure (a timeout, a fatal or failed controller,
    /// gone, removed, closed) says nothing about the namespace: the check
    /// stops, keeps the handles left, and runs again at the next poll (a
    /// failed controller runs no I/O until a reset, which checks them).
    /// `unverified` (a reset happened: a change in its window raised no
    /// notice) checks every handle, notice or not, and reads the Active
    /// Namespace ID list for namespaces attached meanwhile.
    /// Returns whether the application must be told (a Namespace Attribute
    /// Changed event, should none have come): a handle was retired, or —
    /// after a reset — a namespace the controller lists is not one this
    /// controller knows (a handle or an unusable namespace).
    pub(crate) fn follow_namespace_changes(&self, events: &[AsyncEvent], unverified: bool) -> bool {
        let noticed = events
            .iter()
            .any(AsyncEvent::is_namespace_attribute_changed);
        if !noticed && !unverified {
            return false;
        }
        // Read after a notice, and after a failed read until one succeeds:
        // the controller sends no further Notice until this log is read
        // with RAE clear.
        let owed = self.inner.notice_gaps.list_owed.load(Ordering::Acquire);
        let listed = if noticed || owed {
            let page =
                self.read_log_page(log_id::CHANGED_NS_LIST, 0xffff_ffff, CHANGED_NS_LIST_LEN, 0);
            self.inner
                .notice_gaps
                .list_owed
                .store(page.is_err(), Ordering::Release);
            page.map(|page| parse_ns_list(&page)).ok()
        } else {
            None
        };
        // A namespace the list names that this controller does not know
        // (attached) is announced by the controller's own notice: not again
        // by a later check.
        if let Some(ids) = &listed {
            self.inner
                .announced_attached(ids.iter().copied().filter(|&n| !self.knows(n)));
        }
        let changed: Vec<&Namespace> = match &listed {
            Some(ids)
                if !unverified
                    && !ids.is_empty()
                    && ids.first() != Some(&CHANGED_NS_LIST_OVERFLOW) =>
            {
                self.namespaces
                    .iter()
                    .filter(|ns| ids.contains(&ns.id()))
                    .collect()
            }
            // Overflow, an empty or unreadable list, or a reset: any
            // namespace may have changed.
            _ => self.namespaces.iter().collect(),
        };
        let mut retired = false;
        for old in changed {
            let keep = match self.check_namespace(old.id()) {
                Checked::Handle(fresh) => fresh.same_namespace(old),
                Checked::ControllerDown => break,
                Checked::Transient => true,
                Checked::Unusable => false,
            };
            if !keep {
                retired |= !old.is_stale();
                old.retire();
            }
        }
        // Both run: an attach found beside a retirement is recorded as
        // announced (the one event covers both).
        let attached = unverified && self.a_namespace_was_attached();
        let ready = unverified && self.an_unready_namespace_changed();
        retired || attached || ready
    }

    /// Identify Namespace `nsid` for a check. Where the outcome says
    /// nothing final (a transient status, the controller down), the next
    /// poll checks again (`namespaces_unverified`).
    fn check_namespace(&self, nsid: u32) -> Checked {
        let again = || {
            self.inner
                .namespaces_unverified
                .store(true, Ordering::Release);
        };
        match self.inner.namespace_handle(nsid) {
            Ok(Ok(fresh)) => Checked::Handle(fresh),
            // The controller failed, timed out, went away or was closed:
            // that says nothing about this namespace. The check stops; the
            // handles left are kept (no I/O runs on a failed controller
            // until a reset, which checks them itself).
            Err(
                Error::Timeout { .. }
                | Error::ControllerFailed { .. }
                | Error::ControllerFatal { .. }
                | Error::ControllerGone { .. }
                | Error::ControllerRemoved { .. }
                | Error::Closed { .. },
            ) => {
                again();
                Checked::ControllerDown
            }
            // The namespace is passing through a state (another host
            // formats or sanitizes it, an ANA transition): its geometry is
            // not known now (I/O meanwhile gets the same status from the
            // controller).
            Err(Error::Command { status, .. }) if status.is_transient() => {
                again();
                Checked::Transient
            }
            // Inactive, unusable, refused with a status, or Identify data
            // that does not parse.
            _ => Checked::Unusable,
        }
    }

    /// Whether this controller has a handle for `nsid` or knows it as
    /// unusable.
    fn knows(&self, nsid: u32) -> bool {
        self.namespaces.iter().any(|h| h.id() == nsid) || self.unusable.iter().any(|u| u.0 == nsid)
    }

    /// Identify Namespace of every namespace a scan found not ready: true
    /// when one is ready now (or is unusable for good), so that the
    /// application refreshes; one still not ready keeps the next poll
    /// checking. A controller-level failure stops the check (the next
    /// poll checks again).
    fn an_unready_namespace_changed(&self) -> bool {
        let unready = self.inner.unready();
        let mut changed = false;
        for n in unready {
            match self.check_namespace(n) {
                Checked::Transient => {}
                Checked::ControllerDown => break,
                Checked::Handle(_) | Checked::Unusable => {
                    self.inner.ready_again(n);
                    changed = true;
                }
            }
        }
        changed
    }

    /// True when the Active Namespace ID list names a namespace that is
    /// neither a handle of this controller nor one of its unusable
    /// namespaces, and that no earlier check announced since the last
    /// [`Controller::refresh_namespaces`]: attached while nothing announced
    /// it (inside a reset, or while notices cannot come). An unreadable list
    /// says nothing (the handles' check above already covered what can be
    /// known).
    fn a_namespace_was_attached(&self) -> bool {
        let Ok(ids) = self.inner.active_nsids() else {
            return false;
        };
        self.inner
            .announced_attached(ids.into_iter().filter(|&n| !self.knows(n)))
    }

    /// Reads the namespace list again (Identify Active Namespace ID list,
    /// then Identify Namespace of each) and replaces the controller's: new
    /// namespaces get handles, and the handles of namespaces that are gone
    /// or whose geometry (size, LBA format, metadata, protection
    /// information) or identity (NGUID, EUI64: another namespace created
    /// under the NSID) changed are retired, so queue pairs refuse them
    /// ([`crate::Reject::StaleNamespace`]); take new ones with
    /// [`Controller::namespace`]. Handles of namespaces that did not change
    /// stay valid (a handle's Identify data is as of when it was taken;
    /// [`Controller::identify_namespace`] reads it afresh). Call it after [`Controller::poll_async_events`] returned
    /// a Namespace Attribute Changed notice
    /// ([`AsyncEvent::is_namespace_attribute_changed`]), or whenever the
    /// namespaces may have changed (another host attached one).
    ///
    /// On an error (the controller does not answer), nothing is replaced.
    pub fn refresh_namespaces(&mut self) -> Result<NamespaceChanges> {
        self.inner.check_usable()?;
        // Whatever was announced is the application's to see in this
        // refresh; should it fail, a later check announces it again.
        self.inner
            .attached_announced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
        let Scanned {
            mut namespaces,
            mut unusable,
            mut unready,
        } = self.inner.scan_namespaces()?;
        // A namespace not ready now (another host formats it) whose handle
        // is current keeps it: the handle is checked again at every poll
        // until it is ready, and retired then if its geometry changed.
        unready.retain(|&n| {
            let Some(old) = self
                .namespaces
                .iter()
                .find(|h| h.id() == n && !h.is_stale())
            else {
                return true;
            };
            unusable.retain(|u| u.0 != n);
            let at = namespaces.partition_point(|h| h.id() < n);
            namespaces.insert(at, old.clone());
            self.inner
                .namespaces_unverified
                .store(true, Ordering::Release);
            false
        });
        let mut changes = NamespaceChanges::default();
        let listed_before = |n: u32| {
            self.namespaces.iter().any(|h| h.id() == n) || self.unusable.iter().any(|u| u.0 == n)
        };
        let now: Vec<u32> = namespaces
            .iter()
            .map(Namespace::id)
            .chain(unusable.iter().map(|u| u.0))
            .collect();
        let listed_now = |n: u32| now.contains(&n);
        for old in &self.namespaces {
            match namespaces.iter().find(|h| h.id() == old.id()) {
                Some(fresh) if fresh.same_namespace(old) && !old.is_stale() => {}
                Some(_) => {
                    old.retire();
                    changes.changed.push(old.id());
                }
                None => {
                    old.retire();
                    if listed_now(old.id()) {
                        changes.changed.push(old.id());
                    } else {
                        changes.removed.push(old.id());
                    }
                }
            }
        }
        // An unchanged namespace keeps its handle (not the fresh one): the
        // clones the application holds must be the ones a later change
        // retires.
        let namespaces: Vec<Namespace> = namespaces
            .into_iter()
            .map(|fresh| {
                match self
                    .namespaces
                    .iter()
                    .find(|old| old.id() == fresh.id() && !old.is_stale())
                {
                    Some(old) => old.clone(),
                    None => fresh,
                }
            })
            .collect();
        for (n, _) in &self.unusable {
            if namespaces.iter().any(|h| h.id() == *n) {
                changes.changed.push(*n);
            } else if !listed_now(*n) {
                changes.removed.push(*n);
            }
        }
        for &n in &now {
            if !listed_before(n) {
                changes.added.push(n);
            }
        }
        for v in [
            &mut changes.added,
            &mut changes.removed,
            &mut changes.changed,
        ] {
            v.sort_unstable();
            v.dedup();
        }
        self.namespaces = namespaces;
        self.unusable = unusable;
        self.inner.note_unready(unready);
        Ok(changes)
    }
}
