//! One decode step's kernels as they run inside the CUDA graph (`MUSER_CUDA_STEP_TRACE=1`, a
//! measuring switch). The kernels are then compiled with `MUSER_STEP_TRACE` (common.cuh): block 0
//! of every kernel that waits for the one before it (`pdl_wait`) notes the global timer when it
//! starts and when its wait returns, that is when the kernel before it has completed. Inside the
//! graph the kernels form a chain, so the time from one kernel's release to the next one's is
//! what that kernel costs the step, its launch, wait and tail included, where per-kernel profilers
//! (Nsight Compute) time each kernel alone. The report of the last step replayed goes to stderr
//! when the backend is dropped.

use cudarc::driver::{CudaModule, CudaSlice, CudaStream};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

/// Records the buffer holds at most (STEP_TRACE_CAP in common.cuh).
const CAP: usize = 8192;

/// Whether the kernels are built and run with the step trace.
pub fn on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("MUSER_CUDA_STEP_TRACE").is_ok_and(|v| v == "1"))
}

pub struct StepTrace {
    /// [count, then (start, release) per record] in ns of the global timer.
    buf: Mutex<CudaSlice<u64>>,
    /// Kernels that call `pdl_wait` (the ones that leave a record).
    aware: HashSet<String>,
    /// Names of the kernels launched while a step is captured, in order.
    names: Mutex<Captured>,
    /// The captured step's kernel names, in order.
    layout: Mutex<Vec<String>>,
    /// The records of the last step read back.
    last: Mutex<Vec<(u64, u64)>>,
}

impl StepTrace {
    pub fn new(stream: &Arc<CudaStream>) -> Result<StepTrace, cudarc::driver::DriverError> {
        Ok(StepTrace {
            buf: Mutex::new(stream.alloc_zeros::<u64>(1 + 2 * CAP)?),
            aware: HashSet::new(),
            names: Mutex::new(Captured::default()),
            layout: Mutex::new(Vec::new()),
            last: Mutex::new(Vec::new()),
        })
    }

    /// Points a module's `g_step_trace` at the buffer; `aware`: its kernels that call pdl_wait.
    pub fn attach(
        &mut self,
        module: &Arc<CudaModule>,
        stream: &Arc<CudaStream>,
        aware: &[String],
    ) -> Result<(), cudarc::driver::DriverError> {
        use cudarc::driver::DevicePtr;
        let ptr = {
            let buf = self.buf.lock().unwrap();
            let (ptr, _sync) = buf.device_ptr(stream);
            ptr
        };
        let mut g = module.get_global("g_step_trace", stream)?;
        stream.memcpy_htod(&ptr.to_le_bytes(), &mut g)?;
        self.aware.extend(aware.iter().cloned());
        Ok(())
    }

    /// A launch of kernel `name` (noted while a step is captured).
    pub fn launched(&self, name: &str) {
        let aware = self.aware.contains(name);
        self.names.lock().unwrap().launched(name, aware);
    }

    /// What the kernel launched last works on (its matrices' formats), added to its name.
    pub fn note(&self, what: &str) {
        self.names.lock().unwrap().note(what);
    }

    pub fn begin_capture(&self) {
        *self.names.lock().unwrap() = Captured {
            names: Some(Vec::new()),
            pushed: false,
        };
    }

    pub fn end_capture(&self) {
        if let Some(v) = self.names.lock().unwrap().names.take() {
            *self.layout.lock().unwrap() = v;
        }
    }

    /// Before a step's graph is launched: the previous step's records read back, the count
    /// zeroed.
    pub fn before_launch(
        &self,
        stream: &Arc<CudaStream>,
    ) -> Result<(), cudarc::driver::DriverError> {
        self.read(stream)?;
        let mut buf = self.buf.lock().unwrap();
        stream.memcpy_htod(&[0u64], &mut buf.slice_mut(0..1))?;
        Ok(())
    }

    /// The records now in the buffer, kept as the last step's (none: kept as they were).
    pub fn read(&self, stream: &Arc<CudaStream>) -> Result<(), cudarc::driver::DriverError> {
        let mut all = vec![0u64; 1 + 2 * CAP];
        stream.memcpy_dtoh(&*self.buf.lock().unwrap(), &mut all)?;
        let n = (all[0] as usize).min(CAP);
        if n > 0 {
            *self.last.lock().unwrap() = (0..n).map(|i| (all[1 + 2 * i], all[2 + 2 * i])).collect();
        }
        Ok(())
    }

    /// The last step, kernel by kernel: each kernel's cost (its release to the next one's),
    /// summed per kernel name, and the kernels of the middle layer in order.
    pub fn report(&self) -> String {
        let recs = self.last.lock().unwrap().clone();
        let names = self.layout.lock().unwrap().clone();
        report(&recs, &names)
    }
}

/// The names of a captured step's kernels that leave a record (those that wait for the kernel
/// before them), and whether the last launch was one of them.
#[derive(Default)]
struct Captured {
    names: Option<Vec<String>>,
    pushed: bool,
}

impl Captured {
    fn launched(&mut self, name: &str, aware: bool) {
        self.pushed = false;
        if let (Some(v), true) = (self.names.as_mut(), aware) {
            v.push(name.to_string());
            self.pushed = true;
        }
    }

