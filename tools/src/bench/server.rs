//! The persistent peers process: `python3 tools/bench/peers.py --serve`, started once per
//! bench run. It answers a hello line (versions, device, or why torch or the GPU is missing),
//! then one JSON response line per JSON request line; every answer is awaited with a time
//! limit, and a process that times out or exits is stopped and says why, so that the bench
//! never hangs on it. Lines come back as text (the caller parses them: `peers::Peers`).

use serde::Serialize;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// A running `peers.py --serve`.
pub struct PeerServer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    seq: u64,
    timeout: Duration,
    hello: String,
    stopped: Option<String>,
}

impl PeerServer {
    /// Starts `python script --serve [extra]` and waits (at most `timeout`) for its hello.
    /// The process's stderr (progress) goes to ours.
    ///
    /// # Errors
    /// Why it could not start or said no hello in time (the process is stopped).
    pub fn start(
        python: &str,
        script: &Path,
        extra: &[&str],
        timeout: Duration,
    ) -> Result<Self, String> {
        let mut child = Command::new(python)
            .arg(script)
            .arg("--serve")
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("could not start {python}: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout pipe to peers.py")?;
        let (tx, rx) = channel();
        // The reader ends when the process closes its stdout (exit or kill).
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(l) = line else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut server = PeerServer {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            seq: 0,
            timeout,
            hello: String::new(),
            stopped: None,
        };
        let deadline = Instant::now() + timeout;
        match server.await_line(deadline, |v| v.get("ready").is_some()) {
            Ok(hello) => {
                server.hello = hello;
                Ok(server)
            }
            Err(why) => Err(format!("peers.py --serve did not start: {why}")),
        }
    }

    /// The hello line (a JSON object with `ready`, `ok`, `error` and the environment:
    /// torch, cuDNN, CUDA, device).
    pub fn hello(&self) -> &str {
        &self.hello
    }

    /// Why the process was stopped, once it was.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Sends one request (with a `seq` added) and waits at most the time limit for its
    /// answer: the JSON line carrying that `seq` (or, for a request the server could not
    /// read at all, `"ok": false` and no `seq`).
    ///
    /// # Errors
    /// Why there is no answer: the process was stopped before, or exits or times out (it is
    /// stopped then, and every later request fails at once with the same reason).
    pub fn request(&mut self, req: &impl Serialize) -> Result<String, String> {
        if let Some(why) = &self.stopped {
            return Err(why.clone());
        }
        self.seq += 1;
        let seq = self.seq;
        let mut value = serde_json::to_value(req).map_err(|e| e.to_string())?;
        if let Some(obj) = value.as_object_mut() {
            obj.insert("seq".into(), seq.into());
        }
        let sent = match self.stdin.as_mut() {
            Some(stdin) => writeln!(stdin, "{value}").and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("stdin already closed")),
        };
        if let Err(e) = sent {
            let status = self.child.try_wait().ok().flatten();
            let why = match status {
                Some(s) => format!("peers.py exited ({s})"),
                None => format!("writing to peers.py failed: {e}"),
            };
            return Err(self.stop(why));
        }
        let deadline = Instant::now() + self.timeout;
        // The answer to this request, or a "bad request" answer, which carries no seq when the
        // line could not be parsed at all.
        let mine = |v: &serde_json::Value| {
            v.get("seq").and_then(|s| s.as_u64()) == Some(seq)
                || (v.get("seq").is_none_or(|s| s.is_null())
                    && v.get("ok").and_then(|o| o.as_bool()) == Some(false))
        };
        self.await_line(deadline, mine)
    }

    /// Waits until `deadline` for a line holding a JSON object that `wanted` accepts; other
    /// lines are shown on stderr and skipped. Stops the process on time-out or exit.
    fn await_line(
        &mut self,
        deadline: Instant,
        wanted: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<String, String> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let value: Option<serde_json::Value> = serde_json::from_str(&line).ok();
                    match value {
                        Some(v) if v.is_object() && wanted(&v) => return Ok(line),
                        _ => eprintln!("[peers] (not an answer) {}", truncate(&line, 300)),
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let why = format!(
                        "no answer from peers.py within {} s (--peers-timeout); it was stopped",
                        self.timeout.as_secs_f64()
                    );
                    return Err(self.stop(why));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self
                        .child
                        .wait()
                        .map_or_else(|e| e.to_string(), |s| s.to_string());
                    return Err(self.stop(format!("peers.py exited ({status}) without answering")));
                }
            }
        }
    }

    /// Kills the process (if it still runs), records `why` and returns it.
    fn stop(&mut self, why: String) -> String {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stopped = Some(why.clone());
        why
    }
}

impl Drop for PeerServer {
    /// Closes stdin (the server's loop ends), gives it 5 s to exit, then kills it.
    fn drop(&mut self) {
        self.stdin = None;
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
