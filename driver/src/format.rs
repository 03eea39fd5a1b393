//! Format NVM (admin opcode 80h, NVM Command Set Specification 1.0 §4.1
//! "Format NVM command"; Identify Controller OACS bit 1): choose a
//! namespace's LBA format — data size, metadata size and layout, protection
//! information type and location — and optionally erase it securely.
//!
//! Afterwards the controller's namespace list is refreshed from Identify
//! Namespace, and every handle taken before is retired: queue pairs refuse
//! it ([`crate::Reject::StaleNamespace`]) instead of sizing transfers by a
//! geometry that no longer holds.

use std::time::Duration;
use upnvme_queues::pi::Pif;

use upnvme_queues::Sqe;
use upnvme_queues::sqe::opcode::admin::FORMAT_NVM;

use crate::controller::Controller;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::namespace::Namespace;

/// The Secure Erase Settings field (CDW10 SES, bits 11:9).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SecureErase {
    /// 000b: no secure erase requested.
    #[default]
    None,
    /// 001b: User Data Erase.
    UserData,
    /// 010b: Cryptographic Erase.
    Cryptographic,
}

/// What Format NVM is to do (CDW10).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FormatNvm {
    /// Index into Identify Namespace LBAF (LBAFL bits 3:0, LBAFU 13:12).
    pub lbaf: u8,
    /// MSET (bit 4): metadata at the end of each block (extended LBA);
    /// otherwise in a separate buffer.
    pub extended: bool,
    /// PI (bits 7:5): protection information type 0 (none) to 3.
    pub pi_type: u8,
    /// PIL (bit 8): the PI tuple in the first bytes of the metadata
    /// (otherwise the last): 8 bytes, or 16 with a 32- or 64-bit guard.
    pub pi_first: bool,
    /// SES (bits 11:9).
    pub secure_erase: SecureErase,
    /// How long to wait for the command (a secure erase of a large device
    /// takes minutes); `None`: the controller's admin timeout.
    /// `Some(Duration::ZERO)` is refused before anything is sent: the
    /// wait would end at once while the controller goes on formatting.
    pub timeout: Option<Duration>,
}

impl FormatNvm {
    /// LBA format `lbaf` with a separate metadata buffer, no PI, no erase.
    pub fn lbaf(lbaf: u8) -> FormatNvm {
        FormatNvm {
            lbaf,
            extended: false,
            pi_type: 0,
            pi_first: false,
            secure_erase: SecureErase::None,
            timeout: None,
        }
    }

    /// CDW10 of the command.
    pub fn cdw10(&self) -> u32 {
        let ses = match self.secure_erase {
            SecureErase::None => 0,
            SecureErase::UserData => 1,
            SecureErase::Cryptographic => 2,
        };
        u32::from(self.lbaf & 0xf)
            | u32::from(self.extended) << 4
            | u32::from(self.pi_type & 0x7) << 5
            | u32::from(self.pi_first) << 8
            | ses << 9
            | u32::from(self.lbaf >> 4 & 0x3) << 12
    }
}

impl<D: Device> Controller<D> {
    /// Formats namespace `nsid` (Format NVM) and returns its new handle.
    ///
    /// The arguments are checked against Identify first (OACS bit 1 Format
    /// NVM supported, an LBAF index within NLBAF, MC for the metadata
    /// layout, DPC for the PI type and location, FNA bit 2 for a
    /// cryptographic erase); the controller refuses anything else with
    /// Invalid Format. Every handle of the namespace taken before is retired
    /// (queue pairs refuse it with [`crate::Reject::StaleNamespace`]); on a
    /// controller whose FNA bit 0 is set, where formatting one namespace
    /// formats them all, every namespace's handles are retired and every
    /// namespace is read again ([`Controller::namespace`] returns the new
    /// handles). The handles are retired and the namespaces read again
    /// whatever the command's outcome: after a refusal (nothing formatted)
    /// [`Controller::namespace`] hands out fresh handles too, and the
    /// command's error is returned. When the Identify after it fails as well
    /// (no answer), the namespace is [`Error::UnusableNamespace`] until
    /// [`Controller::refresh_namespaces`] reads it again.
    ///
    /// Queue pairs on other threads: a command already checked against the
    /// old geometry — queued, in flight, or between its checks and its
    /// doorbell — would move the old transfer length under the new LBA size
    /// (past its buffer when the blocks grow). So while any I/O queue pair
    /// exists, the controller is reset before the Format NVM (after the
    /// handles are retired): every pair's queued and in-flight commands end
    /// once with [`crate::IoError::ControllerReset`] and their buffers, the
    /// pairs' commands on other namespaces included, and the pairs re-create
    /// their queues at their next call, as after [`Controller::reset`]. A
    /// doorbell a preempted thread writes afterwards names a queue the
    /// reset deleted. With no pair (the `upnvme format` tool) there is
    /// nothing to stop and no reset. A reset that fails is the call's error,
    /// and no Format NVM is sent. The Format NVM is waited for without
    /// holding the admin queue: pairs on other threads re-create their
    /// queues at their next call and run I/O on other namespaces while it
    /// runs (up to [`FormatNvm::timeout`]). A controller reset meanwhile (a
    /// pair's timeout recovery, an automatic reset after a fatal status)
    /// ends the call with [`Error::Io`] of
    /// [`crate::IoError::ControllerReset`]: the format may or may not have
    /// taken effect; the namespaces are read again either way.
    ///
    /// A namespace the driver cannot use ([`Error::UnusableNamespace`]: an
    /// LBA format it does not support) can be formatted too: its Identify
    /// Namespace data is read again for the checks. A target LBA format
    /// whose data size the driver cannot use is refused.
    ///
    /// The same in two halves, for an application that shares the
    /// controller between threads: [`Controller::format_nvm_run`] (`&self`)
    /// and [`Controller::format_nvm_finish`] (`&mut self`).
    pub fn format_nvm(&mut self, nsid: u32, format: &FormatNvm) -> Result<Namespace> {
        let run = self.format_nvm_run(nsid, format);
        self.format_nvm_finish(run)
    }

