//! Slots on disk (`serve --slot-save-path DIR`): each slot's conversation is restored from
//! `DIR/slot-<id>.kv` at start, before the server says it is ready, and written back there on
//! a graceful stop and when it changed and has been idle for a while; `POST /slots/{id}`
//! saves, restores and erases on request ([`SlotAction`]). The file format is
//! [`kv_file`](crate::model::kv_file)'s. Restoring writes into the cache every slot already
//! allocated: nothing grows.
//!
//! Everything here runs on the decode thread, which owns the sessions: an action waits for its
//! slot to be free, as llama-server's does.

use std::path::{Path, PathBuf};
use std::sync::mpsc::SyncSender;
use std::time::{Duration, Instant};

use crate::model::kv_file::{self, KvFileError, ModelId, Moved};
use crate::model::{Model, Session};

/// Where and when slots are saved.
#[derive(Debug, Clone)]
pub struct SlotStore {
    /// The directory of the slot files (it exists).
    pub dir: PathBuf,
    /// A slot whose conversation changed is saved after this long without a job (`None`: only
    /// at a graceful stop).
    pub idle_save: Option<Duration>,
}

/// Free space left on the disk after a save, so that the caches never fill it.
const DISK_RESERVE: u64 = 16 << 20;

/// Actions waiting for their slot; more are refused as busy.
pub(super) const MAX_PENDING: usize = 8;

/// What `POST /slots/{id}?action=` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotAction {
    Save,
    Restore,
    Erase,
}

/// What an action did, for its answer.
#[derive(Debug, Clone, PartialEq)]
pub enum SlotOutcome {
    Saved { moved: Moved, ms: f64 },
    Restored { moved: Moved, ms: f64 },
    Erased { tokens: usize },
}

/// Why an action failed.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("this server does not support slots action; start it with `--slot-save-path`")]
    NotEnabled,
    #[error("slot {id} does not exist: the server has {slots} (ids 0 to {})", slots - 1)]
    NoSuchSlot { id: usize, slots: usize },
    #[error("no file `{0}` in --slot-save-path; save a slot to it first")]
    NoFile(String),
    #[error("cannot restore `{file}`: {reason}")]
    BadFile { file: String, reason: KvFileError },
    #[error("not enough disk space for `{file}`: {need} bytes needed (with a reserve of {DISK_RESERVE}), {free} free")]
    NoSpace { file: String, need: u64, free: u64 },
    #[error("{MAX_PENDING} slot actions already wait for their slots; retry later")]
    Busy,
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("the slot stayed busy for the whole request timeout; retry when it is free")]
    TimedOut,
    #[error("cannot save `{file}`: {reason}")]
    Io { file: String, reason: String },
}

/// An action queued for the decode thread.
pub(super) struct SlotOp {
    pub slot: usize,
    pub action: SlotAction,
    /// The file, inside the store's directory (unused by erase).
    pub file: String,
    pub reply: SyncSender<Result<SlotOutcome, SlotError>>,
}

/// The store as the decode thread uses it.
pub(super) struct Store {
    pub config: SlotStore,
    pub model_id: ModelId,
}

impl Store {
    pub fn new(config: SlotStore, model: &Model) -> Store {
        Store {
            model_id: kv_file::model_identity(model.gguf()),
            config,
        }
    }

    /// The file a slot is saved to on its own.
    pub fn slot_path(&self, id: usize) -> PathBuf {
        self.config.dir.join(format!("slot-{id}.kv"))
    }

    /// Restores slot `id` from its file, if there is one. A file that cannot be used is
    /// deleted, with one log line naming it and the reason; the slot starts cold.
    pub fn restore_at_start(&self, model: &Model, id: usize, session: &mut Session) {
        let path = self.slot_path(id);
        if !path.exists() {
            return;
        }
        let started = Instant::now();
        match kv_file::restore(session, model.config(), &self.model_id, &path) {
            Ok(moved) => tracing::info!(
                "slot {id}: restored {} tokens from {} in {:.0} ms",
                moved.tokens,
                path.display(),
                started.elapsed().as_secs_f64() * 1e3
            ),
            Err(e) if e.is_bad_file() => {
                session.clear();
                let removed = match std::fs::remove_file(&path) {
                    Ok(()) => "deleted it".to_string(),
                    Err(e) => format!("could not delete it ({e})"),
                };
                tracing::warn!(
                    "slot {id}: refusing {}: {e}; {removed}, the slot starts cold",
                    path.display()
                );
            }
            Err(e) => {
                session.clear();
                tracing::warn!(
                    "slot {id}: cannot read {}: {e}; the slot starts cold",
                    path.display()
                );
            }
        }
    }

