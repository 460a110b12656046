//! Running `nvidia-cdi-hook --version` to prove a hook binary works on this node:
//! bounded in time and in output, and every failure told in an operator's terms.

use std::sync::{Arc, Mutex, PoisonError};

use super::*;

/// What of the hook's `--version` output is read.
const OUTPUT_LIMIT: usize = 64 * 1024;
/// How long the output is waited for once the hook has exited. What it printed is
/// in the pipe by then; the end of the pipe may never come, when a child the hook
/// left behind holds it open.
const OUTPUT_GRACE: Duration = Duration::from_secs(1);

/// Runs `<path> --version` with an empty environment (the runtime gives a hook
/// only what the spec says) and returns the first non-empty line of its output.
pub(super) fn run_version(path: &Path, timeout: Duration) -> Result<String, String> {
    let mut child = spawn_version(path)?;
    let stdout = read_in_background(child.stdout.take());
    let stderr = read_in_background(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "did not answer `--version` within {} ms (killed)",
                    timeout.as_millis()
                ));
            }
            Err(e) => return Err(format!("could not be waited for ({e})")),
        }
    };
    // A child of the hook that keeps the pipes open must not hold the start up,
    // nor hide what the hook printed before it exited.
    let until = Instant::now() + OUTPUT_GRACE;
    let (out, err) = (stdout.collect(until), stderr.collect(until));
    if !status.success() {
        return Err(format!(
            "failed to run `--version` ({}){}",
            describe_status(status),
            excerpt(&err, &out)
        ));
    }
    out.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| {
            format!(
                "printed nothing for `--version` (is it nvidia-cdi-hook?){}",
                excerpt(&err, "")
            )
        })
}

/// What a pipe of the hook brought so far, read by a thread of its own.
struct Output {
    read: Arc<Mutex<Vec<u8>>>,
    /// Closed when the thread is done: the end of the pipe, an error or the limit.
    done: mpsc::Receiver<()>,
}

impl Output {
    /// What was read by the time the pipe ended, or by `until`, whichever is first.
    fn collect(self, until: Instant) -> String {
        let _ = self
            .done
            .recv_timeout(until.saturating_duration_since(Instant::now()));
        let read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&read).into_owned()
    }
}

fn read_in_background(pipe: Option<impl Read + Send + 'static>) -> Output {
    let (tx, done) = mpsc::channel::<()>();
    let read = Arc::new(Mutex::new(Vec::new()));
    if let Some(mut pipe) = pipe {
        let read = Arc::clone(&read);
        // Chunk by chunk into the shared buffer, so that what came is there to
        // collect even while the pipe stays open. The thread ends with the pipe.
        std::thread::spawn(move || {
            let _tx = tx;
            let mut chunk = [0u8; 4096];
            loop {
                let n = match pipe.read(&mut chunk) {
                    Ok(0) => return,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => return,
                };
                let mut read = read.lock().unwrap_or_else(PoisonError::into_inner);
                let room = OUTPUT_LIMIT.saturating_sub(read.len());
                read.extend_from_slice(&chunk[..n.min(room)]);
                if read.len() >= OUTPUT_LIMIT {
                    return;
                }
            }
        });
    }
    Output { read, done }
}

/// How long a hook that is busy being written is tried again.
const TEXT_BUSY_RETRY: Duration = Duration::from_secs(2);

/// Starts `<path> --version`. A file that was just written (the copy this plugin
/// installs, or one an image build or a test made a moment ago) can refuse to
/// start with ETXTBSY for a moment: a process forked by another thread before the
/// writer closed it holds a writable descriptor until that child calls exec. That
/// clears on its own, so it is tried again for a bounded time; every other error,
/// and ETXTBSY that lasts, is reported.
fn spawn_version(path: &Path) -> Result<std::process::Child, String> {
    let until = Instant::now() + TEXT_BUSY_RETRY;
    loop {
        let spawned = Command::new(path)
            .arg("--version")
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        match spawned {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other.map_err(|e| spawn_problem(&e)),
        }
    }
}

/// Why the kernel refused to start it, in the terms of the likely cause.
fn spawn_problem(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOEXEC) => {
            format!("is not a program this machine can run ({e}): built for another architecture?")
        }
        // The file exists (checked before), so what is missing is its program
        // interpreter: the dynamic loader of another architecture or C library.
        Some(libc::ENOENT) => format!(
            "cannot be started ({e}): its dynamic loader is missing, so it is built for \
             another architecture or C library"
        ),
        Some(libc::ETXTBSY) => {
            format!("cannot be started ({e}): another process still has it open for writing")
        }
        Some(libc::EACCES) => {
            format!("cannot be started ({e}): is its file system mounted noexec?")
        }
        _ => format!("cannot be started ({e})"),
    }
}

fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

/// ": <the first lines of what it printed>", preferring stderr.
fn excerpt(stderr: &str, stdout: &str) -> String {
    let text = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(3)
        .collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!(": {}", lines.join(" / "))
    }
}
