//! `appliance doctor` against fake /proc and /sys trees: a box set up as the profile says is
//! green, and each way of breaking it fails the check that names it.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use appliance::doctor::{self, Host, Status};
use appliance::profile::{Port, Profile};
use appliance::render;
use appliance::secrets::{self, Files, Metadata, MetadataError};

/// A launch that gave no metadata: the box makes its own key and certificate.
struct NoMetadata;

impl Metadata for NoMetadata {
    fn get(&self, _key: &str) -> Result<Option<String>, MetadataError> {
        Ok(None)
    }

    fn private_ip(&self) -> Result<Option<std::net::IpAddr>, MetadataError> {
        Ok(None)
    }
}

const CGROUP: &str = "sys/fs/cgroup/system.slice/llm-server.service";

/// A fake root file system holding what a healthy e2-micro box shows (its secrets made as on a
/// first boot), and a loopback server answering `/health` over TLS with its certificate.
struct FakeBox {
    root: tempfile::TempDir,
    profile: Profile,
}

impl FakeBox {
    fn healthy() -> FakeBox {
        let mut profile = Profile::load(&test_support::default_profile()).unwrap();
        let root = tempfile::tempdir().unwrap();
        secrets::provision(&profile, &Files::under(root.path()), &NoMetadata).unwrap();
        profile.server.api_port = Port(serve_health("200 OK", root.path()));
        let fake = FakeBox { root, profile };
        // 1 GB guest: MemTotal a little under 1 GiB, so zram is capped at 384 MiB.
        fake.write(
            "proc/meminfo",
            "MemTotal:        1000000 kB\nMemFree: 1 kB\nMemAvailable:     780000 kB\n",
        );
        fake.write(
            "proc/swaps",
            "Filename\tType\tSize\tUsed\tPriority\n/dev/zram0 partition\t393212\t0\t100\n",
        );
        fake.write("sys/block/zram0/disksize", &(384u64 << 20).to_string());
        fake.write(
            "sys/block/zram0/comp_algorithm",
            "lzo lzo-rle lz4 lz4hc 842 [zstd]\n",
        );
        fake.write(
            "sys/block/zram0/mm_stat",
            "104857600 34952533 36700160 0 36700160 12 0 0 0\n",
        );
        for (key, value) in &fake.profile.sysctl {
            fake.write(
                &format!("proc/sys/{}", key.replace('.', "/")),
                &format!("{value}\n"),
            );
        }
        let earlyoom: String = std::iter::once("/usr/bin/earlyoom".to_owned())
            .chain(render::earlyoom_args(&fake.profile))
            .map(|a| a + "\0")
            .collect();
        fake.write("proc/310/comm", "earlyoom\n");
        fake.write("proc/310/cmdline", &earlyoom);
        fake.write("proc/420/comm", "llm-server\n");
        fake.write("proc/420/cgroup", "0::/system.slice/llm-server.service\n");
        fake.write("proc/420/oom_score_adj", "-900\n");
        fake.write(
            "proc/420/status",
            "Name:\tllm-server\nVmRSS:\t  312000 kB\n",
        );
        fake.write(
            "proc/420/stat",
            "420 (llm-server) S 1 420 420 0 -1 4194560 9000 0 61 0 50 30",
        );
        fake.write("proc/420/maps", &"7f00-7f01 r--p 0 00:00 0\n".repeat(120));
        fake.write(
            "proc/cpuinfo",
            "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 bmi1 bmi2 f16c fma abm movbe xsave\n",
        );
        // The plan the image builder installed, which the limits resolve against.
        let s = &fake.profile.server;
        let plan = format!(
            r#"{{"model": "{}", "ctx_size": {}, "parallel": {}, "weights_bytes": 96576768,
            "kv_cache_bytes": 188743680, "scratch_bytes": 56404480,
            "vocabulary_bytes": 19243607, "total_bytes": 360968535}}"#,
            fake.profile.model_path(),
            s.ctx_size,
            s.parallel
        );
        fake.write(appliance::paths::PLAN.trim_start_matches('/'), &plan);
        let m = fake
            .profile
            .memory_limits(&appliance::plan::ServerPlan::parse(&plan).unwrap())
            .unwrap();
        assert_eq!(
            (m.min_mib, m.low_mib, m.high_mib, m.max_mib),
            (96, 384, 512, 576)
        );
        for (file, mib) in [
            ("min", m.min_mib),
            ("low", m.low_mib),
            ("high", m.high_mib),
            ("max", m.max_mib),
        ] {
            fake.write(
                &format!("{CGROUP}/memory.{file}"),
                &format!("{}\n", mib << 20),
            );
        }
        fake.write(
            &format!("{CGROUP}/memory.current"),
            &format!("{}\n", 430u64 << 20),
        );
        fake.write(
            &format!("{CGROUP}/memory.events"),
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n",
        );
        fake.write(
            &format!("{CGROUP}/cpu.stat"),
            "usage_usec 100\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
        );
        fake.write(
            "dev/kmsg",
            "6,1,100,-;Linux version 6.1.0\n6,2,200,-;zram0: detected capacity change\n",
        );
        fake
    }

    fn write(&self, path: &str, text: &str) {
        let path = self.root.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn path(&self) -> PathBuf {
        self.root.path().to_owned()
    }

    /// The status of check `name`, asserting it ran.
    fn status(&self, name: &str) -> Status {
        let report = doctor::examine(&self.profile, &Host::new(self.path()));
        let check = report
            .check(name)
            .unwrap_or_else(|| panic!("no check {name}"));
        assert_eq!(
            report.healthy(),
            report.checks.iter().all(|c| c.status != Status::Fail)
        );
        if check.status != Status::Ok {
            assert!(
                check.fix.is_some(),
                "{name} fails without saying how to fix it"
            );
        }
        check.status
    }
}

