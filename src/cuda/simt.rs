//! Launcher of attn_simt.cu (being written).

use super::attention::{Launch, LaunchInfo};
use super::device::Gpu;
use crate::error::{AttnError, Result};

/// Launches attn_simt.
///
/// # Errors
/// Not written yet.
pub fn launch(_gpu: &Gpu, _l: &Launch) -> Result<LaunchInfo> {
    Err(AttnError::UnknownKernel { name: "simt".into(), available: "mma".into() })
}
