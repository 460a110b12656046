//! Running the driver's tools with a time limit.

use std::path::Path;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use super::SharingError;

/// Waits for `child` (`command`, run from `program`) to exit, for at most
/// `timeout`: a tool that hangs (a GPU falling off the bus) must not hold a prepare
/// forever. Past the limit it is killed and reaped, so no zombie is left behind.
pub(super) fn wait_within(
    child: &mut Child,
    program: &Path,
    command: &str,
    timeout: Duration,
) -> Result<ExitStatus, SharingError> {
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if started.elapsed() < timeout => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SharingError::TimedOut {
                    command: command.to_owned(),
                    timeout,
                });
            }
            Err(source) => {
                return Err(SharingError::Spawn {
                    program: program.to_owned(),
                    source,
                });
            }
        }
    }
}
