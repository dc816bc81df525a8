//! What one (case, kernel) of the check comes to ([`CaseResult`]) and the poisoned device
//! outputs it is judged on ([`Poisoned`]): shared by the dense, backward, varlen, KV-cache and
//! bad-input checks, kept apart from `check/mod.rs` (which runs them) so that they import
//! nothing that imports them.

use flashattn::cuda::device::cuda_err;
use flashattn::cuda::{Gpu, GpuElement, KernelKind, LaunchInfo};
use flashattn::error::Result;
use serde::Serialize;

/// Elements past the end of `o` and `lse` that must stay poisoned.
pub(crate) const GUARD: usize = 256;
/// NaN in both f16 and bf16 (all exponent and mantissa bits set).
pub(crate) const POISON16: u16 = 0xFFFF;

/// The outcome of one (case, kernel).
#[derive(Debug, Clone, Serialize)]
pub struct CaseResult {
    /// Case label.
    pub label: String,
    /// Kernel name (as asked for).
    pub kernel: String,
    /// The kernel that ran and why, when it is not the one asked for (wgmma hands calls it
    /// cannot serve to mma); empty otherwise.
    pub ran: String,
    /// rel-L2 of o.
    pub o_rel_l2: f64,
    /// max-abs error of o.
    pub o_max_abs: f64,
    /// max-abs error of lse.
    pub lse_max_abs: f64,
    /// Poisoned guard elements past the end that were overwritten.
    pub guard_overwritten: usize,
    /// Passed every rule.
    pub passed: bool,
    /// Why it failed (or was skipped), empty when passed.
    pub message: String,
}

impl CaseResult {
    /// A result not judged yet.
    pub(crate) fn new(label: &str, kernel: KernelKind) -> Self {
        CaseResult {
            label: label.into(),
            kernel: kernel.name().into(),
            ran: String::new(),
            o_rel_l2: f64::NAN,
            o_max_abs: f64::NAN,
            lse_max_abs: f64::NAN,
            guard_overwritten: 0,
            passed: false,
            message: String::new(),
        }
    }

    /// Records a launch: `false` (the error as the message) when it failed; which kernel ran
    /// when it was not the one asked for.
    pub(crate) fn launched(&mut self, kernel: KernelKind, launched: Result<LaunchInfo>) -> bool {
        match launched {
            Err(e) => {
                self.message = e.to_string();
                false
            }
            Ok(info) => {
                if info.kernel != kernel {
                    self.ran = format!("ran {} ({})", info.kernel, info.why);
                }
                true
            }
        }
    }

    /// The verdict: the broken rules (plus a written guard region) fail the case; notes and
    /// the kernel that ran are told either way.
    pub(crate) fn conclude(&mut self, mut problems: Vec<String>, notes: Vec<String>) {
        if self.guard_overwritten > 0 {
            problems.push(format!(
                "{} elements past the end were written",
                self.guard_overwritten
            ));
        }
        self.passed = problems.is_empty();
        self.message = problems
            .into_iter()
            .chain(notes)
            .chain((!self.ran.is_empty()).then(|| self.ran.clone()))
            .collect::<Vec<_>>()
            .join("; ");
    }
}

/// Poisoned outputs of one launch on the device: `o` and `lse` (NaN bit patterns), each
/// followed by [`GUARD`] elements that must stay poisoned.
pub(crate) struct Poisoned<T> {
    /// o and its guard.
    pub o: cudarc::driver::CudaSlice<T>,
    /// lse and its guard.
    pub lse: cudarc::driver::CudaSlice<f32>,
    n_o: usize,
    n_lse: usize,
}

impl<T: GpuElement> Poisoned<T> {
    /// Fresh poisoned buffers of `n_o` and `n_lse` elements plus their guards.
    pub(crate) fn new(gpu: &Gpu, n_o: usize, n_lse: usize) -> Result<Self> {
        // SAFETY: T is f16 or bf16; every 16-bit pattern is a valid value.
        let poison: T = unsafe { std::mem::transmute_copy::<u16, T>(&POISON16) };
        let stream = gpu.stream();
        Ok(Poisoned {
            o: stream
                .clone_htod(&vec![poison; n_o + GUARD])
                .map_err(cuda_err("poisoning o"))?,
            lse: stream
                .clone_htod(&vec![f32::NAN; n_lse + GUARD])
                .map_err(cuda_err("poisoning lse"))?,
            n_o,
            n_lse,
        })
    }

    /// o and lse copied back (without the guards), and how many guard elements were written.
    pub(crate) fn read(&self, gpu: &Gpu) -> Result<(Vec<T>, Vec<f32>, usize)> {
        let stream = gpu.stream();
        let mut o: Vec<T> = stream
            .clone_dtoh(&self.o)
            .map_err(cuda_err("copying o back"))?;
        let mut lse: Vec<f32> = stream
            .clone_dtoh(&self.lse)
            .map_err(cuda_err("copying lse back"))?;
        let written = o[self.n_o..]
            .iter()
            .filter(|x| to_bits(**x) != POISON16)
            .count()
            + lse[self.n_lse..].iter().filter(|x| !x.is_nan()).count();
        o.truncate(self.n_o);
        lse.truncate(self.n_lse);
        Ok((o, lse, written))
    }
}

impl<T: GpuElement> Poisoned<T> {
    /// After a launch into these buffers: waits for the stream (a fault is the launch's error,
    /// told with `what`), records in `result` whether and what ran ([`CaseResult::launched`]),
    /// then reads o and lse back, counting written guard elements into
    /// `result.guard_overwritten`. `None` when nothing ran (`result` then says why).
    ///
    /// # Errors
    /// Copy failures of [`Self::read`] (a failed launch is recorded, not returned).
    pub(crate) fn collect(
        &self,
        gpu: &Gpu,
        result: &mut CaseResult,
        kernel: KernelKind,
        launched: Result<LaunchInfo>,
        what: impl Into<String>,
    ) -> Result<Option<(Vec<T>, Vec<f32>)>> {
        if !result.launched(kernel, synced(gpu, launched, what)) {
            return Ok(None);
        }
        let (o, lse, written) = self.read(gpu)?;
        result.guard_overwritten = written;
        Ok(Some((o, lse)))
    }
}

/// A launch's outcome once its stream is done: a fault surfaces here, told with `what`.
pub(crate) fn synced(
    gpu: &Gpu,
    launched: Result<LaunchInfo>,
    what: impl Into<String>,
) -> Result<LaunchInfo> {
    let info = launched?;
    gpu.stream().synchronize().map_err(cuda_err(what))?;
    Ok(info)
}

/// The bits of a 16-bit element (f16 or bf16).
pub(crate) fn to_bits<T: GpuElement>(x: T) -> u16 {
    // SAFETY: T is f16 or bf16, both 16-bit plain data.
    unsafe { std::mem::transmute_copy::<T, u16>(&x) }
}
