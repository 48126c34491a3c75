//! The notify client against a notify server playing virt-handler on a real Unix socket: order,
//! retry when the server comes up late, the final delete notification, rejection, giving up.

use qlauncher::sync::domain::{ApiDomain, DomainEventType, LifeCycle, StateChangeReason};
use qlauncher::sync::rpc::notify::{Notifier, NotifyTiming};
use qlauncher::sync::SyncError;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};
use testkit::notify::NotifyServer;

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("domain-notify-pipe.sock")
}

fn domain_in(state: LifeCycle, reason: StateChangeReason) -> ApiDomain {
    let mut domain = ApiDomain::for_vmi("default", "testvmi", "0f1e2d3c-uid");
    domain.set_state(state, reason);
    domain
}

/// Short timing so giving up takes a fraction of a second.
const FAST: NotifyTiming = NotifyTiming {
    interval: Duration::from_millis(50),
    send_timeout: Duration::from_millis(500),
    total_timeout: Duration::from_millis(300),
    connect_timeout: Duration::from_millis(200),
    info_timeout: Duration::from_millis(500),
};

#[tokio::test]
async fn events_arrive_in_queue_order() {
    let dir = tempfile::tempdir().unwrap();
    let server = NotifyServer::start(&socket_in(&dir), vec![1], None);
    let notifier = Notifier::start(socket_in(&dir), NotifyTiming::KUBEVIRT);

    let added = domain_in(LifeCycle::Paused, StateChangeReason::StartingUp);
    let modified = domain_in(LifeCycle::Running, StateChangeReason::Unknown);
    let deleted = domain_in(LifeCycle::Shutoff, StateChangeReason::Shutdown);
    // Queue all three before awaiting any: order must come from the queue, not from the caller.
    let first = notifier.send(DomainEventType::Added, &added).unwrap();
    let second = notifier.send(DomainEventType::Modified, &modified).unwrap();
    let third = notifier.send(DomainEventType::Deleted, &deleted).unwrap();
    third.await.unwrap();
    first.await.unwrap();
    second.await.unwrap();

    assert_eq!(
        server.events(),
        vec![
            ("ADDED".to_owned(), added),
            ("MODIFIED".to_owned(), modified),
            ("DELETED".to_owned(), deleted),
        ]
    );
}

#[tokio::test]
async fn notification_is_retried_until_the_server_comes_up() {
    let dir = tempfile::tempdir().unwrap();
    let notifier = Notifier::start(socket_in(&dir), NotifyTiming::KUBEVIRT);
    let domain = domain_in(LifeCycle::Running, StateChangeReason::Unknown);
    let delivery = notifier.send(DomainEventType::Added, &domain).unwrap();

    // virt-handler's socket appears only after the first tries failed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let server = NotifyServer::start(&socket_in(&dir), vec![1], None);
    delivery.await.unwrap();
    assert_eq!(server.events(), vec![("ADDED".to_owned(), domain)]);
}

#[tokio::test]
async fn final_delete_is_kubevirts_modified_nonexistent_with_deletion_timestamp() {
    let dir = tempfile::tempdir().unwrap();
    let server = NotifyServer::start(&socket_in(&dir), vec![1], None);
    let notifier = Notifier::start(socket_in(&dir), NotifyTiming::KUBEVIRT);

    let last = domain_in(LifeCycle::Shutoff, StateChangeReason::Shutdown);
    let now = UNIX_EPOCH + Duration::from_secs(1_796_000_000);
    let delivery = notifier.send_final_delete(&last, now).unwrap();
    assert!(notifier.final_delete_sent().await);
    delivery.await.unwrap();

    let mut expected = last.clone();
    expected.set_state(LifeCycle::NoState, StateChangeReason::NonExistent);
    expected.object_meta.deletion_timestamp = Some("2026-11-30T00:53:20Z".to_owned());
    assert_eq!(server.events(), vec![("MODIFIED".to_owned(), expected)]);
}

