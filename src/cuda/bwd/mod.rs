//! The backward pass on the GPU: the launcher and its tiles ([`backward`]), the Hopper
//! kernel's TMA maps and defines ([`backward_wgmma`]), and packed variable-length batches in
//! one attn_bwd launch ([`varlen`]).

pub mod backward;
pub mod backward_wgmma;
pub mod varlen;
