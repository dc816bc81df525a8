//! NVRTC: CUDA C++ source -> CUBIN for one exact architecture, with ptxas statistics.
//!
//! We compile to CUBIN (`nvrtcGetCUBIN`), not PTX: a driver refuses PTX produced by an NVRTC
//! newer than itself, but loads a CUBIN for its own architecture. `--ptxas-options=-v` makes
//! ptxas print registers, spill bytes and shared memory into the program log, which we parse so
//! that the "zero spills" rule can be tested on machines without a GPU.

use crate::error::{AttnError, Result};
use cudarc::nvrtc::{result, sys};
use std::ffi::{CStr, CString, c_char};

/// What ptxas reported for one kernel entry point.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PtxasStats {
    /// Mangled or `extern "C"` entry name.
    pub function: String,
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of spill stores (must be 0 for our kernels).
    pub spill_stores: u32,
    /// Bytes of spill loads (must be 0 for our kernels).
    pub spill_loads: u32,
    /// Stack frame bytes (local memory per thread).
    pub stack_frame: u32,
    /// Static shared memory bytes (dynamic shared memory is not included).
    pub shared: u32,
}

/// A compiled module: the CUBIN bytes, the compiler log and per-function statistics.
#[derive(Debug, Clone)]
pub struct Cubin {
    /// CUBIN image for `arch`.
    pub image: Vec<u8>,
    /// The target, e.g. `sm_90`.
    pub arch: String,
    /// NVRTC + ptxas log.
    pub log: String,
    /// One entry per kernel in the module.
    pub stats: Vec<PtxasStats>,
}

/// `true` when an NVRTC shared library can be loaded on this machine (no panic when absent).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen candidate names; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version as (major, minor).
///
/// # Errors
/// [`AttnError::BackendUnavailable`] when NVRTC cannot be loaded.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters; the library is present (checked above).
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    if r != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(AttnError::BackendUnavailable {
            backend: "cuda",
            reason: format!("nvrtcVersion failed: {r:?}"),
        });
    }
    Ok((major, minor))
}

fn ensure_nvrtc() -> Result<()> {
    if nvrtc_present() {
        Ok(())
    } else {
        Err(AttnError::BackendUnavailable {
            backend: "cuda",
            reason: "the NVRTC library (libnvrtc.so.13) was not found: install the CUDA 13 runtime compiler (e.g. `pip install nvidia-cuda-nvrtc==13.0.*`) and add its lib folder to LD_LIBRARY_PATH".into(),
        })
    }
}

/// Compiles `source` (already self-contained: no `#include`) to a CUBIN for `arch`
/// (`sm_80`, `sm_86`, `sm_89`, `sm_90`, `sm_90a`, `sm_120`, ...). `defines` become `-D` options.
///
/// # Errors
/// [`AttnError::BackendUnavailable`] without NVRTC; [`AttnError::Compile`] with the full log
/// when the source does not compile.
pub fn compile_cubin(
    source: &str,
    name: &str,
    arch: &str,
    defines: &[(String, String)],
) -> Result<Cubin> {
    ensure_nvrtc()?;
    let err = |log: String| AttnError::Compile {
        kernel: name.to_string(),
        arch: arch.to_string(),
        log,
    };
    let src = CString::new(source).map_err(|_| err("source contains a NUL byte".into()))?;
    let cname = CString::new(name).map_err(|_| err("name contains a NUL byte".into()))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| err(format!("{e:?}")))?;
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
        "--device-as-default-execution-space".to_string(),
    ];
    options.extend(defines.iter().map(|(k, v)| format!("-D{k}={v}")));
    // SAFETY: `prog` is a live program; options are plain strings.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let log = unsafe { result::get_program_log(prog) }
        .map(|raw| {
            unsafe { CStr::from_ptr(raw.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    let image = compiled
        .map_err(|e| err(format!("{e:?}\n{log}")))
        .and_then(|()| {
            let mut size = 0usize;
            // SAFETY: size query then a buffer of that size, on a successfully compiled program.
            unsafe {
                let r = sys::nvrtcGetCUBINSize(prog, &mut size);
                if r != sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(err(format!(
                        "nvrtcGetCUBINSize: {r:?} (was a real sm_XX arch given?)"
                    )));
                }
                let mut buf = vec![0u8; size];
                let r = sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char);
                if r != sys::nvrtcResult::NVRTC_SUCCESS {
                    return Err(err(format!("nvrtcGetCUBIN: {r:?}")));
                }
                Ok(buf)
            }
        });
    // SAFETY: destroyed once, after its last use.
    let _ = unsafe { result::destroy_program(prog) };
    let image = image?;
    Ok(Cubin {
        image,
        arch: arch.to_string(),
        stats: parse_ptxas_log(&log),
        log,
    })
}

/// Parses ptxas `-v` output:
/// `ptxas info    : Compiling entry function 'f' for 'sm_90'`,
/// `ptxas info    : Function properties for f` / `    N bytes stack frame, N bytes spill stores, N bytes spill loads`,
/// `ptxas info    : Used N registers, used 0 barriers, N bytes smem, ...`.
pub fn parse_ptxas_log(log: &str) -> Vec<PtxasStats> {
    let mut out: Vec<PtxasStats> = Vec::new();
    let num_before = |line: &str, key: &str| -> Option<u32> {
        let idx = line.find(key)?;
        line[..idx]
            .split(|c: char| !c.is_ascii_digit())
            .rfind(|s| !s.is_empty())?
            .parse()
            .ok()
    };
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let f = rest.split('\'').next().unwrap_or("").to_string();
            out.push(PtxasStats {
                function: f,
                ..Default::default()
            });
        } else if let Some(cur) = out.last_mut() {
            if line.contains("spill stores") {
                cur.stack_frame = num_before(line, "bytes stack frame").unwrap_or(0);
                cur.spill_stores = num_before(line, "bytes spill stores").unwrap_or(0);
                cur.spill_loads = num_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                cur.registers = num_before(line, "registers").unwrap_or(0);
                cur.shared = num_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_verbose_output() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'attn_mma' for 'sm_90'\n\
ptxas info    : Function properties for attn_mma\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]\n";
        let s = parse_ptxas_log(log);
        assert_eq!(s.len(), 1);
        assert_eq!(
            s[0],
            PtxasStats {
                function: "attn_mma".into(),
                registers: 168,
                spill_stores: 4,
                spill_loads: 12,
                stack_frame: 8,
                shared: 1024
            }
        );
    }
}
