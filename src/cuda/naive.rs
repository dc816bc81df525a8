//! Launcher of attn_naive.cu (being written).

use super::attention::{Launch, LaunchInfo};
use super::device::Gpu;
use crate::error::{AttnError, Result};

/// Launches attn_naive.
///
/// # Errors
/// Not written yet.
pub fn launch(_gpu: &Gpu, _l: &Launch) -> Result<LaunchInfo> {
    Err(AttnError::UnknownKernel { name: "naive".into(), available: "mma".into() })
}
