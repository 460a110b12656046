//! Running `nvidia-cdi-hook --version` to prove a hook binary works on this node:
//! bounded in time and in output, and every failure told in an operator's terms.

use super::*;

/// What of the hook's `--version` output is read.
const OUTPUT_LIMIT: u64 = 64 * 1024;

/// Runs `<path> --version` with an empty environment (the runtime gives a hook
/// only what the spec says) and returns the first non-empty line of its output.
pub(super) fn run_version(path: &Path, timeout: Duration) -> Result<String, String> {
    let mut child = Command::new(path)
        .arg("--version")
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| spawn_problem(&e))?;
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
    // A child of the hook that keeps the pipes open must not hold the start up.
    let collect = |rx: mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(Duration::from_secs(1))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    let (out, err) = (collect(stdout), collect(stderr));
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

fn read_in_background(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(pipe) = pipe {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = pipe.take(OUTPUT_LIMIT).read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    rx
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
