//! Records the commit the binary is built from (`FLASHATTN_GIT_COMMIT`, with `-dirty` when
//! tracked files differ from it), so that benchmark JSON written on another machine names the
//! code that ran, not whatever checkout sits in that machine's working directory.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() {
    // Paths are relative to this package (tools/); the stamp covers the library too. The git
    // files are asked of git, since in a worktree `.git` is a file and they live elsewhere.
    for path in [
        "src",
        "build.rs",
        "Cargo.toml",
        "bench",
        "../src",
        "../kernels",
        "../Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    for name in ["HEAD", "index", "refs", "packed-refs"] {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = git(&["rev-parse", "HEAD"]).filter(|c| !c.is_empty());
    if let Some(commit) = commit {
        let dirty =
            git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
        let suffix = if dirty { "-dirty" } else { "" };
        println!("cargo:rustc-env=FLASHATTN_GIT_COMMIT={commit}{suffix}");
    }
}
