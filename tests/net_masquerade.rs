//! Masquerade binding in real network namespaces: the exact nftables ruleset per variant,
//! links and sysctls, idempotent re-runs and exact teardown.

use qlauncher::net::{NetConfig, Port, Protocol};
use testkit::net::{
    kubevirt_masquerade_links, kubevirt_nft, kubevirt_nft_ruleset, reapply, resolv_conf, setup,
    teardown,
};
use testkit::netns::{Netns, PodNet};

fn variants() -> Vec<(&'static str, NetConfig, &'static str)> {
    let ports = vec![
        Port {
            protocol: Protocol::Tcp,
            port: 80,
        },
        Port {
            protocol: Protocol::Udp,
            port: 53,
        },
    ];
    vec![
        ("all ports", NetConfig::default(), EXPECTED_ALL_PORTS),
        (
            "listed ports with legacy migration",
            NetConfig {
                ports: ports.clone(),
                legacy_migration_ports: true,
                ..Default::default()
            },
            EXPECTED_PORTS_MIGRATION,
        ),
        (
            "istio, all ports",
            NetConfig {
                istio: true,
                ..Default::default()
            },
            EXPECTED_ISTIO,
        ),
        (
            "istio, listed ports",
            NetConfig {
                istio: true,
                ports: vec![
                    Port {
                        protocol: Protocol::Tcp,
                        port: 22,
                    },
                    Port {
                        protocol: Protocol::Tcp,
                        port: 80,
                    },
                ],
                ..Default::default()
            },
            EXPECTED_ISTIO_PORTS,
        ),
    ]
}

#[test]
fn ruleset_equals_kubevirt_for_each_variant() {
    for (name, cfg, expected) in variants() {
        let net = PodNet::new(true);
        let resolv = resolv_conf();
        setup(&net.pod, &cfg, resolv.path()).unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let got = net.pod.nft_ruleset();
        assert_eq!(
            got,
            kubevirt_nft_ruleset(&cfg),
            "{name}: differs from the nft CLI running KubeVirt's commands"
        );
        assert_eq!(got, expected, "{name}");
    }
}

#[test]
fn links_sysctls_idempotence_and_teardown() {
    let net = PodNet::new(true);
    let resolv = resolv_conf();
    let before_links = net.pod.ip(&["-br", "link"]);
    let before_fwd = net.pod.sysctl("net.ipv4.ip_forward");
    let cfg = NetConfig {
        queues: 2,
        runtime_uid: 107,
        ..Default::default()
    };
    let (plan, applied) = setup(&net.pod, &cfg, resolv.path()).unwrap();
    assert!(!applied.changed.is_empty());

    let links = net.pod.ip(&["-d", "-j", "link", "show"]);
    let links: serde_json::Value = serde_json::from_str(&links).unwrap();
    let find = |n: &str| {
        links
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["ifname"] == n)
            .cloned()
            .unwrap_or_else(|| panic!("no {n}"))
    };
    let br = find("k6t-eth0");
    assert_eq!(
        (
            br["address"].as_str(),
            br["mtu"].as_u64(),
            br["linkinfo"]["info_kind"].as_str()
        ),
        (Some("02:00:00:00:00:00"), Some(1450), Some("bridge"))
    );
    let tap = find("tap0");
    assert_eq!(tap["master"].as_str(), Some("k6t-eth0"));
    assert_eq!(tap["mtu"].as_u64(), Some(1450));
    let ti = &tap["linkinfo"]["info_data"];
    assert_eq!(
        (
            ti["type"].as_str(),
            ti["pi"].as_bool(),
            ti["multi_queue"].as_bool(),
            ti["persist"].as_bool(),
            ti["user"].as_u64(),
            ti["group"].as_u64()
        ),
        (
            Some("tap"),
            Some(false),
            Some(true),
            Some(true),
            Some(107),
            Some(107)
        )
    );
    let addrs = net.pod.ip(&["-br", "addr", "show", "dev", "k6t-eth0"]);
    let words: Vec<&str> = addrs.split_whitespace().collect();
    assert!(
        words.contains(&"10.0.2.1/24") && words.contains(&"fd10:0:2::1/120"),
        "{addrs}"
    );
    assert_eq!(net.pod.sysctl("net.ipv4.ip_forward"), "1");
    assert_eq!(net.pod.sysctl("net.ipv6.conf.all.forwarding"), "1");
    assert_eq!(net.pod.sysctl("net.ipv4.conf.k6t-eth0.route_localnet"), "1");

    let ruleset = net.pod.nft_ruleset();
    let again = reapply(&net.pod, &plan).unwrap();
    assert_eq!(
        again.changed,
        Vec::<String>::new(),
        "second run must change nothing"
    );
    assert_eq!(net.pod.nft_ruleset(), ruleset);

    teardown(&net.pod, &plan, &applied).unwrap();
    assert_eq!(net.pod.ip(&["-br", "link"]), before_links);
    assert_eq!(net.pod.nft_ruleset(), "");
    assert_eq!(net.pod.sysctl("net.ipv4.ip_forward"), before_fwd);
}