    /// The first half of [`Controller::format_nvm`], which needs only
    /// `&self`: the checks, the handles retired, the reset when queue pairs
    /// exist, the Format NVM sent and waited for (up to
    /// [`FormatNvm::timeout`]). What it does not do is read the namespaces
    /// again (that changes the controller's list, so it needs `&mut self`):
    /// hand what it returns to [`Controller::format_nvm_finish`], which does
    /// and returns the outcome. An application that shares the controller
    /// behind a lock holds it shared for this half — other threads' calls go
    /// on while a format (a secure erase may take minutes) runs, and can
    /// watch its progress (Identify Namespace FPI) — and exclusively for the
    /// second. Until `format_nvm_finish`, the formatted namespaces' handles
    /// are retired and [`Controller::namespace`] hands out those retired
    /// handles (every command with them is refused as stale); a
    /// [`Controller::refresh_namespaces`] reads them again too. Formats
    /// started on several threads at once are sent one after the other.
    #[must_use = "hand it to Controller::format_nvm_finish: until then the namespace's handles are retired"]
    pub fn format_nvm_run(&self, nsid: u32, format: &FormatNvm) -> FormatNvmRun {
        match self.format_nvm_send(nsid, format) {
            Ok((formatted, outcome)) => FormatNvmRun {
                device: self.device_name().to_string(),
                instance: self.inner.instance(),
                nsid,
                formatted,
                outcome,
            },
            // Refused before anything was retired or sent.
            Err(e) => FormatNvmRun {
                device: self.device_name().to_string(),
                instance: self.inner.instance(),
                nsid,
                formatted: Vec::new(),
                outcome: Err(e),
            },
        }
    }

