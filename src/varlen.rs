//! Variable-length batches: the problem ([`crate::problem::varlen`]) and the calls that pick a
//! backend ([`crate::dispatch::varlen::forward`], [`crate::dispatch::varlen::backward`]), under
//! one name for callers.

pub use crate::dispatch::varlen::{backward, forward};
pub use crate::problem::varlen::*;
pub use crate::problem::varlen_device::DeviceVarlenProblem;