#[test]
fn foreign_nat_table_is_left_alone() {
    let net = PodNet::new(false);
    let resolv = resolv_conf();
    net.pod.sh(&["nft", "add", "table", "ip", "nat"]);
    let err = setup(&net.pod, &NetConfig::default(), resolv.path()).unwrap_err();
    // Not virt-handler's setup either (no bridge, no tap): refused, naming what differs.
    let message = err.to_string();
    assert!(
        message.starts_with("the pod network set up in this namespace differs from the plan")
            && message.contains("link k6t-eth0 is missing")
            && message.contains("link tap0 is missing"),
        "{message}"
    );
    assert_eq!(
        net.pod
            .nft_ruleset()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        "table ip nat { }"
    );
}

const EXPECTED_ALL_PORTS: &str = r#"table ip nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth0" counter jump KUBEVIRT_PREINBOUND
	}

	chain input {
		type nat hook input priority 100; policy accept;
	}

	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr 127.0.0.1 counter dnat to 10.0.2.2
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.0.2.2 counter masquerade
		oifname "k6t-eth0" counter jump KUBEVIRT_POSTINBOUND
	}

	chain KUBEVIRT_PREINBOUND {
		counter dnat to 10.0.2.2
	}

	chain KUBEVIRT_POSTINBOUND {
		ip saddr 127.0.0.1 counter snat to 10.0.2.1
	}
}
table ip6 nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth0" counter jump KUBEVIRT_PREINBOUND
	}

	chain input {
		type nat hook input priority 100; policy accept;
	}

	chain output {
		type nat hook output priority -100; policy accept;
		ip6 daddr ::1 counter dnat to fd10:0:2::2
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip6 saddr fd10:0:2::2 counter masquerade
		oifname "k6t-eth0" counter jump KUBEVIRT_POSTINBOUND
	}

	chain KUBEVIRT_PREINBOUND {
		counter dnat to fd10:0:2::2
	}

	chain KUBEVIRT_POSTINBOUND {
		ip6 saddr ::1 counter snat to fd10:0:2::1
	}
}
"#;
const EXPECTED_PORTS_MIGRATION: &str = r#"table ip nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth0" counter jump KUBEVIRT_PREINBOUND
	}

	chain input {
		type nat hook input priority 100; policy accept;
	}

	chain output {
		type nat hook output priority -100; policy accept;
		tcp dport { 49152, 49153 } ip saddr 127.0.0.1 counter return
		ip daddr 127.0.0.1 tcp dport 80 counter dnat to 10.0.2.2
		ip daddr 127.0.0.1 udp dport 53 counter dnat to 10.0.2.2
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.0.2.2 counter masquerade
		oifname "k6t-eth0" counter jump KUBEVIRT_POSTINBOUND
	}

	chain KUBEVIRT_PREINBOUND {
		tcp dport 80 counter dnat to 10.0.2.2
		udp dport 53 counter dnat to 10.0.2.2
	}

	chain KUBEVIRT_POSTINBOUND {
		tcp dport { 49152, 49153 } ip saddr 127.0.0.1 counter return
		tcp dport 80 ip saddr 127.0.0.1 counter snat to 10.0.2.1
		udp dport 53 ip saddr 127.0.0.1 counter snat to 10.0.2.1
	}
}
table ip6 nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth0" counter jump KUBEVIRT_PREINBOUND
	}

	chain input {
		type nat hook input priority 100; policy accept;
	}

	chain output {
		type nat hook output priority -100; policy accept;
		tcp dport { 49152, 49153 } ip6 saddr ::1 counter return
		ip6 daddr ::1 tcp dport 80 counter dnat to fd10:0:2::2
		ip6 daddr ::1 udp dport 53 counter dnat to fd10:0:2::2
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip6 saddr fd10:0:2::2 counter masquerade
		oifname "k6t-eth0" counter jump KUBEVIRT_POSTINBOUND
	}

	chain KUBEVIRT_PREINBOUND {
		tcp dport 80 counter dnat to fd10:0:2::2
		udp dport 53 counter dnat to fd10:0:2::2
	}

	chain KUBEVIRT_POSTINBOUND {
		tcp dport { 49152, 49153 } ip6 saddr ::1 counter return
		tcp dport 80 ip6 saddr ::1 counter snat to fd10:0:2::1
		udp dport 53 ip6 saddr ::1 counter snat to fd10:0:2::1
	}
}
"#;
const EXPECTED_ISTIO: &str = r#"table ip nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth0" counter jump KUBEVIRT_PREINBOUND
	}

	chain input {
		type nat hook input priority 100; policy accept;
	}

	chain output {
		type nat hook output priority -100; policy accept;
		tcp dport { 15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090 } ip saddr 127.0.0.1 counter return
		ip daddr { 10.244.0.5, 127.0.0.1 } counter dnat to 10.0.2.2
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.0.2.2 counter masquerade
		oifname "k6t-eth0" counter jump KUBEVIRT_POSTINBOUND
	}

	chain KUBEVIRT_PREINBOUND {
		tcp dport 22 counter dnat to 10.0.2.2
	}

	chain KUBEVIRT_POSTINBOUND {
		tcp dport { 15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090 } ip saddr 127.0.0.1 counter return
		ip saddr { 127.0.0.1, 127.0.0.6 } counter snat to 10.0.2.1
	}
}
table ip6 nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth0" counter jump KUBEVIRT_PREINBOUND
	}

	chain input {
		type nat hook input priority 100; policy accept;
	}

	chain output {
		type nat hook output priority -100; policy accept;
		tcp dport { 15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090 } ip6 saddr ::1 counter return
		ip6 daddr ::1 counter dnat to fd10:0:2::2
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip6 saddr fd10:0:2::2 counter masquerade
		oifname "k6t-eth0" counter jump KUBEVIRT_POSTINBOUND
	}

	chain KUBEVIRT_PREINBOUND {
		tcp dport 22 counter dnat to fd10:0:2::2
	}

	chain KUBEVIRT_POSTINBOUND {
		tcp dport { 15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090 } ip6 saddr ::1 counter return
		ip6 saddr ::1 counter snat to fd10:0:2::1
	}
}
"#;
const EXPECTED_ISTIO_PORTS: &str = r#"table ip nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth0" counter jump KUBEVIRT_PREINBOUND
	}

	chain input {
		type nat hook input priority 100; policy accept;
	}

	chain output {
		type nat hook output priority -100; policy accept;
		ip daddr { 10.244.0.5, 127.0.0.1 } tcp dport 22 counter dnat to 10.0.2.2
		ip daddr { 10.244.0.5, 127.0.0.1 } tcp dport 80 counter dnat to 10.0.2.2
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.0.2.2 counter masquerade
		oifname "k6t-eth0" counter jump KUBEVIRT_POSTINBOUND
	}

	chain KUBEVIRT_PREINBOUND {
		tcp dport 22 counter dnat to 10.0.2.2
	}

	chain KUBEVIRT_POSTINBOUND {
		tcp dport 22 ip saddr { 127.0.0.1, 127.0.0.6 } counter snat to 10.0.2.1
		tcp dport 80 ip saddr { 127.0.0.1, 127.0.0.6 } counter snat to 10.0.2.1
	}
}
table ip6 nat {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth0" counter jump KUBEVIRT_PREINBOUND
	}

	chain input {
		type nat hook input priority 100; policy accept;
	}

	chain output {
		type nat hook output priority -100; policy accept;
		ip6 daddr ::1 tcp dport 22 counter dnat to fd10:0:2::2
		ip6 daddr ::1 tcp dport 80 counter dnat to fd10:0:2::2
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip6 saddr fd10:0:2::2 counter masquerade
		oifname "k6t-eth0" counter jump KUBEVIRT_POSTINBOUND
	}

	chain KUBEVIRT_PREINBOUND {
		tcp dport 22 counter dnat to fd10:0:2::2
	}

	chain KUBEVIRT_POSTINBOUND {
		tcp dport 22 ip6 saddr ::1 counter snat to fd10:0:2::1
		tcp dport 80 ip6 saddr ::1 counter snat to fd10:0:2::1
	}
}
"#;

