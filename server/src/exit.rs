//! The process's exit statuses: the one place they are defined. `main` returns them, the CPU
//! check (`cpu_guard`) exits with [`Status::CpuUnsupported`] before Rust runs, and the appliance
//! tells systemd which of them a restart cannot fix: its renderer and its Nix module hold copies
//! of [`Status::NO_RESTART`], each checked against this list by the appliance's tests.

use std::fmt;
use std::process::ExitCode;

/// How `llm-server` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    Success = 0,
    /// A bad option, model file, key file or certificate: the message names it.
    BadInput = 1,
    /// The memory plan does not fit the limits (`plan`, `serve`).
    DoesNotFit = 2,
    /// The CPU lacks x86-64-v3 (AVX2, FMA, F16C, BMI1/2).
    CpuUnsupported = 3,
    /// The decode thread panicked: a fault of ours that a restart clears (sysexits' EX_SOFTWARE).
    EnginePanic = 70,
    /// The memory plan fits every ceiling but not what the host has free now (`serve`, after
    /// `--wait-for-memory`): other processes hold the memory, and a restart once they free it
    /// succeeds (sysexits' EX_TEMPFAIL).
    MemoryShort = 75,
}

impl Status {
    /// The statuses that a restart cannot fix: systemd must not loop on them
    /// (`RestartPreventExitStatus=`); the reason is the server's last journal line.
    pub const NO_RESTART: [Status; 3] =
        [Status::BadInput, Status::DoesNotFit, Status::CpuUnsupported];

    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Ends the process now, for the places that cannot return to `main` (a panic hook).
    pub fn exit(self) -> ! {
        std::process::exit(i32::from(self.code()))
    }
}

impl From<Status> for ExitCode {
    fn from(status: Status) -> ExitCode {
        ExitCode::from(status.code())
    }
}

/// An error that ends the process with a status other than [`Status::BadInput`], the status of
/// every other error that reaches `main`.
#[derive(Debug)]
pub struct Refusal {
    pub status: Status,
    pub message: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_status_that_systemd_restarts_is_one_it_does_not() {
        assert!(!Status::NO_RESTART.contains(&Status::Success));
        assert!(!Status::NO_RESTART.contains(&Status::EnginePanic));
        assert!(!Status::NO_RESTART.contains(&Status::MemoryShort));
        assert_eq!(Status::CpuUnsupported.code(), 3);
    }
}
