//! Controllers (`upnvme_ctrl`): options, open and close, namespace geometry,
//! asynchronous events and the namespace list's refresh.

use std::collections::VecDeque;
use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use upnvme::{
    AsyncEvent, Controller, ControllerOptions, Device, Namespace, NamespaceChanges, PageBacking,
};

/// Options of `upnvme_ctrl_open`. Fill with `upnvme_ctrl_opts_default(&o)`
/// (a header inline: `upnvme_ctrl_opts_init(&o, sizeof o)`), then
/// change fields.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct upnvme_ctrl_opts {
    /// `sizeof(struct upnvme_ctrl_opts)` as the caller's header has it, set by
    /// `upnvme_ctrl_opts_init` / `upnvme_ctrl_opts_default`
    /// (lets later versions add fields; a struct with `size` below 4 is
    /// refused with `UPNVME_EINVAL`).
    pub size: u32,
    /// Back DMA memory with 4 KiB pages instead of 2 MiB hugepages.
    pub no_hugepages: bool,
    /// Use shadow doorbells (Doorbell Buffer Config) when the controller
    /// offers them (default false: MMIO doorbells only; see
    /// `ControllerOptions::shadow_doorbells` for when the buffer pays).
    pub shadow_doorbells: bool,
    /// I/O queue pairs to ask the controller for (Set Features Number of
    /// Queues); 0 = the library's default.
    pub io_queues: u16,
    /// Bound on each admin command in milliseconds; 0 = derived from CAP.TO.
    pub admin_timeout_ms: u32,
}

impl Default for upnvme_ctrl_opts {
    fn default() -> Self {
        let d = ControllerOptions::default();
        upnvme_ctrl_opts {
            size: std::mem::size_of::<upnvme_ctrl_opts>() as u32,
            no_hugepages: false,
            shadow_doorbells: d.shadow_doorbells,
            io_queues: 0,
            admin_timeout_ms: 0,
        }
    }
}

// SAFETY: the two `bool` fields are listed; the others are integers.
unsafe impl crate::status::CallerOptions for upnvme_ctrl_opts {
    const BOOLS: &'static [usize] = &[
        std::mem::offset_of!(upnvme_ctrl_opts, no_hugepages),
        std::mem::offset_of!(upnvme_ctrl_opts, shadow_doorbells),
    ];
}

impl upnvme_ctrl_opts {
    /// The library's options for these.
    pub(crate) fn to_options(self) -> ControllerOptions {
        let mut o = ControllerOptions::default();
        if self.no_hugepages {
            o.page_backing = PageBacking::Small4K;
        }
        o.shadow_doorbells = self.shadow_doorbells;
        if self.io_queues != 0 {
            o.io_queues = self.io_queues;
        }
        if self.admin_timeout_ms != 0 {
            o.admin_timeout = Some(Duration::from_millis(u64::from(self.admin_timeout_ms)));
        }
        o
    }
}

/// What a namespace is (Identify Namespace, current LBA format).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct upnvme_ns_info {
    /// Namespace ID (NSID).
    pub nsid: u32,
    /// Bytes per logical block (2^LBADS).
    pub lba_size: u32,
    /// Namespace Size (NSZE) in logical blocks.
    pub blocks: u64,
    /// NSZE × LBA size.
    pub size_bytes: u64,
    /// Metadata bytes per block (LBAF.MS); Read and Write are refused with
    /// `UPNVME_ENOTSUP` when it is not 0 (the C API moves no metadata).
    pub metadata_size: u16,
    /// FLBAS bit 4: metadata at the end of each block (extended LBA).
    pub metadata_extended: bool,
    /// DPS bits 2:0: protection information type (0 = none).
    pub pi_type: u8,
}

/// An asynchronous event (`upnvme_ctrl_poll_async_events`): the
/// Asynchronous Event Request's completion Dword 0, decoded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct upnvme_async_event {
    /// Asynchronous Event Type (0 error, 1 SMART / Health, 2 notice, 6 I/O
    /// command specific, 7 vendor specific).
    pub event_type: u8,
    /// Asynchronous Event Information (for a notice, 0: Namespace Attribute
    /// Changed — call `upnvme_ctrl_refresh_namespaces`).
    pub event_info: u8,
    /// The log page that tells more (and whose read re-arms the event).
    pub log_page: u8,
    /// Reserved, 0.
    pub reserved: u8,
}

impl From<AsyncEvent> for upnvme_async_event {
    fn from(e: AsyncEvent) -> Self {
        upnvme_async_event {
            event_type: e.event_type,
            event_info: e.event_info,
            log_page: e.log_page,
            reserved: 0,
        }
    }
}

/// The controller's namespace handles as of its last refresh, shared with
/// its queue pairs: a pair that meets a retired handle takes the current
/// ones from here.
pub(crate) type SharedNamespaces = Arc<Mutex<Vec<Namespace>>>;

