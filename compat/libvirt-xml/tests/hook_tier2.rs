//! Tier-2 hook rows end to end on converted fixtures: a hook's text edit of our input
//! ([`hooks::kubevirt_input`]) becomes typed edits ([`hooks::diff_answer`]); applied to the plan
//! ([`hooks::apply`]) they give the QEMU argv or QMP start-up fragment libvirt would; and the
//! export of the hooked plan shows the change, so a hook answering the same again asks for
//! nothing.
//!
//! Rows: a disk's `driver@error_policy`/`@rerror_policy`, `@queues`, `<serial>` (virtio-blk),
//! `<iotune>` (`block_set_io_throttle` before the guest runs), `<wwn>` (scsi-hd); an interface's
//! MTU, queue sizes, ROM and model; `<features>` as `-cpu` flags (KVM hidden, Hyper-V on/off
//! states, spinlocks, stimer, vendor id, TLB flush); `<clock>` offset and timers (`-rtc`, the
//! `kvm-pit` global, HPET on QEMU 7.2 and 10, `kvmclock`/`hv-time`, `TZ`).

mod support;

use qlauncher_core::cmdline::render;
use qlauncher_core::cmdline::DomainPlan;
use qlauncher_libvirt_xml::{export, hooks};
use serde_json::{json, Value};

/// The fixture `cmdline/<name>.yaml`, converted.
fn load(name: &str) -> support::Converted {
    let path = support::repo_root()
        .join("tests/fixtures/cmdline")
        .join(format!("{name}.yaml"));
    support::load(&path, None).expect("fixture converts")
}

/// Our hook input of `plan` for the fixture `f`.
fn input(f: &support::Converted, plan: &DomainPlan) -> String {
    hooks::kubevirt_input(&export(&f.vmi, &f.ctx, plan).unwrap()).unwrap()
}

/// `answer` as a hook's answer to our input of fixture `name`: the edits, the hooked plan; and
/// the hooked plan's input answered the same again is no edit.
fn hooked(name: &str, answer: impl Fn(&str) -> String) -> (Vec<hooks::HookEdit>, DomainPlan) {
    let f = load(name);
    let sent = input(&f, &f.plan);
    let answered = answer(&sent);
    assert_ne!(sent, answered, "the edit did not apply to {sent}");
    let edits = hooks::diff_answer(&sent, &answered).unwrap_or_else(|r| panic!("{r}"));
    let mut plan = f.plan.clone();
    hooks::apply(&edits, &mut plan);
    let again = input(&f, &plan);
    assert_eq!(
        hooks::diff_answer(&again, &answered).unwrap(),
        vec![],
        "the export of the hooked plan lacks the edit: {again}"
    );
    (edits, plan)
}

/// The `-device` JSON of device `id` in the plan's argv.
fn device(plan: &DomainPlan, id: &str) -> Value {
    render::argv(plan)
        .iter()
        .filter_map(|a| serde_json::from_str::<Value>(a).ok())
        .find(|v| v["id"] == id && v.get("driver").is_some())
        .unwrap_or_else(|| panic!("no -device {id}"))
}

/// Inserts `xml` before the `<alias>` of the disk `alias` in our (tab-indented) input.
fn before_alias(sent: &str, alias: &str, xml: &str) -> String {
    sent.replacen(
        &format!("<alias name=\"{alias}\"></alias>"),
        &format!("{xml}<alias name=\"{alias}\"></alias>"),
        1,
    )
}

#[test]
fn virtio_blk_error_policy_queues_and_serial() {
    let (edits, plan) = hooked("cache-io", |sent| {
        let (head, tail) = sent.split_once("<alias name=\"ua-direct\">").unwrap();
        let head = head
            .rsplit_once("error_policy=\"stop\"")
            .map_or(head.into(), |(a, b)| {
                format!("{a}error_policy=\"report\" rerror_policy=\"ignore\" queues=\"4\"{b}")
            });
        let head = head.rsplit_once("<driver").map_or(head.clone(), |(a, b)| {
            format!("{a}<serial>hook-1</serial><driver{b}")
        });
        format!("{head}<alias name=\"ua-direct\">{tail}")
    });
    assert_eq!(edits.len(), 3, "{edits:?}");
    let dev = device(&plan, "ua-direct");
    assert_eq!(
        (
            &dev["werror"],
            &dev["rerror"],
            &dev["num-queues"],
            &dev["serial"]
        ),
        (
            &json!("report"),
            &json!("ignore"),
            &json!(4),
            &json!("hook-1")
        ),
        "{dev}"
    );
}

