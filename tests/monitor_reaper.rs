//! The reaper leaves the children someone else waits on to them: a `std::process::Child` and a
//! `tokio::process::Child` get their own exit status while the reaper takes hundreds of orphans.
//!
//! One test in this file: the test process becomes child subreaper, and a reaper in a test
//! binary that ran other tests in parallel would take their children.
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use qlauncher::monitor::procfs;
use qlauncher::monitor::reaper::{Reaped, Reaper};

#[test]
fn managed_children_keep_their_exit_status() {
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let reaper = Arc::new(Reaper::new());
    let me = std::process::id() as i32;

    // 1. A managed child that is already a zombie, the oldest child: `waitid(P_ALL)` keeps
    //    returning it, so reaping the orphans goes through the /proc fallback.
    let mut managed = reaper
        .spawn_managed(|| {
            let c = Command::new("sh").args(["-c", "exit 7"]).spawn()?;
            let pid = c.id() as i32;
            Ok::<_, std::io::Error>((c, pid))
        })
        .unwrap();
    let managed_pid = managed.id() as i32;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !procfs::stat(managed_pid).is_some_and(|s| s.is_zombie()) {
        assert!(Instant::now() < deadline, "managed child never exited");
        std::thread::sleep(Duration::from_millis(10));
    }
    // 300 orphans, re-parented to us, plus their unmanaged parent shell.
    let orphan_maker = Command::new("sh")
        .args([
            "-c",
            "i=0; while [ $i -lt 300 ]; do ( : & ); i=$((i+1)); done",
        ])
        .spawn()
        .unwrap();
    let maker_pid = orphan_maker.id() as i32;
    drop(orphan_maker);
    let mut reaped: Vec<Reaped> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        reaped.extend(reaper.reap());
        let zombies = procfs::children(me)
            .into_iter()
            .filter(|c| c.is_zombie() && c.pid != managed_pid)
            .count();
        // Every orphan has exited and been reaped: the managed zombie is our only child left.
        // (Not exactly 300 orphans: a subshell sometimes reaps its background child itself.)
        let only_managed = procfs::children(me).iter().all(|c| c.pid == managed_pid);
        if reaped.iter().any(|r| r.pid == maker_pid) && only_managed && zombies == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "reaped only {}", reaped.len());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(reaped.iter().all(|r| r.pid != managed_pid));
    assert!(reaped.len() > 150, "only {} reaped", reaped.len());
    assert_eq!(managed.wait().unwrap().code(), Some(7));
    reaper.release(managed_pid);

    // 2. tokio children waited on (through a pidfd) while a reaper thread spins.
    let stop = Arc::new(AtomicBool::new(false));
    let orphans = Arc::new(Mutex::new(Vec::new()));
    let spinner = {
        let (reaper, stop, orphans) = (reaper.clone(), stop.clone(), orphans.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let got = reaper.reap();
                orphans.lock().unwrap().extend(got);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for i in 0..20 {
            let code = 10 + i;
            let mut child = reaper
                .spawn_managed(|| {
                    let c = tokio::process::Command::new("sh")
                        .args(["-c", &format!("( : & ); exit {code}")])
                        .spawn()?;
                    let pid = c.id().unwrap_or(0) as i32;
                    Ok::<_, std::io::Error>((c, pid))
                })
                .unwrap();
            let pid = child.id().unwrap() as i32;
            let status = child.wait().await.expect("tokio wait must not see ECHILD");
            assert_eq!(status.code(), Some(code));
            reaper.release(pid);
        }
    });
    stop.store(true, Ordering::SeqCst);
    spinner.join().unwrap();
    // The orphans of those shells were reaped by the reaper; no zombie is left.
    let deadline = Instant::now() + Duration::from_secs(10);
    while procfs::children(me).iter().any(|c| c.is_zombie()) {
        orphans.lock().unwrap().extend(reaper.reap());
        assert!(Instant::now() < deadline, "zombies left");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Orphans were reaped, and no managed shell (exit codes 10..30) among them.
    let orphans = orphans.lock().unwrap();
    assert!(!orphans.is_empty());
    assert!(orphans.iter().all(|r| !matches!(
        r.status,
        nix::sys::wait::WaitStatus::Exited(_, c) if (10..30).contains(&c)
    )));
}
