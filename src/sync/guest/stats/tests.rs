//! Table tests of the stats collection: JSON names, /proc parsing, QMP replies.

use super::*;
use serde_json::json;

#[test]
fn json_keys_are_kubevirts_go_field_names() {
    let v = serde_json::to_value(DomainStats {
        cpu: Some(CpuStats::default()),
        memory: Some(MemoryStats::default()),
        dirty_rate: Some(DirtyRateStats::default()),
        ..DomainStats::default()
    })
    .unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let mut expected = vec![
        "Name",
        "UUID",
        "Cpu",
        "Memory",
        "MigrateDomainJobInfo",
        "Vcpu",
        "Net",
        "Block",
        "CPUMapSet",
        "CPUMap",
        "DirtyRate",
        "Load",
    ];
    let mut keys = keys;
    keys.sort_unstable();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(v["Memory"]["RSSSet"], false);
    assert_eq!(v["Memory"]["ActualBalloonSet"], false);
    assert_eq!(
        v["Cpu"],
        json!({"TimeSet": false, "Time": 0, "UserSet": false, "User": 0, "SystemSet": false, "System": 0})
    );
    assert_eq!(v["DirtyRate"]["MegabytesPerSecondSet"], false);
}

#[test]
fn proc_stat_times_survive_odd_command_names() {
    let line = "4242 (qemu (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0";
    assert_eq!(stat_times(line), Some((250, 75)));
    let cpu = cpu_stats(Some(line), 10_000_000);
    assert_eq!(
        cpu,
        CpuStats {
            time_set: true,
            time: 3_250_000_000,
            user_set: true,
            user: 2_500_000_000,
            system_set: true,
            system: 750_000_000,
        }
    );
    assert_eq!(cpu_stats(Some("garbage"), 1), CpuStats::default());
}

#[test]
fn vcpu_times_delay_and_wait() {
    let stat = "77 (CPU 0/TCG) R 1 1 1 0 -1 0 0 0 0 0 40 10 0 0 20 0 1 0";
    let sched =
        "CPU 0/TCG (77, #threads: 3)\n---\nse.exec_start : 1.0\nse.statistics.wait_sum : 2.5\n";
    let v = vcpu_stats(Some(stat), Some("123 456 7\n"), Some(sched), 10_000_000);
    assert_eq!(
        v,
        VcpuStats {
            state_set: true,
            state: 1,
            time_set: true,
            time: 500_000_000,
            wait_set: true,
            wait: 2_500_000,
            delay_set: true,
            delay: 456,
        }
    );
}

#[test]
fn vcpu_threads_follow_cpu_index() {
    let cpus: Vec<crate::qmp::commands::CpuInfoFast> = serde_json::from_value(json!([
        {"cpu-index": 1, "thread-id": 20, "qom-path": "/machine/unattached/device[1]"},
        {"cpu-index": 0, "thread-id": 10, "qom-path": "/machine/unattached/device[0]"}
    ]))
    .unwrap();
    assert_eq!(vcpu_threads(&cpus), vec![10, 20]);
}

#[test]
fn memory_from_balloon_guest_stats_and_statm() {
    let balloon: crate::qmp::commands::BalloonInfo =
        serde_json::from_value(json!({"actual": 268435456u64})).unwrap();
    let guest: crate::qmp::commands::GuestStats = serde_json::from_value(json!({"stats": {
        "stat-swap-in": 0, "stat-swap-out": 0, "stat-major-faults": 12,
        "stat-minor-faults": 3400, "stat-free-memory": 104857600u64,
        "stat-total-memory": 209715200u64, "stat-available-memory": 157286400u64,
        "stat-disk-caches": 1048576, "stat-htlb-pgalloc": 0,
        "stat-htlb-pgfail": 0
    }, "last-update": 1700000000}))
    .unwrap();
    let m = memory_stats(
        Some(&balloon),
        Some(&guest),
        Some("50000 2560 300 1 0 900 0"),
        4096,
    );
    assert_eq!(
        m,
        MemoryStats {
            unused_set: true,
            unused: 102400,
            cached_set: true,
            cached: 1024,
            available_set: true,
            available: 204800,
            actual_balloon_set: true,
            actual_balloon: 262144,
            rss_set: true,
            rss: 10240,
            swap_in_set: true,
            swap_in: 0,
            swap_out_set: true,
            swap_out: 0,
            major_fault_set: true,
            major_fault: 12,
            minor_fault_set: true,
            minor_fault: 3400,
            usable_set: true,
            usable: 153600,
            total_set: true,
            total: 262144,
        }
    );
    // Before the guest driver reports, QEMU answers -1 for every statistic.
    let unset: crate::qmp::commands::GuestStats = serde_json::from_value(
        json!({"stats": {"stat-free-memory": -1, "stat-total-memory": u64::MAX}}),
    )
    .unwrap();
    let m = memory_stats(None, Some(&unset), None, 4096);
    assert_eq!(m, MemoryStats::default());
}