/// A one-shot-per-connection HTTPS server on loopback with the certificate under `root`;
/// returns its port.
fn serve_health(status: &'static str, root: &Path) -> u16 {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read, Write};
    let files = Files::under(root);
    let certs = CertificateDer::pem_file_iter(&files.tls_cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&files.tls_key).unwrap();
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for tcp in listener.incoming().flatten() {
            let tls = rustls::ServerConnection::new(config.clone()).unwrap();
            let mut stream = rustls::StreamOwned::new(tls, tcp);
            // Read the whole request head before answering, as a real server does.
            let mut request = Vec::new();
            let mut chunk = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                match stream.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = write!(stream, "HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
            stream.conn.send_close_notify();
            let _ = stream.flush();
        }
    });
    port
}

#[test]
fn a_box_set_up_as_the_profile_says_is_healthy() {
    let fake = FakeBox::healthy();
    let report = doctor::examine(&fake.profile, &Host::new(fake.path()));
    for check in &report.checks {
        assert_eq!(check.status, Status::Ok, "{check:?}");
    }
    let names: Vec<&str> = report.checks.iter().map(|c| c.name).collect();
    assert_eq!(
        names,
        [
            "zram",
            "sysctl",
            "earlyoom",
            "kernel-oom",
            "mem-total",
            "headroom",
            "cpu",
            "api-keys",
            "tls",
            "server",
            "unit-limits",
            "memory-events",
            "server-memory",
            "cpu-throttling",
            "health"
        ]
    );
    assert!(report.check("zram").unwrap().detail.contains("ratio 3.0"));
    assert!(report
        .check("server-memory")
        .unwrap()
        .detail
        .contains("61 major faults, 120 of 262144"));
}

#[test]
fn zram_with_the_wrong_algorithm_size_or_not_swapping_fails() {
    let fake = FakeBox::healthy();
    fake.write("sys/block/zram0/comp_algorithm", "lzo [lz4] zstd\n");
    assert_eq!(fake.status("zram"), Status::Fail);
    let fake = FakeBox::healthy();
    fake.write("sys/block/zram0/disksize", &(488u64 << 20).to_string());
    assert_eq!(fake.status("zram"), Status::Fail);
    let fake = FakeBox::healthy();
    fake.write("proc/swaps", "Filename\tType\tSize\tUsed\tPriority\n");
    assert_eq!(fake.status("zram"), Status::Fail);
}

#[test]
fn a_sysctl_off_the_profile_fails() {
    let fake = FakeBox::healthy();
    fake.write("proc/sys/vm/swappiness", "60\n");
    assert_eq!(fake.status("sysctl"), Status::Fail);
}

#[test]
fn earlyoom_missing_or_with_other_arguments_fails() {
    let fake = FakeBox::healthy();
    fake.write("proc/310/cmdline", "/usr/bin/earlyoom\0-m\x0010\0");
    assert_eq!(fake.status("earlyoom"), Status::Fail);
    let fake = FakeBox::healthy();
    fake.write("proc/310/comm", "bash\n");
    assert_eq!(fake.status("earlyoom"), Status::Fail);
}

#[test]
fn a_kernel_oom_kill_fails() {
    let fake = FakeBox::healthy();
    fake.write(
        "dev/kmsg",
        "3,9,300,-;Out of memory: Killed process 777 (hog) total-vm:900000kB, anon-rss:800000kB\n",
    );
    assert_eq!(fake.status("kernel-oom"), Status::Fail);
}

