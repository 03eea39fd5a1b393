//! Admin commands the application sends: what `admin_passthrough` refuses
//! (the commands the driver owns), how many bytes a command moves through
//! its data pointer, and [`AdminHandle`], which sends them without
//! borrowing the [`crate::Controller`]. The wait itself is `Inner`'s
//! (`application_passthrough`, `execute_detached`: docs/DESIGN.md).

use std::sync::{Arc, Weak};
use std::time::Duration;

use upnvme_queues::sqe::opcode::admin as admin_op;
use upnvme_queues::{Cqe, Sqe, feature};

use crate::controller::Inner;
use crate::device::{Device, VfioNvme};
use crate::error::{Error, Result};

/// Admin commands of a controller through a handle that does not borrow
/// the [`crate::Controller`] ([`crate::Controller::admin_handle`]): a thread can wait for
/// a long one (a Firmware Commit, a vendor's command) while another holds
/// the controller mutably ([`crate::Controller::refresh_namespaces`],
/// [`crate::Controller::format_nvm`]) — what a binding that guards the controller
/// with a lock needs, so that the lock is not held for the command's
/// length (the C API does this). Cheap to clone. It does not keep the
/// controller alive: once the controller is closed or dropped (with its
/// queue pairs) its calls fail with [`Error::Closed`], and a command it
/// has outstanding when the controller is closed ends with it too.
#[derive(Clone)]
pub struct AdminHandle<D: Device = VfioNvme> {
    inner: Weak<Inner<D>>,
    device: String,
}

impl<D: Device> std::fmt::Debug for AdminHandle<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminHandle")
            .field("device", &self.device)
            .finish()
    }
}

impl<D: Device> AdminHandle<D> {
    pub(crate) fn new(inner: &Arc<Inner<D>>) -> AdminHandle<D> {
        AdminHandle {
            inner: Arc::downgrade(inner),
            device: inner.name().to_string(),
        }
    }

    /// The controller's state for one call: held for the call's length only.
    fn inner(&self) -> Result<Arc<Inner<D>>> {
        self.inner.upgrade().ok_or_else(|| Error::Closed {
            device: self.device.clone(),
        })
    }

    /// [`crate::Controller::admin_passthrough`].
    pub fn admin_passthrough(
        &self,
        sqe: Sqe,
        data_len: usize,
        data_out: Option<&[u8]>,
    ) -> Result<(Cqe, Vec<u8>)> {
        let inner = self.inner()?;
        inner.application_passthrough(sqe, data_len, data_out, inner.admin_timeout)
    }