    /// Removes temporary files a crash left behind in the directory.
    pub fn clean_temporaries(&self) {
        let Ok(entries) = std::fs::read_dir(&self.config.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Writes slot `id`'s conversation to its own file (an empty one removes the file), with a
    /// log line for what went wrong. Returns whether the file now stands for the session.
    pub fn autosave(&self, model: &Model, id: usize, session: &Session) -> bool {
        let path = self.slot_path(id);
        if session.tokens().is_empty() {
            return match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!("slot {id}: cannot remove {}: {e}", path.display());
                    false
                }
                _ => true,
            };
        }
        match self.save(model, session, &path) {
            Ok(outcome) => {
                if let SlotOutcome::Saved { moved, ms } = outcome {
                    tracing::info!(
                        "slot {id}: saved {} tokens ({} bytes) to {} in {ms:.0} ms",
                        moved.tokens,
                        moved.bytes,
                        path.display()
                    );
                }
                true
            }
            Err(e) => {
                tracing::warn!("slot {id}: not saved: {e}");
                false
            }
        }
    }

    /// Saves `session` to `path` if the disk has room for it.
    pub fn save(
        &self,
        model: &Model,
        session: &Session,
        path: &Path,
    ) -> Result<SlotOutcome, SlotError> {
        let file = display_name(path);
        let bytes = kv_file::file_bytes(session, model.config());
        let need = bytes + DISK_RESERVE;
        let free = free_bytes(&self.config.dir).map_err(|e| SlotError::Io {
            file: file.clone(),
            reason: format!("cannot read the free space of its disk: {e}"),
        })?;
        if free < need {
            return Err(SlotError::NoSpace { file, need, free });
        }
        let started = Instant::now();
        let moved = kv_file::save(session, model.config(), &self.model_id, path).map_err(|e| {
            SlotError::Io {
                file,
                reason: e.to_string(),
            }
        })?;
        Ok(SlotOutcome::Saved {
            moved,
            ms: started.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Runs `op` on `session` (its slot is free).
    pub fn run(
        &self,
        model: &Model,
        session: &mut Session,
        op: &SlotOp,
    ) -> Result<SlotOutcome, SlotError> {
        let path = self.config.dir.join(&op.file);
        match op.action {
            SlotAction::Save => self.save(model, session, &path),
            SlotAction::Restore => {
                let started = Instant::now();
                match kv_file::restore(session, model.config(), &self.model_id, &path) {
                    Ok(moved) => Ok(SlotOutcome::Restored {
                        moved,
                        ms: started.elapsed().as_secs_f64() * 1e3,
                    }),
                    Err(KvFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                        Err(SlotError::NoFile(op.file.clone()))
                    }
                    Err(reason) => Err(SlotError::BadFile {
                        file: op.file.clone(),
                        reason,
                    }),
                }
            }
            SlotAction::Erase => {
                let tokens = session.tokens().len();
                session.clear();
                Ok(SlotOutcome::Erased { tokens })
            }
        }
    }
}

fn display_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    )
}

/// Bytes an unprivileged process may still write on the disk of `dir`.
fn free_bytes(dir: &Path) -> nix::Result<u64> {
    let s = nix::sys::statvfs::statvfs(dir)?;
    Ok((s.blocks_available() as u64).saturating_mul(s.fragment_size() as u64))
}

/// The longest file name `POST /slots/{id}` takes.
const MAX_FILE_NAME: usize = 128;

/// Why a file name given to `POST /slots/{id}` is refused, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileNameError {
    #[error("`filename` is empty: give a file name such as \"chat.kv\"")]
    Empty,
    #[error("`filename` is {0} bytes long; at most {MAX_FILE_NAME}")]
    TooLong(usize),
    #[error("`filename` may not start with `.` (no `..`, no hidden files)")]
    Hidden,
    #[error("`filename` {0:?} may hold only letters, digits, `-`, `_` and `.` (no `/`): it names a file inside --slot-save-path")]
    BadCharacter(String),
}

/// Checks a file name given to `POST /slots/{id}`: a plain name inside the directory.
pub fn check_file_name(name: &str) -> Result<(), FileNameError> {
    if name.is_empty() {
        return Err(FileNameError::Empty);
    }
    if name.len() > MAX_FILE_NAME {
        return Err(FileNameError::TooLong(name.len()));
    }
    if name.starts_with('.') {
        return Err(FileNameError::Hidden);
    }
    let ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err(FileNameError::BadCharacter(name.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_names_inside_the_directory_are_accepted() {
        for ok in ["chat.kv", "slot-0.bin", "a_b.C9", "x"] {
            assert!(check_file_name(ok).is_ok(), "{ok}");
        }
        let long = "a".repeat(129);
        for bad in [
            "",
            "..",
            "../etc/passwd",
            "a/b",
            "/abs",
            ".hidden",
            "a\\b",
            "nul\0",
            "spa ce",
            "é.kv",
            &long,
        ] {
            assert!(check_file_name(bad).is_err(), "{bad:?}");
        }
    }
}