#[test]
fn a_box_with_less_memory_than_the_profile_states_fails_naming_the_figure_to_set() {
    let fake = FakeBox::healthy();
    // 983040 kB is 960 MiB, under the shipped profile's 965: earlyoom's lines sit lower.
    fake.write(
        "proc/meminfo",
        "MemTotal:         983040 kB\nMemAvailable:     700000 kB\n",
    );
    let report = doctor::examine(&fake.profile, &Host::new(fake.path()));
    let check = report.check("mem-total").unwrap();
    assert_eq!(check.status, Status::Fail, "{check:?}");
    assert!(
        check
            .detail
            .contains("MemTotal 960 MiB, the profile states 965"),
        "{check:?}"
    );
    assert!(
        check
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("machine.mem_total_mib = 960"),
        "{check:?}"
    );
    // A fraction of a MiB short of the figure is short of it.
    fake.write(
        "proc/meminfo",
        "MemTotal:         988159 kB\nMemAvailable:     700000 kB\n",
    );
    assert_eq!(fake.status("mem-total"), Status::Fail);
    fake.write(
        "proc/meminfo",
        "MemTotal:         988160 kB\nMemAvailable:     700000 kB\n",
    );
    assert_eq!(fake.status("mem-total"), Status::Ok);
}

#[test]
fn less_available_memory_than_the_profile_promises_fails() {
    let fake = FakeBox::healthy();
    // 500 MiB, under the shipped profile's 512.
    fake.write(
        "proc/meminfo",
        "MemTotal:        1000000 kB\nMemAvailable:     512000 kB\n",
    );
    assert_eq!(fake.status("headroom"), Status::Fail);
    fake.write("proc/meminfo", "MemTotal:        1000000 kB\n");
    assert_eq!(fake.status("headroom"), Status::Fail);
}

#[test]
fn a_cpu_without_avx2_fails() {
    let fake = FakeBox::healthy();
    fake.write("proc/cpuinfo", "flags\t\t: fpu sse2 avx\n");
    assert_eq!(fake.status("cpu"), Status::Fail);
}

#[test]
fn a_server_outside_its_unit_or_absent_fails() {
    let fake = FakeBox::healthy();
    fake.write("proc/420/cgroup", "0::/user.slice/session-1.scope\n");
    assert_eq!(fake.status("server"), Status::Fail);
    let fake = FakeBox::healthy();
    fake.write("proc/420/comm", "sleep\n");
    assert_eq!(fake.status("server"), Status::Fail);
}

#[test]
fn limits_off_the_profile_fail() {
    let fake = FakeBox::healthy();
    fake.write(&format!("{CGROUP}/memory.max"), "max\n");
    assert_eq!(fake.status("unit-limits"), Status::Fail);
    let fake = FakeBox::healthy();
    fake.write("proc/420/oom_score_adj", "0\n");
    assert_eq!(fake.status("unit-limits"), Status::Fail);
    // The limits are resolved from the image's plan: without it they cannot be checked.
    let fake = FakeBox::healthy();
    std::fs::remove_file(
        fake.path()
            .join(appliance::paths::PLAN.trim_start_matches('/')),
    )
    .unwrap();
    let report = doctor::examine(&fake.profile, &Host::new(fake.path()));
    let check = report.check("unit-limits").unwrap();
    assert_eq!(check.status, Status::Fail);
    assert!(
        check.detail.contains("/etc/llm-appliance/plan.json"),
        "{check:?}"
    );
}

#[test]
fn memory_events_fail_on_oom_and_warn_on_throttling() {
    let fake = FakeBox::healthy();
    fake.write(
        &format!("{CGROUP}/memory.events"),
        "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
    );
    assert_eq!(fake.status("memory-events"), Status::Fail);
    let fake = FakeBox::healthy();
    fake.write(
        &format!("{CGROUP}/memory.events"),
        "low 0\nhigh 12\nmax 0\noom 0\noom_kill 0\n",
    );
    assert_eq!(fake.status("memory-events"), Status::Warn);
}

#[test]
fn too_many_memory_maps_fail_and_a_cgroup_near_its_ceiling_warns() {
    let fake = FakeBox::healthy();
    fake.write("proc/sys/vm/max_map_count", "130\n");
    assert_eq!(fake.status("server-memory"), Status::Fail);
    let fake = FakeBox::healthy();
    fake.write(
        &format!("{CGROUP}/memory.current"),
        &format!("{}\n", 570u64 << 20),
    );
    assert_eq!(fake.status("server-memory"), Status::Warn);
}

