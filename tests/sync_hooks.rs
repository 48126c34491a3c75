//! KubeVirt's hook sidecars through the launcher's define seam, with testkit's fake sidecar over
//! the real socket protocol and the test guest:
//! - an `OnDefineDomain` hook that edits the domain text as KubeVirt's e2e test does (`sed` of the
//!   empty `<baseBoard></baseBoard>`, a serial in `<system>`) changes the SMBIOS values the guest
//!   reads from `/sys/class/dmi/id`, and GetDomain shows the hooked `<sysinfo>`;
//! - a `PreCloudInitIso` hook (KubeVirt's `cloudinit` example answers this way) replaces the
//!   user data written into the NoCloud ISO QEMU is given;
//! - a disk-driver hook sets the root disk's cache mode, as QEMU then reports it (`query-block`)
//!   and GetDomain shows it, and its error policies (`werror`/`rerror`), queues and serial, as
//!   QEMU's virtio-blk device holds them (`qom-get`) and the guest reads the serial
//!   (`/sys/block/vda/serial`); its `<iotune>` limits (`query-block`) and a SCSI disk's `<wwn>`
//!   (`qom-get` of scsi-hd);
//! - a clock and Hyper-V hook: the RTC starts three days ahead (QEMU's `rtc-time`, the guest's
//!   `/sys/class/rtc/rtc0/since_epoch`), HPET is gone (QEMU's machine `hpet`, no `PNP0103` among
//!   the guest's ACPI devices), the vCPU holds the hooked spinlock retries and vendor id
//!   (`qom-get`), and GetDomain shows the clock's adjustment;
//! - a hook that changes what qlauncher cannot take (a disk's driver name) fails the sync with
//!   the sidecar's socket and the element path, and no QEMU starts.
//!
//! The launchers run in-process in a private network namespace of the test thread. Needs root
//! and the test guest (`scripts/build-guest`).

use std::time::Duration;

use std::sync::Arc;

use qlauncher::hooks::{self, ON_DEFINE_DOMAIN, PRE_CLOUD_INIT_ISO};
use serde_json::{json, Value};
use testkit::guest::{self, wait_log_marker, GuestImages};
use testkit::handler::{self, get_domain};
use testkit::hook_sidecar::{kubevirt_e2e_smbios, FakeSidecar, Script};
use testkit::in_process::{InProcess, LauncherRoot};
use testkit::migration::exec_in;

/// The RTC shift the hook sets (libvirt's `<clock offset="utc" adjustment>`): three days.
const RTC_SHIFT: i64 = 3 * 86400;

/// The hook's `<clock>` (the VMI has none): the RTC three days ahead, no HPET.
const CLOCK: &str = "<clock offset=\"utc\" adjustment=\"259200\">\
    <timer name=\"hpet\" present=\"no\"></timer></clock>";

/// The hook's Hyper-V enlightenments with values (the VMI has none). Under TCG QEMU takes no
/// `hv-vpindex` ("kernel doesn't allow setting HyperV VP_INDEX"), which `tlbflush`, `synic` and
/// `stimer` need: those are read back in `cmdline_qemu_acceptance`.
const HYPERV: &str = "<hyperv><spinlocks state=\"on\" retries=\"8191\"></spinlocks>\
    <vendor_id state=\"on\" value=\"QLauncherHv\"></vendor_id></hyperv>";

/// The root disk's serial the hook sets.
const DISK_SERIAL: &str = "hooked-disk-1";

/// The root disk's I/O limits the hook sets (libvirt's `<iotune>`).
const IOTUNE: &str = "<iotune><total_bytes_sec>50000000</total_bytes_sec>\
    <read_iops_sec>2000</read_iops_sec><write_iops_sec>1000</write_iops_sec>\
    <read_iops_sec_max>4000</read_iops_sec_max><read_iops_sec_max_length>2</read_iops_sec_max_length>\
    <group_name>hooked</group_name></iotune>";

