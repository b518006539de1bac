//! The axum example runs, not just compiles: its `run()` is called once
//! (its servers on loopback) and its answer checked.

#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/axum_handler.rs"]
mod axum_handler;

#[tokio::test(start_paused = true)]
async fn the_axum_example_fails_over_to_the_backup() {
    let out = axum_handler::run().await.expect("the example runs");
    assert_eq!(out.status, 200, "{}", out.body);
    assert_eq!(out.body["answer"], "Hello from the backup");
    assert_eq!(out.body["served_by"], "anthropic");
    // Three 503s on the primary, then the backup.
    assert_eq!(out.body["attempts"], 4);
}
