//! Pod network setup benchmark (masquerade binding, IPv4 + IPv6) in throwaway network namespaces
//! (needs root, `ip`, `nft`): qlauncher's in-process netlink + one nftables transaction
//! ([`qlauncher::net::discover`], [`qlauncher::net::plan`], [`qlauncher::net::apply`]) against the
//! same end state reached with the `ip` and `nft` processes KubeVirt's phase 1 stands for (one
//! `nft` process per table, chain and rule, as `masquerade.go` `setupNATByFamily` runs them; the
//! links and addresses as `ip` processes, the sysctls written directly as KubeVirt's Go code does).
//! Each iteration uses a fresh pod namespace; the namespace set-up is not timed.
//! Run: `cargo bench --bench net_setup [-- ITERATIONS]` (default 10). Prints one line per side
//! and a `net-setup` summary line (milliseconds: median min max) for `scripts/bench`.

use qlauncher::net::NetConfig;
use std::time::{Duration, Instant};
use testkit::net::{kubevirt_masquerade_links, kubevirt_nft, resolv_conf, setup, POD_IPV4};
use testkit::netns::PodNet;
use testkit::storage::run;

/// The tools' way, run on a thread inside the pod namespace (children inherit it).
fn with_tools(pod: &testkit::netns::Netns) -> Duration {
    qlauncher::net::netns::run_in(&pod.path(), || {
        let t = Instant::now();
        for args in kubevirt_masquerade_links(0, true) {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run("ip", &args);
        }
        for (key, v) in [
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv6/conf/all/forwarding", "1"),
            ("net/ipv4/conf/k6t-eth0/route_localnet", "1"),
        ] {
            std::fs::write(format!("/proc/sys/{key}"), v).expect("sysctl");
        }
        // The default masquerade interface (all ports), one `nft` process per command.
        for cmd in kubevirt_nft(&NetConfig::default(), POD_IPV4) {
            let words: Vec<&str> = cmd.iter().map(String::as_str).collect();
            run("nft", &words);
        }
        t.elapsed()
    })
    .expect("netns")
}

fn summary(name: &str, mut xs: Vec<Duration>) -> (f64, f64, f64) {
    xs.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (med, min, max) = (ms(xs[xs.len() / 2]), ms(xs[0]), ms(xs[xs.len() - 1]));
    println!(
        "{name:<34} n={:<3} median {med:>8.3} ms  min {min:>8.3} ms  max {max:>8.3} ms",
        xs.len()
    );
    (med, min, max)
}

fn main() {
    let iterations: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10);
    let resolv = resolv_conf();
    let (mut native, mut tools) = (Vec::new(), Vec::new());
    for _ in 0..iterations {
        let net = PodNet::new(true);
        let t = Instant::now();
        setup(&net.pod, &NetConfig::default(), resolv.path()).expect("qlauncher net setup");
        native.push(t.elapsed());
        drop(net);
        let net = PodNet::new(true);
        tools.push(with_tools(&net.pod));
        let ruleset = net.pod.nft_ruleset();
        assert!(ruleset.contains("KUBEVIRT_POSTINBOUND"), "{ruleset}");
    }
    let n = summary("qlauncher netlink + nft transaction", native);
    let t = summary("ip + nft processes (KubeVirt)", tools);
    println!(
        "net-setup qlauncher {:.3} {:.3} {:.3} tools {:.3} {:.3} {:.3}",
        n.0, n.1, n.2, t.0, t.1, t.2
    );
}
