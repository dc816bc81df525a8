//! The backward pass on the GPU: the launcher and its tiles ([`backward`]) and the Hopper
//! kernel's TMA maps and defines ([`backward_wgmma`]).

pub mod backward;
pub mod backward_wgmma;
