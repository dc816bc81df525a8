//! Context parallelism (ring attention): a sequence too long for one device is sharded along
//! its length over `N` ranks; each rank keeps its queries, the key/value shards travel around a
//! ring, each rank attends its queries to the shard in hand, and the partial results are merged
//! exactly through their lse ([`crate::merge`]).
//!
//! - [`shard`]: which global sequence positions each rank holds. Causal problems use the
//!   load-balanced ("zigzag") layout: the sequence is cut into `2N` chunks and rank `r` holds
//!   chunks `r` and `2N - 1 - r`, so every rank sees the same number of visible pairs.
//! - [`ring`]: the ring schedule and its simulation on the CPU with `N` ranks in one process
//!   (the communication is a rotation of buffers), so that sharding, ordering and the merge are
//!   tested without GPUs or NCCL. The GPU version replaces the partial attention by a kernel
//!   launch and the rotation by NCCL send/recv on a second stream.

pub mod ring;
pub mod shard;

pub use ring::{RingOutput, partial_cpu, ring_forward_cpu};
pub use shard::Sharding;