#[test]
fn iotune_is_a_block_set_io_throttle_before_the_guest_runs() {
    let (edits, plan) = hooked("cache-io", |sent| {
        before_alias(
            sent,
            "ua-wt",
            "<iotune><total_bytes_sec>2000000</total_bytes_sec>\
             <read_iops_sec>100</read_iops_sec><write_iops_sec>50</write_iops_sec>\
             <read_iops_sec_max>400</read_iops_sec_max>\
             <read_iops_sec_max_length>3</read_iops_sec_max_length>\
             <group_name>tier2</group_name></iotune>",
        )
    });
    assert_eq!(edits.len(), 1, "{edits:?}");
    let startup = serde_json::to_value(&render::qmp_plan(&plan).startup).unwrap();
    let throttles: Vec<&Value> = startup
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["execute"] == "block_set_io_throttle")
        .collect();
    assert_eq!(
        json!(throttles),
        json!([{"execute": "block_set_io_throttle", "arguments": {
            "id": "/machine/peripheral/ua-wt/virtio-backend", "bps": 2000000, "bps_rd": 0, "bps_wr": 0,
            "iops": 0, "iops_rd": 100, "iops_wr": 50,
            "iops_rd_max": 400, "iops_rd_max_length": 3, "group": "tier2"}}])
    );
    // The libvirt XML shows it in libvirt's names.
    let f = load("cache-io");
    let xml = qlauncher_libvirt_xml::to_xml(&export(&f.vmi, &f.ctx, &plan).unwrap()).unwrap();
    assert!(
        xml.contains("<total_bytes_sec>2000000</total_bytes_sec>")
            && xml.contains("<group_name>tier2</group_name>"),
        "{xml}"
    );
}

#[test]
fn wwn_on_a_scsi_disk() {
    let (edits, plan) = hooked("mixed-buses", |sent| {
        before_alias(sent, "ua-data", "<wwn>0x5000C50015EA71AC</wwn>")
    });
    assert_eq!(edits.len(), 1, "{edits:?}");
    let dev = device(&plan, "ua-data");
    assert_eq!(dev["driver"], "scsi-hd", "{dev}");
    assert_eq!(dev["wwn"], json!(0x5000_c500_15ea_71ac_u64), "{dev}");
    // libvirt refuses a wwn on a SATA disk; so does qlauncher.
    let f = load("mixed-buses");
    let sent = input(&f, &f.plan);
    let sata = before_alias(&sent, "ua-root", "<wwn>5000c50015ea71ac</wwn>");
    assert_eq!(
        hooks::diff_answer(&sent, &sata).unwrap_err().path,
        "domain/devices/disk[ua-root]/wwn#text"
    );
}

#[test]
fn interface_mtu_queue_sizes_and_rom() {
    let (edits, plan) = hooked("nic-multiqueue", |sent| {
        sent.replacen("<mtu size=\"1450\">", "<mtu size=\"9000\">", 1)
            .replacen(
                "<driver name=\"vhost\" queues=\"4\">",
                "<driver name=\"vhost\" queues=\"4\" rx_queue_size=\"1024\" tx_queue_size=\"256\">",
                1,
            )
            .replacen(
                "<rom enabled=\"no\"></rom>",
                "<rom bar=\"off\" file=\"/usr/share/qemu/efi-virtio.rom\"></rom>",
                1,
            )
    });
    assert_eq!(edits.len(), 3, "{edits:?}");
    let dev = device(&plan, "ua-default");
    assert_eq!(
        [
            &dev["host_mtu"],
            &dev["rx_queue_size"],
            &dev["tx_queue_size"],
            &dev["romfile"],
            &dev["rombar"],
            &dev["mq"]
        ],
        [
            &json!(9000),
            &json!(1024),
            &json!(256),
            &json!("/usr/share/qemu/efi-virtio.rom"),
            &json!(0),
            &json!(true)
        ],
        "{dev}"
    );
}

