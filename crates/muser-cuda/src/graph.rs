//! A recorded decode step as a CUDA graph, with programmatic dependent launch (PDL) between its
//! kernels on Hopper and newer.
//!
//! A step is captured from the backend's stream, which orders its kernels one after the other.
//! Before the graph is instantiated, each kernel-to-kernel edge whose downstream kernel is
//! PDL-aware (it calls `pdl_wait()` first, see common.cuh; `Gpu::is_pdl_aware`) becomes a
//! programmatic edge: the downstream kernel's blocks may be scheduled while the upstream kernel
//! still runs, and wait on the device for its completion and memory. That takes the launch
//! latency and the ramp-up of every such kernel off the step's critical path. An edge into a
//! kernel that does not wait stays a full dependency.
//!
//! `MUSER_CUDA_PDL=0` keeps every edge a full dependency.

use crate::device::Gpu;
use cudarc::driver::{sys, DriverError};

/// An instantiated graph and the stream it launches on.
pub struct StepGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    stream: sys::CUstream,
    /// Kernel-to-kernel edges, and how many of them were made programmatic.
    pub edges: usize,
    pub programmatic: usize,
}

fn ok(r: sys::CUresult) -> Result<(), DriverError> {
    r.result()
}

/// Whether programmatic edges are used on this GPU (compute capability 9.0 or newer, and not
/// turned off by `MUSER_CUDA_PDL=0`).
pub fn pdl_enabled(gpu: &Gpu) -> bool {
    gpu.cc() >= 90 && std::env::var("MUSER_CUDA_PDL").map_or(true, |v| v != "0")
}

impl StepGraph {
    /// Ends the capture begun on `gpu.stream`, makes the edges into PDL-aware kernels
    /// programmatic when `pdl` is set, and instantiates the graph.
    pub fn end_capture(gpu: &Gpu, pdl: bool) -> Result<StepGraph, DriverError> {
        let stream = gpu.stream.cu_stream();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the stream is capturing (begun by the caller); the graph handle is written once.
        unsafe { ok(sys::cuStreamEndCapture(stream, &mut graph))? };
        let mut g = StepGraph {
            graph,
            exec: std::ptr::null_mut(),
            stream,
            edges: 0,
            programmatic: 0,
        };
        // SAFETY: the graph is ours and not yet instantiated; node handles come from it.
        unsafe {
            g.link(gpu, pdl)?;
            ok(sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0))?;
        }
        Ok(g)
    }

    /// Counts the kernel edges and, with `pdl`, turns those into PDL-aware kernels programmatic.
    unsafe fn link(&mut self, gpu: &Gpu, pdl: bool) -> Result<(), DriverError> {
        let mut n = 0usize;
        ok(sys::cuGraphGetEdges_v2(
            self.graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut n,
        ))?;
        let mut from = vec![std::ptr::null_mut(); n];
        let mut to = vec![std::ptr::null_mut(); n];
        let mut data: Vec<sys::CUgraphEdgeData> = vec![std::mem::zeroed(); n];
        ok(sys::cuGraphGetEdges_v2(
            self.graph,
            from.as_mut_ptr(),
            to.as_mut_ptr(),
            data.as_mut_ptr(),
            &mut n,
        ))?;
        let kernel = |node: sys::CUgraphNode| -> Result<Option<sys::CUfunction>, DriverError> {
            let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            ok(sys::cuGraphNodeGetType(node, &mut ty))?;
            if ty != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                return Ok(None);
            }
            let mut p: sys::CUDA_KERNEL_NODE_PARAMS = std::mem::zeroed();
            ok(sys::cuGraphKernelNodeGetParams_v2(node, &mut p))?;
            Ok(Some(p.func))
        };
        for i in 0..n {
            let (Some(_), Some(down)) = (kernel(from[i])?, kernel(to[i])?) else {
                continue;
            };
            self.edges += 1;
            if !pdl || !gpu.is_pdl_aware(down) {
                continue;
            }
            ok(sys::cuGraphRemoveDependencies_v2(
                self.graph, &from[i], &to[i], &data[i], 1,
            ))?;
            let mut e: sys::CUgraphEdgeData = std::mem::zeroed();
            e.from_port = sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8;
            e.type_ = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
            ok(sys::cuGraphAddDependencies_v2(
                self.graph, &from[i], &to[i], &e, 1,
            ))?;
            self.programmatic += 1;
        }
        Ok(())
    }

    pub fn launch(&self) -> Result<(), DriverError> {
        // SAFETY: the executable graph is alive; the stream outlives it (the Gpu owns both).
        unsafe { ok(sys::cuGraphLaunch(self.exec, self.stream)) }
    }
}

impl Drop for StepGraph {
    fn drop(&mut self) {
        // SAFETY: both handles were created by end_capture and are destroyed once.
        unsafe {
            if !self.exec.is_null() {
                sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                sys::cuGraphDestroy(self.graph);
            }
        }
    }
}
