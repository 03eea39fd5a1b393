//! Get Features (NVMe Base Specification 2.0, §5.15) and Set Features
//! (§5.27) for the features the model supports (Feature Specific
//! Information): Temperature
//! Threshold (04h), Volatile Write Cache (06h), Number of Queues (07h),
//! Asynchronous Event Configuration (0Bh). Any other feature identifier is
//! Invalid Field in Command.

use super::command::Command;
use super::engine::Outcome;
use super::state::State;
use super::status::Status;

/// FID 04h, Temperature Threshold.
const FID_TEMPERATURE_THRESHOLD: u32 = 0x04;
/// FID 06h, Volatile Write Cache.
const FID_VOLATILE_WRITE_CACHE: u32 = 0x06;
/// FID 07h, Number of Queues.
const FID_NUMBER_OF_QUEUES: u32 = 0x07;
/// FID 16h, Host Behavior Support (a 512-byte data structure).
const FID_HOST_BEHAVIOR_SUPPORT: u32 = 0x16;
/// FID 0Bh, Asynchronous Event Configuration.
const FID_ASYNC_EVENT_CONFIG: u32 = 0x0b;
/// Default over-temperature threshold: WCTEMP, 343 K.
const DEFAULT_OVER_TEMP: u16 = 0x0157;

impl State {
    /// The Number of Queues dword 0: NCQA (31:16) | NSQA (15:0), 0-based.
    fn numq_dw0(&self) -> u32 {
        let (nsqa, ncqa) = self.features.granted.unwrap_or({
            let m = self.cfg.max_ioqpairs.saturating_sub(1);
            (m, m)
        });
        u32::from(ncqa) << 16 | u32::from(nsqa)
    }

    /// Temperature Threshold CDW11: TMPTH (15:0), TMPSEL (19:16), THSEL
    /// (21:20); only the composite temperature (TMPSEL 0) exists.
    fn temp_key(cdw11: u32) -> Option<(u8, u8)> {
        let tmpsel = ((cdw11 >> 16) & 0xf) as u8;
        let thsel = ((cdw11 >> 20) & 0x3) as u8;
        (tmpsel == 0 && thsel <= 1).then_some((tmpsel, thsel))
    }

    /// Set Features (§5.27): CDW10 FID (7:0), SV (bit 31); CDW11 value.
    pub(crate) fn set_features(&mut self, cmd: &Command) -> Outcome {
        let (cdw10, cdw11) = (cmd.cdw(10), cmd.cdw(11));
        if cdw10 & (1 << 31) != 0 {
            return Outcome::err(Status::FEATURE_NOT_SAVEABLE.with_dnr());
        }
        match cdw10 & 0xff {
            FID_NUMBER_OF_QUEUES => {
                let (nsqr, ncqr) = (cdw11 & 0xffff, cdw11 >> 16);
                if nsqr == 0xffff || ncqr == 0xffff {
                    return Outcome::err(Status::INVALID_FIELD.with_dnr());
                }
                if self.queues_created || self.sqs.keys().chain(self.cqs.keys()).any(|&q| q != 0) {
                    // Number of Queues: not after I/O queues were created
                    // since the last reset (even if deleted since, as QEMU).
                    return Outcome::err(Status::COMMAND_SEQUENCE_ERROR.with_dnr());
                }
                let max = u32::from(self.cfg.max_ioqpairs.saturating_sub(1));
                let nsqa = nsqr.min(max) as u16;
                let ncqa = ncqr.min(max) as u16;
                self.features.granted = Some((nsqa, ncqa));
                Outcome::ok(self.numq_dw0())
            }
            FID_VOLATILE_WRITE_CACHE => {
                if !self.cfg.vwc {
                    // As QEMU: no volatile write cache to switch.
                    return Outcome::err(Status::FEATURE_NOT_CHANGEABLE.with_dnr());
                }
                self.features.wce = cdw11 & 1 != 0;
                Outcome::ok(0)
            }
            FID_ASYNC_EVENT_CONFIG => {
                self.features.aec = cdw11;
                Outcome::ok(0)
            }
            // Accepted where it has something to enable: Extended LBA
            // Formats (LBAFEE) or the cross-namespace Copy formats (CDFE).
            FID_HOST_BEHAVIOR_SUPPORT if self.cfg.elbas || self.cfg.ocfs & 0b1100 != 0 => {
                match self.read_host_data(cmd, 512) {
                    Ok(d) => {
                        self.features.lbafee = d[2] & 1 != 0;
                        self.features.hbs = Some(d);
                        self.stats.hbs_sets += 1;
                        Outcome::ok(0)
                    }
                    Err(s) => Outcome::err(s),
                }
            }
            FID_TEMPERATURE_THRESHOLD => match Self::temp_key(cdw11) {
                Some(key) => {
                    self.features.temp.insert(key, (cdw11 & 0xffff) as u16);
                    Outcome::ok(0)
                }
                None => Outcome::err(Status::INVALID_FIELD.with_dnr()),
            },
            _ => Outcome::err(Status::INVALID_FIELD.with_dnr()),
        }
    }

    /// Get Features (§5.15): CDW10 FID (7:0), SEL (10:8): current (0),
    /// default (1), saved (2, same as default), supported capabilities (3).
    pub(crate) fn get_features(&mut self, cmd: &Command) -> Outcome {
        let (cdw10, cdw11) = (cmd.cdw(10), cmd.cdw(11));
        let fid = cdw10 & 0xff;
        let sel = (cdw10 >> 8) & 0x7;
        let known = matches!(
            fid,
            FID_NUMBER_OF_QUEUES
                | FID_VOLATILE_WRITE_CACHE
                | FID_ASYNC_EVENT_CONFIG
                | FID_TEMPERATURE_THRESHOLD
        );
        if !known || sel > 3 {
            return Outcome::err(Status::INVALID_FIELD.with_dnr());
        }
        if sel == 3 {
            // Capabilities: changeable (bit 2), not saveable, not per namespace.
            let changeable = fid != FID_VOLATILE_WRITE_CACHE || self.cfg.vwc;
            return Outcome::ok(u32::from(changeable) << 2);
        }
        let current = sel == 0;
        match fid {
            FID_NUMBER_OF_QUEUES => Outcome::ok(self.numq_dw0()),
            FID_VOLATILE_WRITE_CACHE => Outcome::ok(u32::from(current && self.features.wce)),
            FID_ASYNC_EVENT_CONFIG => Outcome::ok(if current { self.features.aec } else { 0 }),
            _ => match Self::temp_key(cdw11) {
                Some(key) => {
                    let default = if key.1 == 0 { DEFAULT_OVER_TEMP } else { 0 };
                    let v = if current {
                        self.features.temp.get(&key).copied().unwrap_or(default)
                    } else {
                        default
                    };
                    Outcome::ok(u32::from(v))
                }
                None => Outcome::err(Status::INVALID_FIELD.with_dnr()),
            },
        }
    }
}
