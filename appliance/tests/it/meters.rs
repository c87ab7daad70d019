//! The API port's per-source meters in a real kernel: the rendered ruleset is loaded into a
//! network namespace of its own, a listener on the API port takes connections over loopback,
//! and a client opens them one after another. Loopback is accepted before any rule on the box
//! (`iif "lo" accept`), so that one line is left out here: everything else is the ruleset the
//! image installs.
//!
//! The test runs itself again inside `unshare --map-root-user --net` (a user and network
//! namespace where it is root), as `nft` needs netlink and the namespace must be entered before
//! any thread starts.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use appliance::profile::Profile;
use appliance::render;

/// Set in the re-run: the rulesets to load, separated by a newline.
const INNER: &str = "APPLIANCE_METER_TEST_RULESETS";
/// A connection the meter drops gets no answer to its SYN. Shorter than TCP's first SYN
/// retransmission (1 s), which a refilled token bucket would let through.
const DROPPED_WITHIN: Duration = Duration::from_millis(500);

fn ruleset(profile: &Profile, dir: &Path, name: &str) -> String {
    let text = render::render(profile)
        .into_iter()
        .find(|f| f.path == "/etc/nftables.conf")
        .unwrap()
        .contents;
    let lo = "\t\tiif \"lo\" accept\n";
    assert_eq!(text.matches(lo).count(), 1, "{text}");
    let path = dir.join(name);
    std::fs::write(&path, text.replacen(lo, "", 1)).unwrap();
    path.to_str().unwrap().to_owned()
}

fn profile() -> Profile {
    Profile::load(&test_support::default_profile()).unwrap()
}

#[test]
fn the_meters_drop_a_sources_connections_beyond_the_profiles_bounds() {
    if let Ok(rulesets) = std::env::var(INNER) {
        let rulesets: Vec<&str> = rulesets.lines().collect();
        inside_the_namespace(&rulesets);
        return;
    }
    for tool in ["nft", "unshare", "ip"] {
        assert!(
            Command::new(tool).arg("-V").output().is_ok(),
            "{tool} is missing: apt-get install nftables util-linux iproute2 (.ci/run does)"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    // As shipped (16 connections per source, SYNs at 10/s with a burst of 20), then with the
    // SYN bucket the one to bind: a burst of 5 and connections unbounded.
    let shipped = ruleset(&profile(), dir.path(), "shipped.nft");
    let mut rate = profile();
    rate.network.api_connections_per_source = 1000;
    rate.network.api_syn_per_source_per_sec = 1;
    rate.network.api_syn_burst = 5;
    let rate = ruleset(&rate, dir.path(), "rate.nft");
    let out = Command::new("unshare")
        .args(["--map-root-user", "--net"])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "meters::the_meters_drop_a_sources_connections_beyond_the_profiles_bounds",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(INNER, format!("{shipped}\n{rate}"))
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "in the namespace:\n{said}");
    // The re-run did run the test (a filter that matched nothing would pass too).
    assert!(said.contains("1 passed"), "{said}");
}

/// `ok` for each connection that completed, `x` for each the kernel dropped, in order.
fn attempts(to: SocketAddr, n: usize, held: &mut Vec<TcpStream>) -> String {
    (0..n)
        .map(|_| match TcpStream::connect_timeout(&to, DROPPED_WITHIN) {
            Ok(s) => {
                held.push(s);
                '.'
            }
            Err(_) => 'x',
        })
        .collect()
}

fn inside_the_namespace(rulesets: &[&str]) {
    let run = |program: &str, args: &[&str]| {
        let out = Command::new(program).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run("ip", &["link", "set", "lo", "up"]);
    let p = profile();
    let port = p.server.api_port.0;
    // One listener on `::` for both families, as the server binds. It holds each connection
    // until the client closes it, so the kernel counts it open until then.
    let listener = TcpListener::bind(("::", port)).unwrap();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            std::thread::spawn(move || std::io::copy(&mut s, &mut std::io::sink()));
        }
    });
    let v4: SocketAddr = ([127, 0, 0, 1], port).into();
    let v6: SocketAddr = (std::net::Ipv6Addr::LOCALHOST, port).into();

    run("nft", &["-f", rulesets[0]]);
    let n = p.network.api_connections_per_source as usize;
    let want = format!("{}xx", ".".repeat(n));
    for (family, to) in [("IPv4", v4), ("IPv6", v6)] {
        let mut held = Vec::new();
        let got = attempts(to, n + 2, &mut held);
        assert_eq!(
            got, want,
            "{family}: {n} connections per source, then dropped"
        );
        // Once the source's connections close, it may connect again.
        drop(held);
        std::thread::sleep(Duration::from_millis(200));
        let mut again = Vec::new();
        assert_eq!(attempts(to, 1, &mut again), ".", "{family} after closing");
    }

    run("nft", &["-f", rulesets[1]]);
    for (family, to) in [("IPv4", v4), ("IPv6", v6)] {
        let mut held = Vec::new();
        // A burst of 5 back to back, then the 6th SYN is over the rate.
        let got = attempts(to, 6, &mut held);
        assert_eq!(got, ".....x", "{family}: the SYN burst, then dropped");
    }
}