/// QEMU (7.2 here) attaches to the tap setup made, single- and multi-queue. Run as root: this
/// machine's /dev/net/tun is 0600, so the uid-107 case of a KubeVirt pod cannot be shown here;
/// the owner and group are asserted on the link instead.
#[test]
fn qemu_opens_the_tap() {
    for (queues, netdev) in [
        (1, "tap,id=n0,ifname=tap0,script=no,downscript=no"),
        (2, "tap,id=n0,ifname=tap0,script=no,downscript=no,queues=2"),
    ] {
        let net = PodNet::new(false);
        let resolv = resolv_conf();
        let cfg = NetConfig {
            queues,
            ..Default::default()
        };
        setup(&net.pod, &cfg, resolv.path()).unwrap();
        let mut qemu = net.pod.spawn(&[
            "qemu-system-x86_64",
            "-accel",
            "tcg",
            "-machine",
            "none",
            "-nodefaults",
            "-display",
            "none",
            "-S",
            "-netdev",
            netdev,
        ]);
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let child = qemu.0.as_mut().unwrap();
        let exited = child.try_wait().unwrap();
        if exited.is_some() {
            let out = qemu.wait();
            panic!(
                "queues={queues}: qemu exited: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn changed_ports_replace_the_tables_in_one_transaction() {
    let net = PodNet::new(true);
    let resolv = resolv_conf();
    setup(&net.pod, &NetConfig::default(), resolv.path()).unwrap();
    assert_eq!(net.pod.nft_ruleset(), EXPECTED_ALL_PORTS);
    let (_, variant, expected) = variants().into_iter().nth(1).unwrap();
    let (_, applied) = setup(&net.pod, &variant, resolv.path()).unwrap();
    assert_eq!(
        applied.changed,
        vec![
            "commit table ip nat".to_string(),
            "commit table ip6 nat".to_string()
        ]
    );
    assert_eq!(net.pod.nft_ruleset(), expected);
}

/// virt-handler's masquerade links as its `NetConf.Setup` makes them for `default` on `eth0`
/// (IPv4 only, tap owned by 107).
fn handler_masquerade_links(pod: &Netns) {
    for c in kubevirt_masquerade_links(107, false) {
        let args: Vec<&str> = c.iter().map(String::as_str).collect();
        pod.ip(&args);
    }
}

/// KubeVirt's `nft` commands for the `ip` family only (the pod has no IPv6).
fn handler_nat_v4(pod: &Netns, cfg: &NetConfig) {
    for c in kubevirt_nft(cfg, "10.244.0.5") {
        if c[2] != "ip" {
            continue;
        }
        let mut args = vec!["nft"];
        args.extend(c.iter().map(String::as_str));
        pod.sh(&args);
    }
}

/// A launcher that can read nftables compares virt-handler's nat table with KubeVirt v1.9's, rule
/// by rule: made by KubeVirt's own `nft` commands it is adopted unchanged; with one rule changed,
/// one rule more or a chain's priority changed, the setup is refused naming what differs, and left
/// as it was.
#[test]
fn virt_handler_nat_rules_are_compared_with_kubevirts() {
    let resolv = resolv_conf();
    for (name, cfg) in [
        ("all ports", NetConfig::default()),
        (
            "listed ports",
            NetConfig {
                ports: vec![
                    Port {
                        protocol: Protocol::Tcp,
                        port: 80,
                    },
                    Port {
                        protocol: Protocol::Udp,
                        port: 53,
                    },
                ],
                legacy_migration_ports: true,
                ..Default::default()
            },
        ),
    ] {
        let net = PodNet::new(false);
        handler_masquerade_links(&net.pod);
        handler_nat_v4(&net.pod, &cfg);
        let before = net.pod.nft_ruleset();
        let (plan, applied) =
            setup(&net.pod, &cfg, resolv.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(applied.adopted, "{name}");
        assert_eq!(applied.changed, Vec::<String>::new(), "{name}");
        assert_eq!(net.pod.nft_ruleset(), before, "{name}");
        assert_eq!(
            teardown(&net.pod, &plan, &applied).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(
            net.pod.nft_ruleset(),
            before,
            "{name}: teardown left it alone"
        );
    }

    let cases: [(&str, &[&[&str]], &str); 3] = [
        (
            "a changed rule",
            &[
                &["flush", "chain", "ip", "nat", "KUBEVIRT_PREINBOUND"],
                &[
                    "add",
                    "rule",
                    "ip",
                    "nat",
                    "KUBEVIRT_PREINBOUND",
                    "tcp",
                    "dport",
                    "22",
                    "counter",
                    "dnat",
                    "to",
                    "10.0.2.2",
                ],
            ],
            "chain ip nat KUBEVIRT_PREINBOUND rule 1 is not KubeVirt's `counter dnat to 10.0.2.2`",
        ),
        (
            "a rule more",
            &[&[
                "add",
                "rule",
                "ip",
                "nat",
                "postrouting",
                "counter",
                "accept",
            ]],
            "chain ip nat postrouting has 3 rules, KubeVirt's 2",
        ),
        (
            "another priority",
            &[
                &["delete", "chain", "ip", "nat", "input"],
                &[
                    "add",
                    "chain",
                    "ip",
                    "nat",
                    "input",
                    "{ type nat hook input priority 50; }",
                ],
            ],
            "chain ip nat input has hook and priority Some((1, 50)), KubeVirt's Some((1, 100))",
        ),
    ];
    for (name, change, expected) in cases {
        let net = PodNet::new(false);
        handler_masquerade_links(&net.pod);
        handler_nat_v4(&net.pod, &NetConfig::default());
        for c in change {
            let mut args = vec!["nft"];
            args.extend_from_slice(c);
            net.pod.sh(&args);
        }
        let before = net.pod.nft_ruleset();
        let err = setup(&net.pod, &NetConfig::default(), resolv.path()).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("the pod network set up in this namespace differs from the plan")
                && message.contains(expected),
            "{name}: {message}"
        );
        assert_eq!(net.pod.nft_ruleset(), before, "{name}: left alone");
    }
}
