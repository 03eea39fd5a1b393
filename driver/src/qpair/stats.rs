//! Per-queue-pair counters: the doorbell economy made visible.

/// Counters of one I/O queue pair. Plain integers updated by the owning thread
/// after the doorbell write (never before it); read them with
/// [`crate::IoQueuePair::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Commands submitted (written to the SQ and announced to the device),
    /// counted by `ring` and `submit`: `submit` counts its own command, and
    /// commands `queue`d before it, which its doorbell announced too, are
    /// counted by the next `ring` or poll, or by the pair's next call after
    /// a reset.
    pub submissions: u64,
    /// Completions reaped from the CQ (commands a reset or close ended
    /// without a CQE are not counted).
    pub completions: u64,
    /// Calls that looked at the CQ (process_completions and internal reaps).
    pub polls: u64,
    /// Polls that delivered no completion: nothing was found, or only
    /// entries of split commands' children whose command is not complete
    /// yet (counted in `completions`; telling them apart would cost the
    /// reap of every I/O an instruction).
    pub idle_polls: u64,
    /// SQ tail doorbell writes over MMIO.
    pub sq_doorbell_mmio: u64,
    /// CQ head doorbell writes over MMIO.
    pub cq_doorbell_mmio: u64,
    /// SQ tail updates written to the shadow doorbell buffer (each followed
    /// by an EventIdx check).
    pub sq_shadow_updates: u64,
    /// CQ head updates written to the shadow doorbell buffer.
    pub cq_shadow_updates: u64,
    /// Reap batches after which the CQ head doorbell was not yet due and was
    /// skipped (moderation).
    pub cq_doorbell_skipped: u64,
    /// Shadow updates for which the event index made the MMIO write unnecessary.
    pub mmio_skipped_by_event_idx: u64,
    /// Abort commands sent for overdue commands.
    pub aborts: u64,
    /// Controller resets this pair started because an aborted command did
    /// not come back (or CSTS.CFS was set), failed ones included; not
    /// counted when another thread's reset since had already answered it.
    pub timeout_resets: u64,
}

impl QueueStats {
    /// MMIO doorbell writes (SQ tail + CQ head) per completed command.
    pub fn mmio_per_io(&self) -> f64 {
        per_io(
            self.sq_doorbell_mmio + self.cq_doorbell_mmio,
            self.completions,
        )
    }

    /// SQ y Tail Doorbell MMIO writes per completed command.
    pub fn sq_mmio_per_io(&self) -> f64 {
        per_io(self.sq_doorbell_mmio, self.completions)
    }

    /// CQ y Head Doorbell MMIO writes per completed command.
    pub fn cq_mmio_per_io(&self) -> f64 {
        per_io(self.cq_doorbell_mmio, self.completions)
    }

    /// Adds another queue pair's counters (for totals).
    pub fn add(&mut self, o: &QueueStats) {
        self.submissions += o.submissions;
        self.completions += o.completions;
        self.polls += o.polls;
        self.idle_polls += o.idle_polls;
        self.sq_doorbell_mmio += o.sq_doorbell_mmio;
        self.cq_doorbell_mmio += o.cq_doorbell_mmio;
        self.sq_shadow_updates += o.sq_shadow_updates;
        self.cq_shadow_updates += o.cq_shadow_updates;
        self.cq_doorbell_skipped += o.cq_doorbell_skipped;
        self.mmio_skipped_by_event_idx += o.mmio_skipped_by_event_idx;
        self.aborts += o.aborts;
        self.timeout_resets += o.timeout_resets;
    }
}

fn per_io(n: u64, completions: u64) -> f64 {
    if completions == 0 {
        0.0
    } else {
        n as f64 / completions as f64
    }
}

#[cfg(test)]
mod tests {
    use super::QueueStats;

    #[test]
    fn per_io_ratios() {
        let s = QueueStats {
            completions: 200,
            sq_doorbell_mmio: 100,
            cq_doorbell_mmio: 1,
            ..QueueStats::default()
        };
        assert_eq!(s.sq_mmio_per_io(), 0.5);
        assert_eq!(s.cq_mmio_per_io(), 0.005);
        assert_eq!(s.mmio_per_io(), 0.505);
        assert_eq!(QueueStats::default().mmio_per_io(), 0.0);
    }
}