    /// `what` after the last launch's name, when it left one (never on an earlier kernel's).
    fn note(&mut self, what: &str) {
        if let (Some(last), true) = (self.names.as_mut().and_then(|v| v.last_mut()), self.pushed) {
            last.push_str(&format!(" [{what}]"));
        }
    }
}

fn report(recs: &[(u64, u64)], names: &[String]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    // The step's records come first (the count is zeroed before its graph is launched); what
    // ran after it (argmax, the next prompt) is left out.
    let recs = if !names.is_empty() && recs.len() > names.len() {
        &recs[..names.len()]
    } else {
        recs
    };
    if recs.len() < 2 {
        return "step trace: no decode step recorded".into();
    }
    let named = recs.len() == names.len();
    let name = |i: usize| {
        if named {
            names[i].clone()
        } else {
            format!("kernel {i}")
        }
    };
    let span = recs[recs.len() - 1].1 - recs[0].1;
    let _ = writeln!(
        s,
        "step trace: {} kernels with a wait ({} names captured), first release to last {:.1} us",
        recs.len(),
        names.len(),
        span as f64 / 1e3
    );
    // A kernel that serves several ops (mvk_1: q+k+v, attn_output, ffn_down, the LM head) is
    // told apart by the kernel before it.
    let label = |i: usize| {
        if i == 0 {
            name(0)
        } else {
            format!("{} (after {})", name(i), name(i - 1))
        }
    };
    let mut by: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    for i in 0..recs.len() - 1 {
        let cost = recs[i + 1].1.saturating_sub(recs[i].1);
        let early = recs[i].1.saturating_sub(recs[i].0);
        let e = by.entry(label(i)).or_insert((0, 0, 0));
        e.0 += 1;
        e.1 += cost;
        e.2 += early;
    }
    let mut rows: Vec<_> = by.into_iter().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.1 .1));
    let _ = writeln!(
        s,
        "| kernel | launches | us per step (release to next release) | us each | share | block 0 waited, us each |"
    );
    let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | ---: |");
    for (k, (n, cost, early)) in &rows {
        let _ = writeln!(
            s,
            "| {k} | {n} | {:.1} | {:.2} | {:.1}% | {:.2} |",
            *cost as f64 / 1e3,
            *cost as f64 / 1e3 / *n as f64,
            100.0 * *cost as f64 / span as f64,
            *early as f64 / 1e3 / *n as f64
        );
    }
    // Kernels from the middle of the step, in order (a layer and a half).
    let mid = recs.len() / 2;
    let _ = writeln!(
        s,
        "middle of the step, kernel by kernel (us from its release to the next):"
    );
    for i in mid..(mid + 14).min(recs.len() - 1) {
        let _ = writeln!(
            s,
            "  {:>4} {:<28} {:>8.2}  (waited {:.2})",
            i,
            name(i),
            recs[i + 1].1.saturating_sub(recs[i].1) as f64 / 1e3,
            recs[i].1.saturating_sub(recs[i].0) as f64 / 1e3
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::report;

    /// A chain of kernels whose releases are 10, 20, 30 ... us apart: each kernel's cost is
    /// the gap to the next release, summed per (kernel, kernel before it); records past the
    /// captured names (kernels after the graph) are left out.
    #[test]
    fn report_charges_each_kernel_the_time_to_the_next_release() {
        let names: Vec<String> = ["a", "b", "a", "b", "c"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut recs = Vec::new();
        let mut t = 1_000_000u64;
        for i in 0..names.len() {
            recs.push((t - 500, t)); // entered 0.5 us before its release
            t += 10_000 * (i as u64 + 1);
        }
        recs.push((t, t + 5)); // a kernel after the graph
        let r = report(&recs, &names);
        // Span: releases 0 .. 10+20+30+40 us.
        assert!(
            r.contains("5 kernels with a wait (5 names captured), first release to last 100.0 us"),
            "{r}"
        );
        // a (first) 10 us; b after a: 20 + 40 us; a after b: 30 us.
        assert!(r.contains("| a | 1 | 10.0 | 10.00 | 10.0% | 0.50 |"), "{r}");
        assert!(
            r.contains("| b (after a) | 2 | 60.0 | 30.00 | 60.0% | 0.50 |"),
            "{r}"
        );
        assert!(
            r.contains("| a (after b) | 1 | 30.0 | 30.00 | 30.0% | 0.50 |"),
            "{r}"
        );
        assert!(
            !r.contains("| c"),
            "the last kernel has no next release: {r}"
        );
    }

    /// Notes go to the launch just made, only when it left a name, and only while a step is
    /// captured.
    #[test]
    fn notes_name_the_last_recorded_launch_only() {
        let mut c = super::Captured::default();
        c.launched("mvk_1", true);
        c.note("Q4_K");
        assert!(c.names.is_none(), "nothing is recorded outside a capture");
        c.names = Some(Vec::new());
        c.launched("mmw_split_4", true);
        c.note("Q6_K");
        c.launched("mmw_pack", false); // no wait, no record
        c.note("Q4_K");
        c.launched("mmw_split_4", true);
        c.note("Q4_K+Q6_K");
        c.launched("residual_norm", true);
        assert_eq!(
            c.names.unwrap(),
            [
                "mmw_split_4 [Q6_K]",
                "mmw_split_4 [Q4_K+Q6_K]",
                "residual_norm"
            ]
        );
    }

    #[test]
    fn report_without_a_step_says_so() {
        assert_eq!(report(&[], &[]), "step trace: no decode step recorded");
    }
}