    /// [`crate::Controller::admin_passthrough_with_timeout`].
    pub fn admin_passthrough_with_timeout(
        &self,
        sqe: Sqe,
        data_len: usize,
        data_out: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<(Cqe, Vec<u8>)> {
        self.inner()?
            .application_passthrough(sqe, data_len, data_out, timeout)
    }
}

/// For a feature whose value is a data structure in host memory (NVMe 2.0,
/// Figure "Feature Identifiers"), why `get_features`/`set_features` (which
/// send no data pointer) cannot carry it, given CDW11 and whether it is
/// Set Features.
pub(crate) fn feature_data(fid: u8, cdw11: u32, set: bool) -> Option<String> {
    let (name, bytes) = feature::structure(fid, cdw11, set)?;
    let bytes = match fid {
        feature::HOST_IDENTIFIER => "8 bytes, 16 with CDW11.EXHID".to_string(),
        feature::FDP_EVENTS if set => "NOET bytes, CDW11 bits 23:16".to_string(),
        feature::FDP_EVENTS => "2 × NOET bytes, CDW11 bits 23:16".to_string(),
        _ => format!("{bytes} bytes"),
    };
    Some(format!(
        "{name} is a data structure in host memory, which this call does not transfer: use \
         admin_passthrough with its length ({bytes})"
    ))
}

/// The bytes an admin command moves through its data pointer where its
/// SQE fixes them (NVMe 2.0 base specification), with the command's name:
/// Identify (4096), Get Log Page ((NUMDU:NUMDL + 1) × 4), Firmware Image
/// Download ((NUMD + 1) × 4), Directive Send / Receive ((NUMD + 1) × 4
/// when NUMD is not 0: several directive operations move nothing and are
/// sent with NUMD 0, as libnvme does), Security Send / Receive (CDW11 TL /
/// AL), Get LBA Status ((MNDW + 1) × 4), Get / Set Features of a feature
/// that is a data structure (not Get Features SEL 011b, Supported
/// Capabilities, answered in dword 0). `None`: the length is not known here
/// (vendor-specific commands, commands without data).
pub(crate) fn admin_transfer(sqe: &Sqe) -> Option<(&'static str, u64)> {
    let dwords = |numd: u32| (u64::from(numd) + 1) * 4;
    let cdw10 = sqe.cdw(10);
    let cdw11 = sqe.cdw(11);
    Some(match sqe.opcode() {
        admin_op::IDENTIFY => ("Identify", 4096),
        admin_op::GET_LOG_PAGE => (
            "Get Log Page",
            dwords(((cdw11 & 0xffff) << 16) | (cdw10 >> 16)),
        ),
        0x11 => ("Firmware Image Download", dwords(cdw10)),
        0x19 if cdw10 != 0 => ("Directive Send", dwords(cdw10)),
        0x1a if cdw10 != 0 => ("Directive Receive", dwords(cdw10)),
        0x81 => ("Security Send", u64::from(cdw11)),
        0x82 => ("Security Receive", u64::from(cdw11)),
        0x86 => ("Get LBA Status", dwords(sqe.cdw(12))),
        admin_op::GET_FEATURES if (cdw10 >> 8) & 7 == 3 => return None,
        admin_op::GET_FEATURES | admin_op::SET_FEATURES => {
            let set = sqe.opcode() == admin_op::SET_FEATURES;
            let (_, len) = feature::structure(cdw10 as u8, cdw11, set)?;
            ("Get / Set Features", len as u64)
        }
        _ => return None,
    })
}

/// The transfer of an admin passthrough: `data_len`, or with `data_len` 0
/// the length of `data_out`; a `data_out` longer than a non-zero
/// `data_len` is refused (describing it would describe more than the
/// command moves: see [`Controller::admin_passthrough`]).
pub(crate) fn passthrough_len(data_len: usize, data_out: Option<&[u8]>) -> Result<usize> {
    match data_out {
        Some(d) if data_len == 0 => Ok(d.len()),
        Some(d) if d.len() > data_len => Err(Error::InvalidArgument(format!(
            "admin passthrough: data_out holds {} bytes, more than the {data_len} bytes data_len says \
             the command moves (pass data_len 0 to take data_out's length)",
            d.len()
        ))),
        _ => Ok(data_len),
    }
}

/// Why [`Controller::admin_passthrough`] (and [`Controller::set_features`])
/// refuses `sqe`, if it does (NVMe 2.0 Base Specification, Figure 28 admin
/// opcodes, and NVMe 2.1's Controller Data Queue; Set Features FID 07h Number of Queues, FID 0Dh Host Memory
/// Buffer, FID 0Fh Keep Alive Timer).
pub(crate) fn passthrough_refusal(sqe: &Sqe) -> Option<&'static str> {
    use upnvme_queues::sqe::opcode::admin::{
        ASYNC_EVENT_REQUEST, CONTROLLER_DATA_QUEUE, CREATE_IO_CQ, CREATE_IO_SQ, DELETE_IO_CQ,
        DELETE_IO_SQ, DOORBELL_BUFFER_CONFIG, FORMAT_NVM, NAMESPACE_ATTACHMENT,
        NAMESPACE_MANAGEMENT, SET_FEATURES,
    };
    Some(match sqe.opcode() {
        DELETE_IO_SQ | CREATE_IO_SQ | DELETE_IO_CQ | CREATE_IO_CQ => {
            "I/O queues are the driver's: create them with Controller::io_queue_pair"
        }
        ASYNC_EVENT_REQUEST => {
            "the driver keeps Asynchronous Event Requests posted: read events with \
             Controller::poll_async_events"
        }
        DOORBELL_BUFFER_CONFIG => {
            "the shadow doorbell buffers are the driver's (ControllerOptions::shadow_doorbells)"
        }
        CONTROLLER_DATA_QUEUE => {
            "a Controller Data Queue is host memory the controller writes to after the command \
             (the driver's data buffer, freed once it completes); not supported"
        }
        FORMAT_NVM => {
            "use Controller::format_nvm, which retires the namespace's handles and returns a \
             fresh one"
        }
        NAMESPACE_MANAGEMENT | NAMESPACE_ATTACHMENT => {
            "a namespace created, deleted, attached or detached under live namespace handles \
             would be read and written with its old geometry; not supported"
        }
        SET_FEATURES if sqe.dw[10] & 0xff == u32::from(feature::NUMBER_OF_QUEUES) => {
            "the driver sets Number of Queues at bring-up and after every reset and gives its \
             pairs queue IDs by what was granted (ControllerOptions::io_queues; create pairs \
             with Controller::io_queue_pair)"
        }
        SET_FEATURES if sqe.dw[10] & 0xff == u32::from(feature::HOST_MEMORY_BUFFER) => {
            "a Host Memory Buffer would let the device use host memory after the command; \
             not supported"
        }
        SET_FEATURES
            if sqe.dw[10] & 0xff == u32::from(feature::KEEP_ALIVE_TIMER) && sqe.dw[11] != 0 =>
        {
            "the driver sends no Keep Alive commands: a Keep Alive Timeout would expire and \
             leave the controller fatally failed (CSTS.CFS); only KATO 0 is accepted"
        }
        _ => return None,
    })
}
