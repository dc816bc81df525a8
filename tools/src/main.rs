//! The `flashattn` command line: `run`, `check`, `probe`, `bench`, `bench-plot`, `info`.
//!
//! Errors are printed as one message on stderr with a non-zero exit code, never a panic.

mod cli;

fn main() -> std::process::ExitCode {
    // Like other Unix tools, end quietly when the reader of stdout goes away (`| head`),
    // instead of panicking in println! on a broken pipe.
    #[cfg(unix)]
    // SAFETY: restores the default disposition of SIGPIPE before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    cli::main()
}