#[tokio::test]
async fn rejected_notification_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let server = NotifyServer::start(
        &socket_in(&dir),
        vec![1],
        Some("domain mismatch".to_owned()),
    );
    let notifier = Notifier::start(socket_in(&dir), NotifyTiming::KUBEVIRT);
    let domain = domain_in(LifeCycle::Running, StateChangeReason::Unknown);
    let error = notifier
        .send(DomainEventType::Modified, &domain)
        .unwrap()
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "failed to notify domain event: domain mismatch"
    );
    assert_eq!(server.events().len(), 1);
}

#[tokio::test]
async fn gives_up_after_total_timeout_then_sends_the_next_event() {
    let dir = tempfile::tempdir().unwrap();
    let notifier = Notifier::start(socket_in(&dir), FAST);
    let lost = domain_in(LifeCycle::Paused, StateChangeReason::StartingUp);
    let error = notifier
        .send(DomainEventType::Added, &lost)
        .unwrap()
        .await
        .unwrap_err();
    match error {
        SyncError::NotifyGaveUp {
            event_type, last, ..
        } => {
            assert_eq!(event_type, "ADDED");
            assert!(matches!(*last, SyncError::NotifyConnect { .. }), "{last:?}");
        }
        other => panic!("unexpected error {other:?}"),
    }

    let server = NotifyServer::start(&socket_in(&dir), vec![1], None);
    let next = domain_in(LifeCycle::Running, StateChangeReason::Unknown);
    notifier
        .send(DomainEventType::Modified, &next)
        .unwrap()
        .await
        .unwrap();
    assert_eq!(server.events(), vec![("MODIFIED".to_owned(), next)]);
}

#[tokio::test]
async fn unknown_notify_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = NotifyServer::start(&socket_in(&dir), vec![2], None);
    let notifier = Notifier::start(socket_in(&dir), FAST);
    let domain = domain_in(LifeCycle::Running, StateChangeReason::Unknown);
    let error = notifier
        .send(DomainEventType::Added, &domain)
        .unwrap()
        .await
        .unwrap_err();
    match error {
        SyncError::NotifyGaveUp { last, .. } => {
            assert!(
                matches!(&*last, SyncError::NotifyVersion { offered } if offered == &vec![2]),
                "{last:?}"
            );
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(server.events().is_empty());
}

#[tokio::test]
async fn k8s_events_share_the_ordered_queue() {
    let dir = tempfile::tempdir().unwrap();
    let server = NotifyServer::start(&socket_in(&dir), vec![1], None);
    let notifier = Notifier::start(socket_in(&dir), NotifyTiming::KUBEVIRT);
    let paused = domain_in(LifeCycle::Paused, StateChangeReason::IoError);
    let event = serde_json::json!({
        "type": "Warning", "reason": "IOerror",
        "message": "VM Paused due to IO error at the volume: rootdisk",
        "involvedObject": {"kind": "VirtualMachineInstance", "name": "testvmi"}
    });
    notifier.send(DomainEventType::Modified, &paused).unwrap();
    notifier
        .send_k8s_event(serde_json::to_vec(&event).unwrap())
        .unwrap()
        .await
        .unwrap();
    // The K8s event was queued after the domain event, so the domain event is already there.
    assert_eq!(server.events(), vec![("MODIFIED".to_owned(), paused)]);
    assert_eq!(*server.k8s_events.lock().unwrap(), vec![event]);
}

#[tokio::test]
async fn latest_domain_state_is_delivered_once_the_pipe_appears() {
    let dir = tempfile::tempdir().unwrap();
    let notifier = Notifier::start(socket_in(&dir), FAST);
    let added = domain_in(LifeCycle::Running, StateChangeReason::Unknown);
    let given_up = notifier.send(DomainEventType::Added, &added).unwrap().await;
    assert!(matches!(given_up, Err(SyncError::NotifyGaveUp { .. })));
    // virt-handler creates the pipe late (after its first call on launcher-sock).
    let server = NotifyServer::start(&socket_in(&dir), vec![1], None);
    for _ in 0..100 {
        if !server.events().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(server.events(), vec![("ADDED".to_owned(), added)]);
}