#[test]
fn a_virtio_nic_becomes_an_e1000() {
    let (edits, plan) = hooked("basic", |sent| {
        let sent = sent.replacen(
            "<model type=\"virtio-non-transitional\"></model>",
            "<model type=\"e1000e\"></model>",
            1,
        );
        let (head, tail) = sent.split_once("<mtu size=\"").unwrap();
        let (_, tail) = tail.split_once("</mtu>").unwrap();
        format!("{head}{tail}")
    });
    assert_eq!(edits.len(), 2, "{edits:?}");
    let dev = device(&plan, "ua-default");
    assert_eq!(dev["driver"], "e1000e", "{dev}");
    assert!(dev.get("host_mtu").is_none(), "{dev}");
    // KubeVirt hot-plugs virtio NICs only.
    assert!(render::qmp_plan(&plan).nics.is_empty());
}

#[test]
fn kvm_hidden_and_hyperv_enlightenments_are_cpu_flags() {
    let (edits, plan) = hooked("basic", |sent| {
        sent.replacen(
            "<features>",
            "<features><hyperv><relaxed state=\"on\"></relaxed><vapic state=\"on\"></vapic>\
             </hyperv><kvm><hidden state=\"on\"></hidden></kvm>",
            1,
        )
    });
    assert_eq!(edits.len(), 3, "{edits:?}");
    let cpu = render::argv(&plan)
        .windows(2)
        .find(|w| w[0] == "-cpu")
        .map(|w| w[1].clone())
        .unwrap();
    for prop in ["hv-relaxed=on", "hv-vapic=on", "kvm=off"] {
        assert!(
            cpu.split(',').any(|p| p == prop),
            "{prop} not in -cpu {cpu}"
        );
    }
}

/// The libvirt XML of a plan with every tier-2 row applied passes libvirt's schema
/// (`virt-xml-validate`): `<iotune>`, `<wwn>`, `rerror_policy`, a NIC's queue sizes and ROM,
/// Hyper-V and KVM features.
#[test]
fn hooked_exports_pass_libvirts_schema() {
    use qlauncher_libvirt_xml::libvirt;
    support::ensure_libvirt_tools();
    for (name, answer) in [
        (
            "mixed-buses",
            Box::new(|sent: &str| {
                let s = before_alias(sent, "ua-data", "<wwn>5000c50015ea71ac</wwn>");
                let s = before_alias(
                    &s,
                    "ua-root",
                    "<iotune><read_bytes_sec>100000</read_bytes_sec>\
                     <group_name>g</group_name></iotune>",
                );
                s.replacen(
                    "error_policy=\"stop\"",
                    "error_policy=\"stop\" rerror_policy=\"report\"",
                    1,
                )
            }) as Box<dyn Fn(&str) -> String>,
        ),
        (
            "nic-multiqueue",
            Box::new(|sent: &str| {
                sent.replacen(
                    "<driver name=\"vhost\" queues=\"4\">",
                    "<driver name=\"vhost\" queues=\"4\" rx_queue_size=\"512\">",
                    1,
                )
                .replacen(
                    "<rom enabled=\"no\"></rom>",
                    "<rom bar=\"on\" file=\"/usr/lib/ipxe/qemu/efi-virtio.rom\"></rom>",
                    1,
                )
                .replacen(
                    "<features>",
                    "<features><hyperv><relaxed state=\"on\"></relaxed></hyperv>\
                     <kvm><hidden state=\"on\"></hidden></kvm>",
                    1,
                )
            }),
        ),
    ] {
        let (_, plan) = hooked(name, answer);
        let f = load(name);
        let xml = qlauncher_libvirt_xml::to_xml(&export(&f.vmi, &f.ctx, &plan).unwrap()).unwrap();
        if let Err(e) = libvirt::validate(&libvirt::for_libvirt9(&xml)) {
            panic!("{name}: {e}\n{xml}");
        }
    }
}