#[test]
fn cpu_throttling_warns() {
    let fake = FakeBox::healthy();
    fake.write(
        &format!("{CGROUP}/cpu.stat"),
        "nr_periods 10\nnr_throttled 4\nthrottled_usec 9000\n",
    );
    assert_eq!(fake.status("cpu-throttling"), Status::Warn);
}

#[test]
fn health_fails_when_the_server_errs_or_is_not_listening() {
    let mut fake = FakeBox::healthy();
    fake.profile.server.api_port = Port(serve_health("503 Service Unavailable", &fake.path()));
    assert_eq!(fake.status("health"), Status::Fail);
    // A server with another certificate is not this box's: the pinned client refuses it.
    let other = tempfile::tempdir().unwrap();
    secrets::provision(&fake.profile, &Files::under(other.path()), &NoMetadata).unwrap();
    fake.profile.server.api_port = Port(serve_health("200 OK", other.path()));
    assert_eq!(fake.status("health"), Status::Fail);
    // A port nothing listens on: bind one, then free it.
    let unused = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    fake.profile.server.api_port = Port(unused);
    assert_eq!(fake.status("health"), Status::Fail);
}

#[test]
fn the_doctor_prints_the_key_and_the_fingerprint_and_fails_without_them() {
    let fake = FakeBox::healthy();
    let files = Files::under(&fake.path());
    let keys = secrets::parse_keys(&std::fs::read_to_string(&files.api_keys).unwrap()).unwrap();
    let report = doctor::examine(&fake.profile, &Host::new(fake.path()));
    let detail = &report.check("api-keys").unwrap().detail;
    assert!(detail.contains(&keys[0]), "{detail}");
    // The line saying where the key came from is not a key.
    assert!(!detail.contains('#'), "{detail}");
    let pem = std::fs::read(&files.tls_cert).unwrap();
    let fingerprint = appliance::tls::Fingerprint::of_pem(&pem)
        .unwrap()
        .to_string();
    assert!(report.check("tls").unwrap().detail.contains(&fingerprint));
    // The banner shows the fingerprint and where the key is, never the key (it is world-readable).
    let banner = secrets::banner(&fake.profile, &files);
    assert!(banner.contains(&fingerprint), "{banner}");
    assert!(banner.contains("/var/lib/llm-secrets/api-keys"), "{banner}");
    assert!(!banner.contains(&keys[0]), "{banner}");
    assert!(
        report.check("tls").unwrap().detail.contains("valid until"),
        "{:?}",
        report.check("tls")
    );

    // A certificate within its renewal window warns, naming the fix.
    let old = std::time::SystemTime::now()
        - std::time::Duration::from_secs(86_400 * (appliance::tls::LIFETIME_DAYS as u64 - 10));
    let names = appliance::tls::subject_alt_names("llm-appliance", None);
    let made = appliance::tls::self_signed("llm-appliance", &names, old).unwrap();
    std::fs::write(&files.tls_cert, &made.cert_pem).unwrap();
    assert_eq!(fake.status("tls"), Status::Warn);

    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&files.api_keys, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(fake.status("api-keys"), Status::Fail);
    let report = doctor::examine(&fake.profile, &Host::new(fake.path()));
    let detail = &report.check("api-keys").unwrap().detail;
    assert!(
        detail.ends_with("has mode 644: others may read it"),
        "{detail}"
    );
    std::fs::write(&files.tls_cert, "not a certificate").unwrap();
    assert_eq!(fake.status("tls"), Status::Fail);
    let report = doctor::examine(&fake.profile, &Host::new(fake.path()));
    let detail = &report.check("tls").unwrap().detail;
    assert_eq!(detail, "no `BEGIN CERTIFICATE` block");
    std::fs::remove_file(&files.tls_cert).unwrap();
    assert_eq!(fake.status("tls"), Status::Fail);
    let report = doctor::examine(&fake.profile, &Host::new(fake.path()));
    let detail = &report.check("tls").unwrap().detail;
    assert!(detail.starts_with("cannot read "), "{detail}");
}

#[test]
fn the_command_exits_non_zero_and_prints_json_when_something_is_off() {
    let fake = FakeBox::healthy();
    fake.write("proc/sys/vm/swappiness", "60\n");
    let profile = fake.path().join("profile.toml");
    std::fs::write(&profile, &fake.profile.source).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_appliance"))
        .args(["doctor", "--json", "--profile"])
        .arg(&profile)
        .arg("--root")
        .arg(fake.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["healthy"], false);
    let sysctl = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sysctl")
        .unwrap();
    assert_eq!(sysctl["status"], "fail");
    assert!(sysctl["detail"]
        .as_str()
        .unwrap()
        .contains("vm.swappiness = 60 (want 10)"));
}
