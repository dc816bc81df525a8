//! Variable-length batches: the problem ([`crate::problem::varlen`]) and the call that picks a
//! backend ([`crate::dispatch::varlen::forward`]), under one name for callers.

pub use crate::dispatch::varlen::forward;
pub use crate::problem::varlen::*;
