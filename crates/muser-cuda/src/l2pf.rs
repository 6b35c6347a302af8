//! L2 plans of a recorded decode step: the weights of the next matvec asked of L2 from the tail
//! of the one before it (`pf_share` in common.cuh).
//!
//! A decode step's matvecs are separated by small kernels that read almost nothing from DRAM
//! (the norms, RoPE, attention at short context). The small matrices (q+k+v, attn_output: 15-17
//! MB for llama-glimmer) then pay a launch's ramp and tail for a few microseconds of streaming.
//! While a step is captured, each matvec launch that takes a plan (`mvk_1`, `mmv_1`, `mmv_2`)
//! gets a slot in the recording's plan table, and the next matvec launch, whatever its kernel,
//! fills the slot before it with its own weights' ranges when they fit in `cap` bytes (a share
//! of L2). The table is uploaded after the capture, before the graph's first launch. Launches
//! outside a capture get no plan (a null pointer), so op-by-op runs are unchanged.
//!
//! `MUSER_CUDA_L2PF` sets the cap in MiB (0: no plans); `MUSER_CUDA_L2PF_BULK=1` asks with one
//! bulk request per warp instead of one per 128-byte line.

use crate::device::Gpu;

/// Words of one plan: 4 addresses, then 4 sizes in bytes (bit 63: bulk requests).
pub const PLAN_WORDS: usize = 8;
/// Plans one recording holds; later launches get none.
pub const PLAN_SLOTS: usize = 2048;

/// The plans of the step being captured.
#[derive(Default)]
pub struct PlanTable {
    /// Device address of the recording's table; 0 while no step is captured.
    base: u64,
    plans: Vec<[u64; PLAN_WORDS]>,
    /// The slot of the last matvec launch, waiting for the launch after it.
    pending: Option<usize>,
}

/// The most bytes a plan asks for (`MUSER_CUDA_L2PF` MiB, default 24: about half of an H100 or
/// H200's 50 MB L2).
pub fn plan_cap() -> u64 {
    static C: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *C.get_or_init(|| {
        crate::matvec::env_usize("MUSER_CUDA_L2PF").map_or(24, |m| m.min(48)) as u64 * (1 << 20)
    })
}

fn bulk() -> bool {
    std::env::var("MUSER_CUDA_L2PF_BULK").is_ok_and(|v| v == "1")
}

/// The plan that asks for `ranges` (address, bytes), or None when they are more than 4 or their
/// total is over `cap` (0 or empty: nothing to ask).
pub fn plan_for(ranges: &[(u64, u64)], cap: u64, bulk: bool) -> Option<[u64; PLAN_WORDS]> {
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    if ranges.is_empty() || ranges.len() > PLAN_WORDS / 2 || total == 0 || total > cap {
        return None;
    }
    let mut p = [0u64; PLAN_WORDS];
    for (i, &(a, n)) in ranges.iter().enumerate() {
        p[i] = a;
        p[PLAN_WORDS / 2 + i] = if bulk && a % 16 == 0 { n | 1 << 63 } else { n };
    }
    Some(p)
}

impl PlanTable {
    /// Registers a matvec launch reading `ranges`: fills the plan of the launch before it, and
    /// returns this launch's slot address when it takes one (`slot`) and a step is captured.
    pub fn launch(&mut self, ranges: &[(u64, u64)], slot: bool, cap: u64, bulk: bool) -> u64 {
        if self.base == 0 {
            return 0;
        }
        if let Some(prev) = self.pending.take() {
            if let Some(p) = plan_for(ranges, cap, bulk) {
                self.plans[prev] = p;
            }
        }
        if !slot || self.plans.len() >= PLAN_SLOTS {
            return 0;
        }
        self.plans.push([0; PLAN_WORDS]);
        self.pending = Some(self.plans.len() - 1);
        self.base + ((self.plans.len() - 1) * PLAN_WORDS * 8) as u64
    }
}

impl Gpu {
    /// Starts collecting plans into the table at `base` (PLAN_SLOTS plans, zero).
    pub(crate) fn plans_begin(&self, base: u64) {
        *self.plans.lock().unwrap() = PlanTable {
            base,
            ..Default::default()
        };
    }

    /// Stops collecting and returns the plans (the table's first words; the rest stay zero).
    pub(crate) fn plans_end(&self) -> Vec<u64> {
        let t = std::mem::take(&mut *self.plans.lock().unwrap());
        t.plans.into_iter().flatten().collect()
    }

    /// A matvec launch reading `ranges` (see `PlanTable::launch`); 0 when it gets no plan.
    pub(crate) fn plan_launch(&self, ranges: &[(u64, u64)], slot: bool) -> u64 {
        let cap = plan_cap();
        if cap == 0 {
            return 0;
        }
        self.plans.lock().unwrap().launch(ranges, slot, cap, bulk())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_plan_names_the_next_launch_weights_when_they_fit() {
        let mut t = PlanTable {
            base: 0x1000,
            ..Default::default()
        };
        let cap = 100;
        // q+k+v (slot 0), attn_output (slot 1), gate+up (no slot, too big), ffn_down (slot 2),
        // then the next layer's q+k+v (slot 3) and nothing after it.
        let qkv = [(0x10, 30), (0x40, 10), (0x60, 10)];
        assert_eq!(t.launch(&qkv, true, cap, false), 0x1000);
        assert_eq!(t.launch(&[(0x100, 40)], true, cap, false), 0x1000 + 64);
        assert_eq!(
            t.launch(&[(0x200, 500), (0x300, 500)], false, cap, false),
            0
        );
        assert_eq!(t.launch(&[(0x400, 250)], true, cap, false), 0x1000 + 128);
        assert_eq!(t.launch(&qkv, true, cap, false), 0x1000 + 192);
        assert_eq!(t.plans.len(), 4);
        assert_eq!(t.plans[0], [0x100, 0, 0, 0, 40, 0, 0, 0]);
        assert_eq!(t.plans[1], [0; 8], "gate+up is over the cap");
        assert_eq!(t.plans[2], [0x10, 0x40, 0x60, 0, 30, 10, 10, 0]);
        assert_eq!(t.plans[3], [0; 8], "no launch after the last");
        assert_eq!(t.pending, Some(3));
    }

    #[test]
    fn no_plans_outside_a_capture_and_bulk_only_for_aligned_ranges() {
        let mut t = PlanTable::default();
        assert_eq!(t.launch(&[(0x10, 8)], true, 100, false), 0);
        assert!(t.plans.is_empty());
        let p = plan_for(&[(0x10, 8), (0x18, 8)], 100, true).unwrap();
        assert_eq!(p[4], 8 | 1 << 63);
        assert_eq!(p[5], 8, "an unaligned range is asked line by line");
        assert!(plan_for(&[(0x10, 8); 5], 100, false).is_none());
        assert!(plan_for(&[], 100, false).is_none());
    }
}
