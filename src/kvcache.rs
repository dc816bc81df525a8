//! Decoding against a KV cache: the problem, its oracle and CPU backend
//! ([`crate::problem::kvcache`]) and the call that picks a backend
//! ([`crate::dispatch::kvcache::forward`]), under one name for callers.

pub use crate::dispatch::kvcache::{KvCacheRun, forward};
pub use crate::problem::kvcache::*;