#[test]
fn block_entries_carry_target_alias_and_image_facts() {
    let blockstats: Vec<crate::qmp::commands::BlockStatsInfo> = serde_json::from_value(json!([
        {"device": "", "node-name": "libvirt-2-format",
         "qdev": "/machine/peripheral/ua-rootdisk/virtio-backend",
         "stats": {"rd_bytes": 5242880, "wr_bytes": 4096, "rd_operations": 300,
                   "wr_operations": 1, "flush_operations": 2, "rd_total_time_ns": 9000,
                   "wr_total_time_ns": 800, "flush_total_time_ns": 70,
                   "wr_highest_offset": 65536}},
        {"device": "", "qdev": "ua-cd", "stats": {"rd_bytes": 0}}
    ]))
    .unwrap();
    let block: Vec<crate::qmp::commands::BlockInfo> = serde_json::from_value(json!([
        {"device": "", "qdev": "/machine/peripheral/ua-rootdisk/virtio-backend",
         "inserted": {"file": "json:{}", "image": {"filename": "/e/rootdisk/disk.qcow2",
                      "virtual-size": 52428800, "actual-size": 200704}}},
        {"device": "", "qdev": "ua-cd", "tray_open": false}
    ]))
    .unwrap();
    let mut names = DeviceNames::default();
    names
        .disks
        .insert("ua-rootdisk".into(), ("vda".into(), "rootdisk".into()));
    let b = block_stats(&blockstats, &block, &names);
    assert_eq!(
        b,
        vec![BlockStats {
            name_set: true,
            name: "vda".into(),
            alias: "rootdisk".into(),
            path_set: true,
            path: "/e/rootdisk/disk.qcow2".into(),
            rd_reqs_set: true,
            rd_reqs: 300,
            rd_bytes_set: true,
            rd_bytes: 5242880,
            rd_times_set: true,
            rd_times: 9000,
            wr_reqs_set: true,
            wr_reqs: 1,
            wr_bytes_set: true,
            wr_bytes: 4096,
            wr_times_set: true,
            wr_times: 800,
            fl_reqs_set: true,
            fl_reqs: 2,
            fl_times_set: true,
            fl_times: 70,
            allocation_set: true,
            allocation: 65536,
            capacity_set: true,
            capacity: 52428800,
            physical_set: true,
            physical: 200704,
            ..BlockStats::default()
        }]
    );
}

#[test]
fn tap_counters_are_swapped_to_the_guest_view() {
    let net_dev = "Inter-|   Receive                            |  Transmit\n \
         face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
         lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n  \
         tap0:     100       2    0    1    0     0          0         0      900       9    0    0    0     0       0          0\n";
    assert!(!net_stats(net_dev, "tap9", "x").rx_bytes_set);
    let n = net_stats(net_dev, "tap0", "default");
    assert_eq!(
        n,
        NetStats {
            name_set: true,
            name: "tap0".into(),
            alias_set: true,
            alias: "default".into(),
            rx_bytes_set: true,
            rx_bytes: 900,
            rx_pkts_set: true,
            rx_pkts: 9,
            rx_errs_set: true,
            rx_errs: 0,
            rx_drop_set: true,
            rx_drop: 0,
            tx_bytes_set: true,
            tx_bytes: 100,
            tx_pkts_set: true,
            tx_pkts: 2,
            tx_errs_set: true,
            tx_errs: 0,
            tx_drop_set: true,
            tx_drop: 1,
        }
    );
}
