//! Blocking helpers: submit one command and wait for it, with a caller
//! timeout, on the same path as everything else.

use std::time::{Duration, Instant};

use upnvme_dma::DmaBuffer;

use super::{BLOCKING_TAG, Completion, IoCommand, IoQueuePair};
use crate::device::Device;
use crate::error::{Error, IoError, IoFailure};
use crate::namespace::Namespace;

impl<D: Device> IoQueuePair<D> {
    /// Submits `cmd` and waits for its completion, at most `timeout`. Other
    /// completions that arrive meanwhile are kept for `process_completions`.
    ///
    /// Spins without PAUSE and without a clock read per poll (the clock is
    /// read every 1024 empty polls), and backs off (the pair's `Backoff`)
    /// only after `spin_polls` empty polls.
    ///
    /// The pair's command timeout recovery (an Abort, then a reset) runs
    /// inside the wait only while more than the controller's admin timeout
    /// of `timeout` is left, so the wait keeps to `timeout` (give or take
    /// one scan) even when an Abort gets no answer, or when another
    /// thread holds the admin lock (the Abort then waits for the lock only
    /// while the room left allows, and is skipped after); what is overdue then is
    /// recovered by the pair's next `process_completions` (or a blocking
    /// call with a longer `timeout`): a pair used only through blocking
    /// calls of at most the admin timeout never aborts a stuck command.
    ///
    /// Not bounded by `timeout` (each bounded by its own steps instead):
    /// the submission, when the pair must first catch up with a reset (it
    /// waits for the reset's end, then for the admin lock — as long as its
    /// holder keeps it — and Create I/O CQ/SQ, each up to the admin
    /// timeout); and a controller reset the wait starts — after an Abort
    /// that got no answer or an aborted command's second timeout, or for
    /// CSTS.CFS — which waits for the admin lock and then takes the reset's
    /// steps (queue deletions up to one second, CSTS.RDY waits up to the
    /// ready timeout, the bring-up's admin commands).
    ///
    /// On an NVMe error status the buffer comes back in the [`IoFailure`]. On
    /// timeout the command stays in flight and keeps its buffer (the device may
    /// still write it); its completion surfaces later from
    /// `process_completions` with tag [`BLOCKING_TAG`]. The same holds for
    /// every other `IoFailure` without a buffer while the command was out
    /// (the controller failed elsewhere, CSTS read all ones, a timeout reset
    /// that failed before it disabled the controller — one that failed
    /// later ended the command, which then comes back as `TimedOut` with
    /// its buffer): the command is still in flight, and should the
    /// controller come back (a reset), its ending surfaces there too.
    pub fn execute_blocking(
        &mut self,
        cmd: IoCommand<'_>,
        buffer: Option<DmaBuffer>,
        timeout: Duration,
    ) -> Result<Option<DmaBuffer>, IoFailure> {
        let key = match self.queue_sqe(cmd, super::IoData::from(buffer), BLOCKING_TAG) {
            Ok(key) => key,
            Err(r) => {
                return Err(IoFailure {
                    error: self.describe(r.reason),
                    buffer: r.buffer,
                });
            }
        };
        self.pending += 1;
        // No opportunistic reap here: the loop below reaps, and knows which
        // completion is ours by its key (its slot, or its split's).
        let reap_on_submit = std::mem::replace(&mut self.reap_on_submit, false);
        self.ring();
        self.reap_on_submit = reap_on_submit;
        let start = Instant::now();
        let mut empty = 0u32;
        let mut periodic = Periodic::default();
        loop {
            let mut mine = None;
            let mut reaped = 0u32;
            let r = loop {
                match self.reap_one() {
                    Ok(Some((s, c))) => {
                        reaped += 1;
                        if s == key && mine.is_none() {
                            mine = Some(c);
                        } else {
                            self.ready.push_back((s, c));
                        }
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => break Err(e),
                }
            };
            self.stats.polls = self.stats.polls.wrapping_add(1);
            if reaped == 0 {
                self.stats.idle_polls += 1;
            } else if self.cq_head_due_after_reap() {
                self.commit_cq_head();
            }
            if let Err(error) = r {
                // Our own completion may have come in the same batch as the
                // fault: its buffer is the caller's again.
                return Err(IoFailure {
                    error,
                    buffer: mine.and_then(|c| c.buffer),
                });
            }
            if let Some(c) = mine {
                return finish_blocking(c, &cmd);
            }
            if !self.key_in_flight(key) {
                // A reset handled by `ring` or by a timeout scan ended the
                // command and parked its completion in `ready`; the newest
                // entry for this key is ours (nothing was queued since).
                if let Some(i) = self.ready.iter().rposition(|(s, _)| *s == key)
                    && let Some((_, c)) = self.ready.remove(i)
                {
                    return finish_blocking(c, &cmd);
                }
            }
            if self.generation_changed() {
                // A reset ended the command: it completes here, once.
                let closed = self.ctrl.is_closed();
                let c = if key & super::split::SPLIT_KEY != 0 {
                    self.end_split_in_flight(key, closed)
                } else {
                    self.end_in_flight(key as u16, closed).map(|(_, c)| c)
                };
                let _ = self.sync_generation();
                if let Some(c) = c {
                    return finish_blocking(c, &cmd);
                }
            }
            empty = empty.saturating_add(1);
            // Clock reads, CSTS checks and back-off only every so often: no PAUSE
            // and no clock_gettime in the tight loop. Once the wait sleeps
            // between polls, every poll checks: counted in sleeps, 1024 of
            // them would overrun the timeout by 1024 sleeps.
            let sleeping = empty > self.backoff.spin_polls && self.backoff.sleep.is_some();
            let (tick, tick_csts) = periodic.tick();
            let (check, check_csts) = (tick || sleeping, tick_csts || sleeping);
            if check {
                if start.elapsed() >= timeout {
                    return Err(IoFailure {
                        error: Error::Timeout {
                            what: format!("{} on queue {}", cmd.name(), self.qid),
                            after: start.elapsed(),
                        },
                        buffer: None,
                    });
                }
                if let Err(error) = self.check_usable() {
                    if self.generation_changed() {
                        // A reset or a release made the controller unusable
                        // after the check above: it ended the command, which
                        // the loop's top hands back with its buffer.
                        continue;
                    }
                    return Err(IoFailure {
                        error,
                        buffer: None,
                    });
                }
                if check_csts {
                    // A dead or fatally failed controller ends the wait early.
                    match crate::admin::check_csts(self.ctrl.dev(), self.ctrl.name()) {
                        Ok(_) => {}
                        // A release on the kernel's request (BAR0 reads all
                        // ones once the device is released) ends the command
                        // itself: with its buffer at the new generation (the
                        // loop's top), or, when DMA is not known to have
                        // stopped, as `check_usable` says once the release
                        // is over — both within the release's bounded steps.
                        Err(_) if self.ctrl.is_removed() => {}
                        Err(Error::ControllerFatal { .. }) => {
                            // Not again if a reset since this pair's
                            // generation answered the fatal status already
                            // (read while it was disabling the controller).
                            let _ = self.ctrl.reset_unless_since(self.generation);
                            continue;
                        }
                        Err(error) => {
                            self.ctrl.mark_failed(&error);
                            return Err(IoFailure {
                                error,
                                buffer: None,
                            });
                        }
                    }
                }
                // The command timeout scan, within what is left of the
                // caller's timeout (`check_timeouts_within`); what it leaves
                // the pair's next call recovers.
                if self.timeout_ticks > 0
                    && let Err(error) =
                        self.check_timeouts_within(timeout.saturating_sub(start.elapsed()))
                {
                    // A reset that failed after it disabled the controller
                    // ended the command (parked, with its buffer): that is
                    // its answer; the failure is the next call's.
                    if !self.key_in_flight(key)
                        && let Some(i) = self.ready.iter().rposition(|(s, _)| *s == key)
                        && let Some((_, c)) = self.ready.remove(i)
                    {
                        return finish_blocking(c, &cmd);
                    }
                    return Err(IoFailure {
                        error,
                        buffer: None,
                    });
                }
            }
            if empty > self.backoff.spin_polls {
                match self.backoff.sleep {
                    // Never past the caller's timeout (a sleep of
                    // `Duration::MAX` would never return).
                    Some(d) => std::thread::sleep(d.min(timeout.saturating_sub(start.elapsed()))),
                    None => std::thread::yield_now(),
                }
            }
        }
    }

    /// Reads `blocks` logical blocks at `slba` of `ns` into `buffer` and waits.
    pub fn read_blocking(
        &mut self,
        ns: &Namespace,
        slba: u64,
        blocks: u32,
        buffer: DmaBuffer,
        timeout: Duration,
    ) -> Result<DmaBuffer, IoFailure> {
        self.execute_blocking(IoCommand::Read { ns, slba, blocks }, Some(buffer), timeout)
            .and_then(need_buffer)
    }

    /// Writes `blocks` logical blocks at `slba` of `ns` from `buffer` and waits.
    pub fn write_blocking(
        &mut self,
        ns: &Namespace,
        slba: u64,
        blocks: u32,
        buffer: DmaBuffer,
        timeout: Duration,
    ) -> Result<DmaBuffer, IoFailure> {
        self.execute_blocking(IoCommand::Write { ns, slba, blocks }, Some(buffer), timeout)
            .and_then(need_buffer)
    }
}

fn need_buffer(b: Option<DmaBuffer>) -> Result<DmaBuffer, IoFailure> {
    b.ok_or_else(|| IoFailure {
        error: Error::InvalidArgument("completion without its buffer".into()),
        buffer: None,
    })
}

fn finish_blocking(c: Completion, cmd: &IoCommand<'_>) -> Result<Option<DmaBuffer>, IoFailure> {
    match c.result {
        Ok(_) => Ok(c.buffer),
        Err(IoError::Status(status)) => Err(IoFailure {
            error: Error::Command {
                command: cmd.name().to_string(),
                status,
            },
            buffer: c.buffer,
        }),
        Err(e) => Err(IoFailure {
            error: Error::Io {
                command: cmd.name().to_string(),
                error: e,
            },
            buffer: c.buffer,
        }),
    }
}

/// When a blocking wait's periodic work is due, counted in empty polls: the
/// clock, the timeout and the pair's state every 1024, CSTS every 16384.
/// The count wraps, and 2^32 is a multiple of both periods, so the checks go
/// on at the same pace for as long as the wait lasts (a saturating count
/// stopped them after 2^32 polls: minutes of a spinning wait, after which a
/// dead device was never noticed and the timeout never ended the wait).
#[derive(Debug, Default)]
pub(super) struct Periodic(u32);

impl Periodic {
    /// Counts one empty poll: (the clock and state check is due, the CSTS
    /// check is due).
    #[inline]
    pub(super) fn tick(&mut self) -> (bool, bool) {
        self.0 = self.0.wrapping_add(1);
        (
            self.0.is_multiple_of(1024),
            self.0.is_multiple_of(16 * 1024),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Periodic;

    #[test]
    fn periodic_checks_go_on_past_two_to_the_32_polls() {
        // Start just short of the wrap and count across it.
        let mut p = Periodic(u32::MAX - 3 * 16 * 1024);
        let (mut checks, mut csts) = (0, 0);
        for _ in 0..8 * 16 * 1024 {
            let (c, s) = p.tick();
            checks += u32::from(c);
            csts += u32::from(s);
        }
        assert_eq!((checks, csts), (8 * 16, 8));
    }
}
