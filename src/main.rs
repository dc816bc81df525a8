//! The `flashattn` command line: `run`, `info` (and the hidden `cpu-gemm-rate`).
//!
//! Errors are printed as one message on stderr with a non-zero exit code, never a panic.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
