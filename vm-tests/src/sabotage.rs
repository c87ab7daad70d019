//! Removing one policy from a booted guest, so a run can show that the check guarding it fails
//! (`vm-tests run --remove-policy earlyoom` must end with `memory-pressure` failing). Only ever
//! applied to the throw-away `-snapshot` guest.

use anyhow::Result;

use crate::ssh::Ssh;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Policy {
    /// zram swap off: `memory-policy` must fail.
    Zram,
    /// earlyoom stopped: `memory-policy` and `memory-pressure` (the kernel kills) must fail.
    Earlyoom,
    /// nftables ruleset flushed: `firewall` must fail.
    Firewall,
    /// llm-server's MemoryMax lifted: `memory-policy` must fail.
    UnitLimits,
    /// The API port's per-source meters deleted from the ruleset: `api-meters` and
    /// `api-meter-drops` must fail.
    Meters,
    /// The server unit's IPAddressDeny cleared: `metadata-denied-to-server` must fail.
    MetadataDeny,
    /// RestartPreventExitStatus cleared and the server started again on the old CPU:
    /// `no-avx2-refusal` must fail.
    RestartPrevention,
}

impl Policy {
    /// Whether this policy lives on the old-CPU guest rather than the main one.
    pub fn on_old_cpu(self) -> bool {
        self == Policy::RestartPrevention
    }

    fn script(self) -> &'static str {
        match self {
            Policy::Zram => "swapoff /dev/zram0",
            Policy::Earlyoom => "systemctl stop earlyoom",
            Policy::Firewall => "nft flush ruleset",
            Policy::UnitLimits => "systemctl set-property --runtime llm-server MemoryMax=infinity",
            Policy::Meters => {
                "for handle in $(nft -a list chain inet appliance input \
                   | grep -E '@api_(syn|conns)_v[46] [{]' | sed 's/.*# handle //'); do
                   nft delete rule inet appliance input handle $handle
                 done"
            }
            Policy::MetadataDeny => "systemctl set-property --runtime llm-server IPAddressDeny=",
            Policy::RestartPrevention => {
                "mkdir -p /run/systemd/system/llm-server.service.d
                 printf '[Service]\\nRestartPreventExitStatus=\\n' \
                   > /run/systemd/system/llm-server.service.d/vm-test.conf
                 systemctl daemon-reload
                 systemctl reset-failed llm-server
                 systemctl start --no-block llm-server"
            }
        }
    }

    pub fn apply(self, ssh: &Ssh) -> Result<()> {
        eprintln!("vm-tests: removing the policy `{self:?}` from the guest");
        ssh.check(self.script()).map(drop)
    }
}