/// The `-cpu` value of the plan's argv.
fn cpu(plan: &DomainPlan) -> Vec<String> {
    render::argv(plan)
        .windows(2)
        .find(|w| w[0] == "-cpu")
        .map(|w| w[1].split(',').map(str::to_string).collect())
        .unwrap()
}

/// The value after each `switch` in the plan's argv.
fn switches(plan: &DomainPlan, switch: &str) -> Vec<String> {
    render::argv(plan)
        .windows(2)
        .filter(|w| w[0] == switch)
        .map(|w| w[1].clone())
        .collect()
}

/// Whether the plan's argv turns HPET off (`-no-hpet` on QEMU 7.2, `hpet=off` on 8 and later).
fn hpet_off(plan: &DomainPlan) -> bool {
    render::argv(plan)
        .iter()
        .any(|a| a == "-no-hpet" || a.split(',').any(|p| p == "hpet=off"))
}

/// The clock-offset-timers fixture's clock as a hook changes it: the shift, the RTC's tick
/// policy and track, the PIT's tick policy, HPET back on, kvmclock off.
fn clock_hook(sent: &str) -> String {
    sent.replacen("adjustment=\"3600\"", "adjustment=\"7200\"", 1)
        .replacen(
            "<timer name=\"pit\" tickpolicy=\"delay\"",
            "<timer name=\"pit\" tickpolicy=\"discard\"",
            1,
        )
        .replacen("tickpolicy=\"catchup\"", "tickpolicy=\"delay\"", 1)
        .replacen("track=\"guest\"", "track=\"wall\"", 1)
        .replacen(
            "<timer name=\"hpet\" present=\"no\">",
            "<timer name=\"hpet\" present=\"yes\">",
            1,
        )
        .replacen(
            "<timer name=\"kvmclock\" present=\"yes\">",
            "<timer name=\"kvmclock\" present=\"no\">",
            1,
        )
}

#[test]
fn clock_offset_and_timers_are_rtc_pit_hpet_and_cpu_flags() {
    let f = load("clock-offset-timers");
    assert!(hpet_off(&f.plan));
    let (edits, plan) = hooked("clock-offset-timers", clock_hook);
    assert_eq!(edits.len(), 5, "{edits:?}");
    let base = qlauncher_core::cmdline::devices::clock::format_utc(f.ctx.now_unix + 7200);
    assert_eq!(switches(&plan, "-rtc"), [format!("base={base},clock=host")]);
    assert_eq!(
        switches(&plan, "-global")
            .into_iter()
            .filter(|g| g.contains("kvm-pit"))
            .collect::<Vec<_>>(),
        ["driver=kvm-pit,property=lost_tick_policy,value=discard"]
    );
    assert!(!hpet_off(&plan));
    let cpu = cpu(&plan);
    for prop in ["kvmclock=off", "hv-time=on"] {
        assert!(cpu.iter().any(|p| p == prop), "{prop} not in -cpu {cpu:?}");
    }
}

#[test]
fn a_hooked_hpet_is_no_hpet_on_qemu_7_2_and_a_machine_option_on_10() {
    // The VMI turns HPET off; the hook turns it on again, on either QEMU.
    for (name, off) in [("acpi-off", "-no-hpet"), ("acpi-off-qemu10", "hpet=off")] {
        let f = load(name);
        let has = |plan: &DomainPlan| {
            render::argv(plan)
                .iter()
                .any(|a| a == off || a.split(',').any(|p| p == off))
        };
        assert!(has(&f.plan), "{name}: no {off}");
        let (edits, plan) = hooked(name, |sent| {
            sent.replacen(
                "<timer name=\"hpet\" present=\"no\">",
                "<timer name=\"hpet\" present=\"yes\">",
                1,
            )
        });
        assert_eq!(edits.len(), 1, "{edits:?}");
        assert!(!has(&plan), "{name}: {off} left");
    }
    // A domain without a <clock> gets one from the hook.
    let (edits, plan) = hooked("basic", |sent| {
        sent.replacen(
            "\t<features>",
            "\t<clock offset=\"utc\"><timer name=\"hpet\" present=\"no\"></timer></clock>\n\t<features>",
            1,
        )
    });
    assert_eq!(edits.len(), 1, "{edits:?}");
    assert!(hpet_off(&plan));
}