/// A controller, generic over its device so the host tests can run the C
/// API's logic on the in-memory model.
pub struct Ctrl<D: Device> {
    /// The controller (`None` only once taken by close). Read-locked by
    /// every call on the handle, write-locked by the namespace refresh
    /// (`Controller::refresh_namespaces` replaces the controller's list):
    /// the handle may be shared by threads for every call but close.
    ctrl: RwLock<Option<Controller<D>>>,
    pub(crate) nss: SharedNamespaces,
    /// Events polled but not yet handed out (more than the caller's array
    /// took).
    events: Mutex<VecDeque<AsyncEvent>>,
}

impl<D: Device> Ctrl<D> {
    /// Wraps an open controller.
    pub fn new(c: Controller<D>) -> Ctrl<D> {
        Ctrl {
            nss: Arc::new(Mutex::new(c.namespaces().to_vec())),
            ctrl: RwLock::new(Some(c)),
            events: Mutex::new(VecDeque::new()),
        }
    }

    /// Fills `out` with the asynchronous events that arrived (polling the
    /// admin queue when fewer than `out.len()` are kept from before);
    /// returns how many. A Namespace Attribute Changed notice has already
    /// retired the handles whose namespace changed when it is returned.
    pub(crate) fn poll_events(&self, out: &mut [upnvme_async_event]) -> upnvme::Result<usize> {
        let Some(c) = self.get() else {
            return Err(closed());
        };
        let mut kept = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < out.len() {
            match c.poll_async_events() {
                Ok(new) => kept.extend(new),
                // What was kept is handed out; the error comes next time.
                Err(e) if kept.is_empty() => return Err(e),
                Err(_) => {}
            }
        }
        let n = kept.len().min(out.len());
        for (dst, e) in out.iter_mut().zip(kept.drain(..n)) {
            *dst = e.into();
        }
        Ok(n)
    }

    /// Get Log Page with Retain Asynchronous Event clear
    /// (`Controller::get_log_page`).
    pub(crate) fn get_log_page(
        &self,
        lid: u8,
        nsid: u32,
        len: usize,
        offset: u64,
    ) -> upnvme::Result<Vec<u8>> {
        let Some(c) = self.get() else {
            return Err(closed());
        };
        c.get_log_page(lid, nsid, len, offset)
    }

    /// Reads the namespace list again (`Controller::refresh_namespaces`)
    /// and shares the new handles with the queue pairs.
    /// Waits for the calls in progress on this handle (a write lock).
    pub(crate) fn refresh(&self) -> upnvme::Result<NamespaceChanges> {
        let mut guard = self.ctrl.write().unwrap_or_else(PoisonError::into_inner);
        let Some(c) = guard.as_mut() else {
            return Err(closed());
        };
        let changes = c.refresh_namespaces()?;
        *self.nss.lock().unwrap_or_else(PoisonError::into_inner) = c.namespaces().to_vec();
        Ok(changes)
    }

    /// The controller, read-locked for as long as the returned value
    /// lives; `None` after close.
    pub(crate) fn get(&self) -> Option<CtrlRef<'_, D>> {
        let guard = self.ctrl.read().unwrap_or_else(PoisonError::into_inner);
        guard.is_some().then_some(CtrlRef(guard))
    }

    /// The controller itself, for close.
    pub(crate) fn into_controller(self) -> Option<Controller<D>> {
        self.ctrl
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Geometry of namespace `nsid`.
    pub(crate) fn ns_info(&self, nsid: u32) -> upnvme::Result<upnvme_ns_info> {
        let Some(c) = self.get() else {
            return Err(closed());
        };
        let ns = c.namespace(nsid)?;
        let layout = ns.metadata_layout();
        Ok(upnvme_ns_info {
            nsid,
            lba_size: ns.lba_size(),
            blocks: ns.lba_count(),
            size_bytes: ns.size_bytes(),
            metadata_size: ns.metadata_size(),
            metadata_extended: layout.is_some_and(|l| l.extended),
            pi_type: layout.map_or(0, |l| l.pi_type),
        })
    }
}

/// A read-locked controller of a handle: [`Ctrl::get`] makes one only when
/// the controller is there, and nothing takes it out while the lock is
/// held (close consumes the handle; the refresh's write lock waits).
pub(crate) struct CtrlRef<'a, D: Device>(RwLockReadGuard<'a, Option<Controller<D>>>);

impl<D: Device> Deref for CtrlRef<'_, D> {
    type Target = Controller<D>;

    fn deref(&self) -> &Controller<D> {
        match self.0.as_ref() {
            Some(c) => c,
            // `Ctrl::get` checked it under this same read lock.
            None => unreachable!("a CtrlRef is only made for a present controller"),
        }
    }
}

/// The error for a handle whose controller was closed.
fn closed() -> upnvme::Error {
    upnvme::Error::InvalidArgument("the controller is closed".into())
}
