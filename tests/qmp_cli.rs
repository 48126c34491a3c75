//! `qlauncher qmp` and `qlauncher hotplug` against a real QEMU with a second QMP monitor (QEMU
//! serves one client per monitor; the first is the launcher's own).

use std::process::Command;

use serde_json::{json, Value};
use testkit::qmp::{block_of, q35_args, raw_image, TestVm};

fn qlauncher(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_qlauncher"))
        .args(args)
        .output()
        .expect("run qlauncher");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn qmp_and_hotplug_subcommands_print_qemus_reply() {
    let dir = tempfile::Builder::new()
        .prefix(&format!("qmp-cli-{}-", std::process::id()))
        .tempdir()
        .unwrap();
    let cli_sock = dir.path().join("cli.sock");
    let mut args = q35_args();
    args.extend([
        "-chardev".into(),
        format!(
            "socket,id=mon2,path={},server=on,wait=off",
            cli_sock.display()
        ),
        "-mon".into(),
        "chardev=mon2,mode=control".into(),
    ]);
    let vm = TestVm::launch(args).await.map_err(|(e, _)| e).unwrap();
    let sock = cli_sock.to_str().unwrap().to_string();

    let (code, out, err) = tokio::task::spawn_blocking({
        let sock = sock.clone();
        move || qlauncher(&["qmp", &sock, "query-status"])
    })
    .await
    .unwrap();
    assert_eq!((code, err.as_str()), (0, ""));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        json!({"running": true, "singlestep": false, "status": "running"})
    );

    let (code, out, err) = tokio::task::spawn_blocking({
        let sock = sock.clone();
        move || qlauncher(&["qmp", &sock, "device_del", r#"{"id": "ua-none"}"#])
    })
    .await
    .unwrap();
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (
            1,
            "",
            "error: QMP command device_del failed: DeviceNotFound: Device 'ua-none' not found\n"
        )
    );

    let image = vm.path("cli.raw");
    raw_image(&image, 1 << 20);
    let storage =
        json!({"driver": "file", "filename": image, "node-name": "cli-storage"}).to_string();
    let format =
        json!({"driver": "raw", "file": "cli-storage", "node-name": "cli-format"}).to_string();
    let device = json!({"driver": "scsi-hd", "bus": "scsi0.0", "scsi-id": 0, "lun": 3,
                        "drive": "cli-format", "id": "ua-cli"})
    .to_string();
    let (code, out, err) = tokio::task::spawn_blocking({
        let sock = sock.clone();
        move || {
            qlauncher(&[
                "hotplug",
                &sock,
                "disk",
                "attach",
                "--blockdev",
                &storage,
                "--blockdev",
                &format,
                "--device",
                &device,
            ])
        }
    })
    .await
    .unwrap();
    assert_eq!((code, out.as_str(), err.as_str()), (0, "{}\n", ""));
    assert_eq!(
        block_of(vm.client(), "ua-cli").await["inserted"]["node-name"],
        json!("cli-format")
    );

    let (code, out, err) = tokio::task::spawn_blocking({
        let sock = sock.clone();
        move || {
            qlauncher(&[
                "hotplug",
                &sock,
                "disk",
                "detach",
                "--id",
                "ua-cli",
                "--node",
                "cli-format",
                "--node",
                "cli-storage",
            ])
        }
    })
    .await
    .unwrap();
    assert_eq!((code, out.as_str(), err.as_str()), (0, "{}\n", ""));
    assert_eq!(block_of(vm.client(), "ua-cli").await, Value::Null);

    let (code, _, err) = tokio::task::spawn_blocking(move || {
        qlauncher(&[
            "qmp",
            "/nonexistent/qmp.sock",
            "query-status",
            "--timeout",
            "1",
        ])
    })
    .await
    .unwrap();
    assert_eq!(
        (code, err.as_str()),
        (
            1,
            "error: cannot connect to the QMP socket /nonexistent/qmp.sock\n  caused by: No such file or directory (os error 2)\n"
        )
    );
}
