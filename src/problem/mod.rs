//! The problem descriptions of packed variable-length batches ([`varlen`]) and of decoding
//! against a KV cache ([`kvcache`]): validation, layouts, the exact oracles and the CPU paths.
//! They sit beside [`crate::shape`] below both backends, so that [`crate::cuda`] can take them
//! without reaching up into [`crate::dispatch`], which decides where a call runs.

pub mod kvcache;
pub mod varlen;