#[test]
fn a_hooked_time_zone_is_qemus_tz() {
    let (edits, plan) = hooked("clock-timezone", |sent| {
        let (head, tail) = sent.split_once("timezone=\"").unwrap();
        let (_, tail) = tail.split_once('"').unwrap();
        format!("{head}timezone=\"America/New_York\"{tail}")
    });
    assert_eq!(edits.len(), 1, "{edits:?}");
    assert_eq!(
        plan.env,
        vec![("TZ".to_string(), "America/New_York".to_string())]
    );
    assert_eq!(switches(&plan, "-rtc"), ["base=localtime"]);
}

/// The hyperv fixture's enlightenments with values as a hook changes them (with the
/// hypervclock timer libvirt wants beside `stimer`).
fn hyperv_hook(sent: &str) -> String {
    sent.replacen("retries=\"8191\"", "retries=\"4096\"", 1)
        .replacen("value=\"KubeVirt\"", "value=\"MyVendor\"", 1)
        .replacen(
            "<tlbflush state=\"on\"></tlbflush>",
            "<tlbflush state=\"on\"><direct state=\"on\"></direct><extended state=\"on\"></extended></tlbflush>",
            1,
        )
        .replacen(
            "<stimer state=\"on\">\n\t\t\t\t<direct state=\"on\">",
            "<stimer state=\"on\">\n\t\t\t\t<direct state=\"off\">",
            1,
        )
        .replacen(
            "\t<features>",
            "\t<clock offset=\"utc\"><timer name=\"hypervclock\" present=\"yes\"></timer></clock>\n\t<features>",
            1,
        )
}

#[test]
fn hyperv_spinlocks_stimer_vendor_id_and_tlbflush_are_cpu_flags() {
    let f = load("hyperv");
    let before = cpu(&f.plan);
    for prop in [
        "hv-spinlocks=0x1fff",
        "hv-vendor-id=KubeVirt",
        "hv-stimer-direct=on",
    ] {
        assert!(before.iter().any(|p| p == prop), "{prop} not in {before:?}");
    }
    let (edits, plan) = hooked("hyperv", hyperv_hook);
    assert_eq!(edits.len(), 5, "{edits:?}");
    let cpu = cpu(&plan);
    for prop in [
        "hv-spinlocks=0x1000",
        "hv-vendor-id=MyVendor",
        "hv-stimer=on",
        "hv-tlbflush=on",
        "hv-tlbflush-direct=on",
        "hv-tlbflush-ext=on",
        "hv-time=on",
    ] {
        assert!(cpu.iter().any(|p| p == prop), "{prop} not in -cpu {cpu:?}");
    }
    assert!(
        !cpu.iter().any(|p| p.starts_with("hv-stimer-direct")),
        "{cpu:?}"
    );
    // A vendor id is one -cpu property value: no comma, at most 12 bytes.
    let sent = input(&f, &f.plan);
    for bad in ["My,Vendor", "ThirteenChars"] {
        let answer = sent.replacen("value=\"KubeVirt\"", &format!("value=\"{bad}\""), 1);
        assert_eq!(
            hooks::diff_answer(&sent, &answer).unwrap_err().path,
            "domain/features/hyperv/vendor_id@value",
            "{bad}"
        );
    }
}

/// The libvirt XML of the hooked clock and Hyper-V rows passes libvirt's schema.
#[test]
fn hooked_clock_and_hyperv_exports_pass_libvirts_schema() {
    use qlauncher_libvirt_xml::libvirt;
    support::ensure_libvirt_tools();
    for (name, answer) in [
        ("clock-offset-timers", clock_hook as fn(&str) -> String),
        ("hyperv", hyperv_hook),
    ] {
        let (_, plan) = hooked(name, answer);
        let f = load(name);
        let xml = qlauncher_libvirt_xml::to_xml(&export(&f.vmi, &f.ctx, &plan).unwrap()).unwrap();
        if let Err(e) = libvirt::validate(&libvirt::for_libvirt9(&xml)) {
            panic!("{name}: {e}\n{xml}");
        }
    }
}
