//! SIGHUP reloads the policy file even when its modification time and size
//! have not changed (so the file watcher alone would miss it). In a test
//! binary of its own: a signal goes to the whole process.

use std::time::Duration;

use tower_llm_providers::mock::Reply;

use crate::support::*;

#[cfg(unix)]
#[tokio::test(start_paused = true)]
async fn sighup_reloads_a_file_whose_time_and_size_did_not_change() {
    let h = start(
        Reply::openai_text("primary"),
        Reply::anthropic_text("backup"),
        "",
    )
    .await;
    let path =
        std::env::temp_dir().join(format!("tower-llm-gateway-hup-{}.toml", std::process::id()));
    let text = policy_text(&h.primary, &h.backup, "", FULL_CHAIN);
    std::fs::write(&path, &text).expect("write");
    tokio::spawn(tower_llm_gateway::reload_on_change(
        h.gateway.clone(),
        path.clone(),
    ));
    // Let the watcher start (and install its SIGHUP handler).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.gateway.policy().deadline.total_ms, Some(2000));

    // The same length, and the old modification time put back.
    let modified = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .expect("mtime");
    assert!(text.contains("total_ms = 2000"));
    std::fs::write(&path, text.replace("total_ms = 2000", "total_ms = 3000")).expect("write");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(modified))
        .expect("set mtime");
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        h.gateway.policy().deadline.total_ms,
        Some(2000),
        "the watcher alone does not see it"
    );

    // Our own receiver: once it has the signal, so has the watcher's (the
    // signal driver wakes every receiver at once), whatever the real time
    // the kernel took to deliver it.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .expect("a SIGHUP receiver");
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("kill");
    assert!(sent.success());
    hup.recv().await.expect("the signal arrives");
    let mut reloaded = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if h.gateway.policy().deadline.total_ms == Some(3000) {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "SIGHUP reloaded the file");
    let _ = std::fs::remove_file(&path);
}
