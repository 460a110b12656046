//! One plugin instance at a time owns a node's state: its state directory (a driver's
//! checkpoint, say), what it prepared and the kubelet sockets. Go's kubeletplugin
//! helper serializes rolling updates the same way, inside the helper.
//!
//! During a rolling update with `maxSurge` the DaemonSet runs the old and the new
//! plugin pod on a node at once, and only deletes the old one once the new one is
//! Ready. So the new instance must be able to take the state over from a live old
//! one, rather than wait for it to go away:
//!
//! 1. Ownership is an exclusive `flock` on `<state-dir>/owner.lock`. The kernel drops
//!    it when the owner dies, however it dies, so a killed owner never blocks.
//! 2. An instance that finds the lock held writes `<state-dir>/takeover-request`
//!    with its name and waits for the lock.
//! 3. The owner watches for that file. When it appears, the owner stops taking new
//!    work, removes its sockets, finishes what is in flight, drops its state and
//!    releases the lock; then it idles until its pod is deleted (exiting would only
//!    get its container restarted, and a restarted container would ask for the
//!    state back).
//! 4. The new instance gets the lock, removes the request, reads the checkpoint
//!    afresh and only then binds its sockets and registers with the kubelet.
//! 5. An instance that asked and then died (killed right after writing its request)
//!    never takes the lock. The old owner, idle after the handover, tries the lock
//!    again once `Timing::abandoned` has passed, and serves again when it is still
//!    free: the node is without an owner for seconds, not until a restart.
//!
//! An instance should ask only for state it can use: one that takes the lock from a
//! live owner, finds it cannot write the directory and drops the lock again leaves
//! the node to the old owner, which takes it back (step 5) and is asked again at
//! the next try, for ever. So a driver checks the directory (with
//! [`probe_writable`], and whatever else it needs) while [`try_acquire`] says the
//! lock is held, and calls [`acquire`] only when that check passes; and an
//! instance that took the lock and then cannot write keeps it, serving what it can
//! and answering handover requests like any owner.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lock file; its content names the owner, for operators.
pub const LOCK_FILE: &str = "owner.lock";
/// Written by an instance that wants the state; holds its name.
pub const TAKEOVER_FILE: &str = "takeover-request";

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OwnershipError {
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> OwnershipError {
    let path = path.to_owned();
    move |source| OwnershipError::Io {
        action,
        path,
        source,
    }
}

/// Held ownership of a state directory; dropping it releases the lock.
#[derive(Debug)]
pub struct Ownership {
    dir: PathBuf,
    name: String,
    // Held only for its lock: closing the file releases it.
    _lock: File,
}

/// How often a waiting instance retries the lock and an owner looks for a request.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Timing {
    pub poll: Duration,
    /// How often a waiting instance logs that it is still waiting.
    pub report: Duration,
    /// How long after a handover the old owner leaves the lock to the new one
    /// before it takes the state back. A live waiter retries every `poll`, so it
    /// has had many tries by then.
    pub abandoned: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            poll: Duration::from_millis(200),
            report: Duration::from_secs(10),
            abandoned: Duration::from_secs(3),
        }
    }
}

fn try_lock(file: &File) -> io::Result<bool> {
    // SAFETY: flock on a descriptor this File owns; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Writes `content` to `path` through a temp file and a rename, so a reader never
/// sees half a name.
fn write_atomic(path: &Path, content: &str) -> Result<(), OwnershipError> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    fs::write(&tmp, content).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, path).map_err(io_err("rename into place", path))
}

/// Checks that the owner can write `dir` and read the files of `state` in it (a
/// driver's checkpoint, say): a lock file can be had on a read-only mount (or with
/// the disk full) where no state can be saved, and state that cannot be read would
/// fail the start. Writes and removes a probe file; a file of `state` may be absent.
pub fn probe_writable(dir: &Path, state: &[&str]) -> Result<(), OwnershipError> {
    let probe = dir.join(format!(".probe-{}", std::process::id()));
    let written = File::create(&probe)
        .and_then(|mut f| f.write_all(b"probe").and_then(|()| f.sync_all()))
        .map_err(io_err("write", &probe));
    let _ = fs::remove_file(&probe);
    written?;
    for name in state {
        let path = dir.join(name);
        match fs::File::open(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err("read", &path)(e)),
            _ => {}
        }
    }
    Ok(())
}

/// Takes ownership of `dir` for the instance `name` if nobody holds it; `None` when
/// another instance does. Never asks for it. Creates `dir` if needed.
pub fn try_acquire(dir: &Path, name: &str) -> Result<Option<Ownership>, OwnershipError> {
    let (lock_path, file) = open_lock(dir)?;
    if try_lock(&file).map_err(io_err("lock", &lock_path))? {
        take(dir, name, &lock_path, file).map(Some)
    } else {
        Ok(None)
    }
}