    /// The checks and the command of [`Controller::format_nvm_run`]: the
    /// namespaces whose handles were retired and the command's outcome, or
    /// a refusal before anything was retired.
    fn format_nvm_send(&self, nsid: u32, format: &FormatNvm) -> Result<(Vec<u32>, Result<()>)> {
        let id = match self.namespace(nsid) {
            Ok(ns) => ns.identify().clone(),
            // A namespace the driver cannot use (its LBA format, or its
            // Identify data at bring-up): formatting it is the way out, so
            // its Identify Namespace data is read again here.
            Err(Error::UnusableNamespace { .. }) => self.inner.identify_namespace(nsid)?,
            Err(e) => return Err(e),
        };
        let bad = |what: String| {
            Error::InvalidArgument(format!("Format NVM of namespace {nsid}: {what}"))
        };
        if self.identify().oacs & (1 << 1) == 0 {
            return Err(Error::Unsupported {
                device: self.device_name().to_string(),
                what: "Format NVM (Identify Controller OACS bit 1 is clear)".into(),
            });
        }
        let Some(lbaf) = id.lbaf.get(usize::from(format.lbaf)) else {
            return Err(bad(format!(
                "LBA format {} does not exist: the namespace has {} (0..={}, {}; `upnvme identify -H` lists them)",
                format.lbaf,
                id.lba_format_count(),
                id.lba_format_count() - 1,
                id.lba_format_fields()
            )));
        };
        if lbaf.lba_size().is_none() {
            return Err(bad(format!(
                "LBA format {} has LBADS {}, outside 9..=31 (512 B to 2 GiB blocks): the driver \
                 could not use the namespace after it",
                format.lbaf, lbaf.lbads
            )));
        }
        if lbaf.ms != 0 {
            let (bit, layout) = if format.extended {
                (0, "extended LBA")
            } else {
                (1, "a separate metadata buffer")
            };
            if id.mc & (1 << bit) == 0 {
                return Err(bad(format!(
                    "the namespace cannot keep metadata in {layout} (Identify Namespace MC = {:#x})",
                    id.mc
                )));
            }
        }
        if format.timeout == Some(Duration::ZERO) {
            return Err(bad(
                "a timeout of 0 would end the wait at once while the controller goes on \
                 formatting; pass None for the admin timeout, or minutes for a secure erase of a \
                 large device"
                    .into(),
            ));
        }
        if format.pi_type > 3 {
            return Err(bad(format!(
                "PI type {}: must be 0 (none) to 3",
                format.pi_type
            )));
        }
        if format.pi_type != 0 {
            // The tuple's size follows the format's guard (ELBAF.PIF, CNS
            // 05h, on a controller with Extended LBA Formats): 8 bytes, or
            // 16 with a 32- or 64-bit guard.
            let pif = if self.identify().ctratt_elbas() {
                let elbaf = self.inner.elbaf(nsid, usize::from(format.lbaf))?;
                // A reserved guard (11b): the namespace would be unusable
                // after the format.
                Pif::from_elbaf(elbaf).ok_or_else(|| {
                    bad(format!(
                        "LBA format {}'s protection information format (ELBAF.PIF {}) is \
                         reserved: the driver could not use the namespace after it; choose \
                         another LBA format",
                        format.lbaf,
                        (elbaf >> 7) & 0x3
                    ))
                })?
            } else {
                Pif::Guard16
            };
            if usize::from(lbaf.ms) < pif.tuple_size() {
                return Err(bad(format!(
                    "PI type {} needs {} or more metadata bytes per block (the tuple of a {}-bit \
                     guard); LBA format {} has {}",
                    format.pi_type,
                    pif.tuple_size(),
                    pif.guard_bits(),
                    format.lbaf,
                    lbaf.ms
                )));
            }
            // DPC bit 3: PI in the first bytes of the metadata; bit 4:
            // in the last (NVM Command Set, Identify Namespace DPC).
            let location = if format.pi_first { 1 << 3 } else { 1 << 4 };
            if id.dpc & (1 << (format.pi_type - 1)) == 0 || id.dpc & location == 0 {
                let types: Vec<String> = (1..=3u8)
                    .filter(|t| id.dpc & (1 << (t - 1)) != 0)
                    .map(|t| t.to_string())
                    .collect();
                let places: Vec<&str> = [(1 << 3, "first"), (1 << 4, "last")]
                    .into_iter()
                    .filter(|(bit, _)| id.dpc & bit != 0)
                    .map(|(_, place)| place)
                    .collect();
                let offered = if types.is_empty() || places.is_empty() {
                    "it offers no protection information: leave pi_type 0".to_string()
                } else {
                    format!(
                        "it offers type {} in the {} bytes",
                        types.join(", "),
                        places.join(" or ")
                    )
                };
                return Err(bad(format!(
                    "PI type {} in the {} {} metadata bytes is not offered (Identify Namespace \
                     DPC = {:#x}): {offered}",
                    format.pi_type,
                    if format.pi_first { "first" } else { "last" },
                    pif.tuple_size(),
                    id.dpc
                )));
            }
        }
        if format.secure_erase == SecureErase::Cryptographic && self.identify().fna & (1 << 2) == 0
        {
            return Err(bad(
                "cryptographic erase is not supported (Identify Controller FNA bit 2 is clear)"
                    .into(),
            ));
        }
        let mut sqe = Sqe::default();
        sqe.set_opcode(FORMAT_NVM);
        sqe.dw[1] = nsid;
        sqe.dw[10] = format.cdw10();
        let timeout = format.timeout.unwrap_or(self.inner.admin_timeout);
        let what = format!("Format NVM (namespace {nsid}, LBA format {})", format.lbaf);
        // FNA bit 0 (Format NVM Attributes): a format of one namespace
        // formats every namespace of the controller, so every handle's
        // geometry changes with it.
        let formatted: Vec<u32> = if self.identify().fna & 1 != 0 {
            let mut all: Vec<u32> = self.namespaces.iter().map(Namespace::id).collect();
            all.extend(self.unusable.iter().map(|(n, _)| *n));
            all.sort_unstable();
            all
        } else {
            vec![nsid]
        };
        // Retired before the command: whatever happens to it, the old
        // geometry is no longer to be trusted.
        for n in &formatted {
            if let Ok(old) = self.namespace(*n) {
                old.retire();
            }
        }
        // Whatever the command's outcome, the namespaces are read again: a
        // refusal (nothing formatted) must leave fresh handles behind, not
        // the retired ones (every I/O would be refused as stale, and
        // `Controller::namespace` would keep handing them out).
        // One Format NVM at a time (it takes one of the identifiers the
        // admin queue keeps for the driver's own commands).
        let _one = self
            .inner
            .format_lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let outcome = if self.inner.io_queues_in_use() {
            self.inner.reset()
        } else {
            Ok(())
        }
        .and_then(|()| self.inner.execute_detached(sqe, None, &what, timeout, true))
        .map(drop);
        Ok((formatted, outcome))
    }