fn vmi(uid: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "hooked", "namespace": "default", "uid": uid,
            "annotations": {"hooks.kubevirt.io/hookSidecars": "[{\"image\": \"smbios\"}]"}},
        "spec": {
            "domain": {
                "resources": {"requests": {"memory": "256Mi"}},
                "devices": {
                    "autoattachPodInterface": false,
                    "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}},
                        {"name": "cloudinitdisk", "disk": {"bus": "virtio"}},
                        {"name": "scratch", "disk": {"bus": "scsi"}}]
                }
            },
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}},
                {"name": "cloudinitdisk",
                    "cloudInitNoCloud": {"userData": "#cloud-config\n# as the VMI says\n"}},
                {"name": "scratch", "emptyDisk": {"capacity": "16Mi"}}
            ]
        }
    })
}

/// A launcher root whose configuration holds the one sidecar `script` serves under
/// `<root>/var/run/kubevirt-hooks/hook-sidecar-0/`, collected as the launcher does at start.
async fn root_with_sidecar(uid: &str, script: Script) -> (LauncherRoot, FakeSidecar) {
    let images = GuestImages::locate();
    let mut root = LauncherRoot::new(&images.disk_qcow2, uid);
    let hook_dir = root.path().join("var/run/kubevirt-hooks");
    let sidecar = FakeSidecar::start_in(&hook_dir, "hook-sidecar-0", "smbios.sock", script);
    root.config.hooks = hooks::collect(&hook_dir, 1, Duration::from_secs(20))
        .await
        .expect("collect the sidecar");
    (root, sidecar)
}

/// KubeVirt's e2e SMBIOS edit ([`kubevirt_e2e_smbios`]), plus a system serial, the first
/// disk's (the root disk's) driver and serial (cache mode, error policies, queues), a
/// `<clock>` ([`CLOCK`]) and Hyper-V values ([`HYPERV`]), all as text edits of the domain XML.
fn smbios_hook(xml: &str) -> String {
    let xml = match xml.split_once("<driver cache=\"") {
        Some((head, rest)) => {
            let (_, tail) = rest.split_once('"').unwrap_or(("", rest));
            let tail = tail.replacen(
                "error_policy=\"stop\"",
                "error_policy=\"report\" rerror_policy=\"ignore\" queues=\"2\"",
                1,
            );
            format!("{head}<serial>{DISK_SERIAL}</serial><driver cache=\"unsafe\"{tail}")
        }
        None => xml.to_owned(),
    };
    let xml = xml
        .replacen(
            "<alias name=\"ua-rootdisk\"></alias>",
            &format!("{IOTUNE}<alias name=\"ua-rootdisk\"></alias>"),
            1,
        )
        .replacen(
            "<alias name=\"ua-scratch\"></alias>",
            "<wwn>0x5000C50015EA71AC</wwn><alias name=\"ua-scratch\"></alias>",
            1,
        );
    let xml = xml.replacen(
        "\t<features>",
        &format!("\t{CLOCK}\n\t<features>{HYPERV}"),
        1,
    );
    kubevirt_e2e_smbios(&xml).replacen(
        "<system>",
        "<system>\n\t\t\t<entry name=\"serial\">hooked-serial-1</entry>",
        1,
    )
}

#[test]
fn hook_sidecars_edit_the_domain_the_guest_runs_or_refuse_it() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    testkit::in_process::runtime().block_on(async {
        refused().await;
        smbios().await;
    });
}

/// A disk-driver name edit is not a change qlauncher takes from a hook: the sync fails naming
/// the sidecar and the element, before any QEMU runs.
async fn refused() {
    let uid = format!("6a1c0b3e-0000-4000-8002-{:012}", std::process::id());
    let script = Script::new(&["v1alpha2"], &[ON_DEFINE_DOMAIN])
        .on_define(|xml| xml.replacen("name=\"qemu\"", "name=\"tap\"", 1));
    let (root, sidecar) = root_with_sidecar(&uid, script).await;
    let launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let mut client = launcher.client.clone();
    let (ok, message) = handler::sync(&mut client, &vmi(&uid)).await;
    assert!(!ok, "a driver name edit was taken");
    assert!(
        message.contains("smbios.sock") && message.contains("driver@name"),
        "{message}"
    );
    assert_eq!(sidecar.methods(), ["Info", "OnDefineDomain"]);
    assert!(launcher.manager.qemu_pid().is_none(), "QEMU started");
}