/// Who the lock file of `dir` names as the owner (`<name> pid <pid>`), as far as it
/// can be read; for messages.
pub fn named_owner(dir: &Path) -> Option<String> {
    fs::read_to_string(dir.join(LOCK_FILE))
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Takes ownership of `dir` for the instance `name`, asking a live owner to hand
/// over and waiting until it has. Creates `dir` if needed.
pub async fn acquire(dir: &Path, name: &str, timing: Timing) -> Result<Ownership, OwnershipError> {
    let (lock_path, file) = open_lock(dir)?;
    let request = dir.join(TAKEOVER_FILE);
    let mut asked = false;
    let started = tokio::time::Instant::now();
    let mut next_report = started + timing.report;
    loop {
        if try_lock(&file).map_err(io_err("lock", &lock_path))? {
            break;
        }
        if !asked {
            let owner = fs::read_to_string(&lock_path).unwrap_or_default();
            tracing::info!(
                owner = owner.trim(),
                "node state is owned by another instance; asking it to hand over"
            );
            write_atomic(&request, name)?;
            asked = true;
        }
        if tokio::time::Instant::now() >= next_report {
            tracing::info!(
                waited_s = started.elapsed().as_secs(),
                "still waiting for the other instance to hand over the node state"
            );
            // A new owner clears requests when it takes over; ask it again.
            if !request.exists() {
                write_atomic(&request, name)?;
            }
            next_report += timing.report;
        }
        tokio::time::sleep(timing.poll).await;
    }
    let owned = take(dir, name, &lock_path, file)?;
    if asked {
        tracing::info!(
            waited_ms = started.elapsed().as_millis() as u64,
            "took over the node state"
        );
    }
    Ok(owned)
}

fn open_lock(dir: &Path) -> Result<(PathBuf, File), OwnershipError> {
    fs::create_dir_all(dir).map_err(io_err("create", dir))?;
    let lock_path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&lock_path)
        .map_err(io_err("open", &lock_path))?;
    Ok((lock_path, file))
}

/// With the lock held: clears requests and names the owner in the lock file.
fn take(dir: &Path, name: &str, lock_path: &Path, file: File) -> Result<Ownership, OwnershipError> {
    let request = dir.join(TAKEOVER_FILE);
    // Any request now is ours, answered, or a dead instance's: a live waiter
    // writes its request again, so only fresh ones make this owner hand over.
    match fs::remove_file(&request) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(io_err("remove", &request)(e));
        }
        _ => {}
    }
    let mut owned = &file;
    let stamp = format!("{name} pid {}\n", std::process::id());
    file.set_len(0).map_err(io_err("truncate", lock_path))?;
    owned
        .write_all(stamp.as_bytes())
        .map_err(io_err("write", lock_path))?;
    Ok(Ownership {
        dir: dir.to_owned(),
        name: name.to_owned(),
        _lock: file,
    })
}

impl Ownership {
    /// Resolves with the requester's name once another instance asks for the state.
    pub async fn handover_requested(&self, timing: Timing) -> String {
        let request = self.dir.join(TAKEOVER_FILE);
        loop {
            match fs::read_to_string(&request) {
                Ok(who) if !who.is_empty() && who != self.name => return who,
                _ => tokio::time::sleep(timing.poll).await,
            }
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Lets go of the lock, after a handover. Whoever asked may take it now.
    pub fn release(self) -> Released {
        Released {
            dir: self.dir,
            name: self.name,
        }
    }
}

/// A state directory this instance owned and handed over, or one it stepped back
/// from because another instance owns it.
#[derive(Debug)]
pub struct Released {
    dir: PathBuf,
    name: String,
}

impl Released {
    /// `dir`, owned by another instance, for `name` to take once that one is gone
    /// ([`Released::reclaim_when_abandoned`]).
    pub fn standing_by(dir: &Path, name: &str) -> Self {
        Self {
            dir: dir.to_owned(),
            name: name.to_owned(),
        }
    }

    /// Resolves with the ownership again once the lock is still free
    /// `timing.abandoned` after the handover, or free again later (the new owner
    /// died): nobody else serves the node then. Never asks: a live owner keeps it.
    pub async fn reclaim_when_abandoned(self, timing: Timing) -> Result<Ownership, OwnershipError> {
        tokio::time::sleep(timing.abandoned).await;
        loop {
            let (lock_path, file) = open_lock(&self.dir)?;
            if try_lock(&file).map_err(io_err("lock", &lock_path))? {
                return take(&self.dir, &self.name, &lock_path, file);
            }
            drop(file);
            tokio::time::sleep(timing.abandoned).await;
        }
    }
}

#[cfg(test)]
mod tests;