    /// The second half of [`Controller::format_nvm`]: reads again the
    /// namespaces `run` formatted (every namespace when Identify Controller
    /// FNA bit 0 is set), whatever the command's outcome, and returns the
    /// new handle of the namespace formatted, or the error of the command
    /// (or of the checks before it, when nothing was sent). A `run` of
    /// another controller is refused ([`Error::InvalidArgument`]) and
    /// changes nothing here; it is consumed, so its own controller's
    /// handles stay retired until that controller's
    /// [`Controller::refresh_namespaces`].
    pub fn format_nvm_finish(&mut self, run: FormatNvmRun) -> Result<Namespace> {
        if run.instance != self.inner.instance() {
            return Err(Error::InvalidArgument(format!(
                "Controller::format_nvm_finish: the Format NVM of namespace {} ran on {}, not on \
                 {} (hand it to the controller whose format_nvm_run returned it)",
                run.nsid,
                run.device,
                self.device_name()
            )));
        }
        let FormatNvmRun {
            nsid,
            formatted,
            outcome,
            ..
        } = run;
        let mut result = None;
        let mut failed = None;
        for n in formatted {
            // An Identify that fails leaves the namespace unusable (its old
            // handle is retired), not the old handle listed; the formatted
            // namespace's own failure is the call's error.
            let fresh = match self.inner.namespace_handle(n) {
                Ok(f) => f,
                // The controller is gone for good (released on the kernel's
                // request, or closed): the retired handle stays listed, so a
                // later call with it fails as every call on this controller
                // does (ControllerRemoved, Closed), not as a namespace that
                // does not exist.
                Err(e @ (Error::ControllerRemoved { .. } | Error::Closed { .. })) => {
                    if n == nsid {
                        failed = Some(e);
                    }
                    continue;
                }
                Err(e) => {
                    let why = match &outcome {
                        Ok(_) => format!("its Identify after Format NVM failed: {e}"),
                        Err(fe) => format!(
                            "Format NVM failed ({fe}) and the Identify after it too ({e}); \
                             Controller::refresh_namespaces reads it again once the controller \
                             answers (after Controller::reset if it failed)"
                        ),
                    };
                    if n == nsid {
                        failed = Some(e);
                    }
                    Err(why)
                }
            };
            self.namespaces.retain(|h| h.id() != n);
            self.unusable.retain(|(u, _)| *u != n);
            let this = match fresh {
                Ok(ns) => {
                    let at = self.namespaces.partition_point(|h| h.id() < n);
                    self.namespaces.insert(at, ns.clone());
                    Ok(ns)
                }
                Err(why) => {
                    self.unusable.push((n, why.clone()));
                    Err(Error::InvalidArgument(format!(
                        "after Format NVM, namespace {n} cannot be used: {why}"
                    )))
                }
            };
            if n == nsid {
                result = Some(this);
            }
        }
        outcome?;
        if let Some(e) = failed {
            return Err(e);
        }
        result.unwrap_or_else(|| self.namespace(nsid).cloned())
    }
}

/// A Format NVM that [`Controller::format_nvm_run`] sent and waited for
/// (or refused): its outcome, and which namespaces
/// [`Controller::format_nvm_finish`] is to read again.
#[derive(Debug)]
#[must_use = "hand it to Controller::format_nvm_finish: until then the namespace's handles are retired"]
pub struct FormatNvmRun {
    /// The controller's name, for the refusal of a run of another.
    device: String,
    /// The controller's instance (`Inner::instance`): which controller ran it.
    instance: u64,
    /// The namespace asked for.
    nsid: u32,
    /// The namespaces whose handles were retired (none when the checks
    /// refused the format).
    formatted: Vec<u32>,
    /// The command's outcome, or the checks' refusal.
    outcome: Result<()>,
}

impl FormatNvmRun {
    /// The namespace formatted.
    pub fn nsid(&self) -> u32 {
        self.nsid
    }

    /// Whether the controller reported the format done (the namespaces
    /// are still to be read again by [`Controller::format_nvm_finish`]).
    pub fn succeeded(&self) -> bool {
        self.outcome.is_ok()
    }
}