/// The SMBIOS hook: the guest reads the hooked values, GetDomain shows them.
async fn smbios() {
    let uid = format!("6a1c0b3e-0000-4000-8003-{:012}", std::process::id());
    let mut script = Script::new(
        &["v1alpha3", "v1alpha2"],
        &[ON_DEFINE_DOMAIN, PRE_CLOUD_INIT_ISO],
    )
    .on_define(smbios_hook);
    script.pre_cloud_init_iso = Arc::new(|legacy, data| {
        let mut data: Value = serde_json::from_slice(data).map_err(|e| e.to_string())?;
        data["UserData"] = json!("#cloud-config\n# from the hook\n");
        Ok((legacy.to_vec(), serde_json::to_vec(&data).unwrap()))
    });
    let (mut root, sidecar) = root_with_sidecar(&uid, script).await;
    let operator_qmp = root.path().join("operator-qmp.sock");
    root.config.operator_qmp_socket = Some(operator_qmp.clone());
    let private = root.private.clone();
    let launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let mut client = launcher.client.clone();
    assert_eq!(
        handler::sync(&mut client, &vmi(&uid)).await,
        (true, String::new())
    );
    let define_calls: Vec<_> = sidecar
        .calls()
        .into_iter()
        .filter(|c| c.method == "OnDefineDomain")
        .collect();
    assert_eq!(define_calls.len(), 1, "{define_calls:?}");
    assert_eq!(define_calls[0].version, "v1alpha3");

    let called: Vec<_> = sidecar.methods();
    assert!(called.contains(&"PreCloudInitIso"), "{called:?}");
    let iso = root
        .path()
        .join("var/run/kubevirt-ephemeral-disks/cloud-init-data/default/hooked/noCloud.iso");
    let out = std::process::Command::new("isoinfo")
        .args(["-R", "-i", iso.to_str().unwrap(), "-x", "/user-data"])
        .output()
        .unwrap();
    assert!(out.status.success(), "isoinfo {}", iso.display());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "#cloud-config\n# from the hook\n"
    );

    let domain = get_domain(&mut client).await.expect("a domain");
    let spec = serde_json::to_value(&domain.spec).unwrap();
    let sysinfo = spec["SysInfo"].to_string();
    assert!(
        sysinfo.contains("Radical Edward") && sysinfo.contains("hooked-serial-1"),
        "{sysinfo}"
    );

    // The disk-driver edit: the root disk runs with cache=unsafe (host cache, flushes ignored).
    let disks = spec["Devices"]["Disks"].as_array().unwrap();
    let rootdisk = disks
        .iter()
        .find(|d| d["Alias"]["Name"] == "rootdisk")
        .unwrap_or_else(|| panic!("no rootdisk in {disks:?}"));
    assert_eq!(rootdisk["Driver"]["Cache"], "unsafe", "{rootdisk}");
    let qmp_socket = operator_qmp.clone();
    let block = tokio::task::spawn_blocking(move || {
        let mut qmp = guest::Qmp::connect(&qmp_socket, Duration::from_secs(10)).unwrap();
        qmp.execute("query-block", json!({})).unwrap()
    })
    .await
    .unwrap();
    let root_block = block
        .as_array()
        .unwrap()
        .iter()
        .find(|b| {
            b["qdev"]
                .as_str()
                .is_some_and(|q| q.contains("ua-rootdisk"))
        })
        .unwrap_or_else(|| panic!("no ua-rootdisk in {block}"));
    assert_eq!(
        root_block["inserted"]["cache"],
        json!({"writeback": true, "direct": false, "no-flush": true}),
        "{root_block}"
    );

    // The root disk's frontend as QEMU holds it (the hook's error policies, queues and
    // serial), and the SCSI disk's WWN as scsi-hd holds it.
    let (qom, wwn) = tokio::task::spawn_blocking(move || {
        let mut qmp = guest::Qmp::connect(&operator_qmp, Duration::from_secs(10)).unwrap();
        let mut get = |id: &str, property: &str| {
            qmp.execute(
                "qom-get",
                json!({"path": format!("/machine/peripheral/{id}"), "property": property}),
            )
            .unwrap()
        };
        let root = ["werror", "rerror", "num-queues", "serial"].map(|p| get("ua-rootdisk", p));
        (root, get("ua-scratch", "wwn"))
    })
    .await
    .unwrap();
    assert_eq!(
        qom,
        [
            json!("report"),
            json!("ignore"),
            json!(2),
            json!(DISK_SERIAL)
        ]
    );
    assert_eq!(wwn, json!(0x5000_c500_15ea_71ac_u64));
    assert_eq!(rootdisk["Serial"], DISK_SERIAL, "{rootdisk}");
    assert_eq!(rootdisk["Driver"]["ErrorPolicy"], "report", "{rootdisk}");
    assert_eq!(rootdisk["Driver"]["Queues"], 2, "{rootdisk}");

    // The root disk's throttle limits, as QEMU reports them.
    let inserted = &root_block["inserted"];
    assert_eq!(
        [
            "bps",
            "bps_rd",
            "bps_wr",
            "iops",
            "iops_rd",
            "iops_wr",
            "iops_rd_max",
            "iops_rd_max_length",
            "group"
        ]
        .map(|k| inserted[k].clone()),
        [
            json!(50_000_000),
            json!(0),
            json!(0),
            json!(0),
            json!(2000),
            json!(1000),
            json!(4000),
            json!(2),
            json!("hooked")
        ],
        "{inserted}"
    );
    // The hooked clock and Hyper-V values as QEMU holds them: the RTC's start (`rtc-time` of
    // the machine, from `-rtc base=<now + 3 days>`), HPET off, the vCPU's `hv-*` properties.
    let qmp_socket = root.path().join("operator-qmp.sock");
    let (rtc, hpet, hv) = tokio::task::spawn_blocking(move || {
        let mut qmp = guest::Qmp::connect(&qmp_socket, Duration::from_secs(10)).unwrap();
        let rtc = qmp
            .execute(
                "qom-get",
                json!({"path": "/machine", "property": "rtc-time"}),
            )
            .unwrap();
        let hpet = qmp
            .execute("qom-get", json!({"path": "/machine", "property": "hpet"}))
            .unwrap();
        let cpus = qmp.execute("query-cpus-fast", json!({})).unwrap();
        let vcpu = cpus[0]["qom-path"].as_str().expect("a vCPU").to_string();
        let hv = ["hv-spinlocks", "hv-vendor-id"].map(|p| {
            qmp.execute("qom-get", json!({"path": vcpu.clone(), "property": p}))
                .unwrap()
        });
        (rtc, hpet, hv)
    })
    .await
    .unwrap();
    assert_eq!(hpet, json!(false));
    assert_eq!(hv, [json!(8191), json!("QLauncherHv")]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let rtc_year = rtc["tm_year"].as_i64().unwrap() + 1900;
    let shifted = qlauncher::cmdline::devices::clock::format_utc(now + RTC_SHIFT);
    assert!(
        shifted.starts_with(&rtc_year.to_string()),
        "rtc-time {rtc}, expected about {shifted}"
    );
    assert!(
        spec["Clock"].to_string().contains("259200"),
        "{}",
        spec["Clock"]
    );

    let serial = private.join(&uid).join("virt-serial0-log");
    wait_log_marker(&serial, "QLG: agent ready", guest::BOOT_TIMEOUT).await;
    let read = "cat /sys/class/dmi/id/board_vendor /sys/class/dmi/id/product_serial; \
                echo \"vda=$(cat /sys/block/vda/serial)\"; cat /sys/class/rtc/rtc0/since_epoch; \
                echo $(ls /sys/bus/acpi/devices)";
    let mut out = None;
    for _ in 0..100 {
        if let Some((0, text)) = exec_in(&mut client, "default_hooked", read).await {
            out = Some(text);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = out.expect("the guest agent answers");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..3],
        [
            "Radical Edward",
            "hooked-serial-1",
            &format!("vda={DISK_SERIAL}")
        ]
    );
    // The guest's RTC runs three days ahead of the host (within the boot's hour); its ACPI
    // tables have the CMOS RTC (PNP0B00) and no HPET (PNP0103).
    let since_epoch: i64 = lines[3].trim().parse().expect("rtc0 since_epoch");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert!(
        (since_epoch - (now + RTC_SHIFT)).abs() < 3600,
        "guest RTC {since_epoch}, host {now}"
    );
    let acpi = lines[4];
    assert!(
        acpi.contains("PNP0B00") && !acpi.contains("PNP0103"),
        "{acpi}"
    );
}
