//! Test support shared by the workspace's tests (not published).
//!
//! [`RedisServer`]: a real `redis-server` of the test's own, on a free
//! loopback port, that the test can kill, freeze and restart.
//!
//! [`LimitedUpstream`]: an OpenAI-compatible chat endpoint on a free
//! loopback port that enforces requests and tokens per window for each
//! API key, answers 429 over them, states OpenAI's `x-ratelimit-*`
//! headers, and counts what each key was sent ([`limited`]).
//!
//! The binary is `redis-server` on `PATH` (or `$TOWER_LLM_REDIS_SERVER`).
//! Without it, a test skips with a message, unless `CI` is set: then it
//! fails (`.ci/run` sets `CI` and installs the server).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod limited;

pub use limited::{KeyStats, LimitedUpstream, Limits};

/// A `redis-server` process of the test's own; killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    binary: String,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// A running server, or `None` (skip) when there is no `redis-server`
    /// and `CI` is unset.
    pub fn start(test: &str) -> Option<RedisServer> {
        let binary =
            std::env::var("TOWER_LLM_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        let found = Command::new(&binary)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            assert!(
                std::env::var_os("CI").is_none(),
                "{test}: `{binary}` not found and CI is set: install redis-server (see .ci/run)"
            );
            eprintln!("{test}: SKIPPED: `{binary}` not found (install redis-server to run it)");
            return None;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("tower-llm-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let mut server = RedisServer {
            binary,
            port,
            dir,
            child: None,
        };
        server.restart();
        Some(server)
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A frozen server must be able to die.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops (`SIGSTOP`) or resumes (`SIGCONT`) the server: connections
    /// stay open, nothing answers.
    pub fn freeze(&self, frozen: bool) {
        let child = self.child.as_ref().expect("running");
        let status = Command::new("kill")
            .arg(if frozen { "-STOP" } else { "-CONT" })
            .arg(child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -STOP/-CONT");
    }

    /// Starts the server (again) on the same port, empty, and waits until
    /// it answers PING (5 s at most).
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.ping() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!(
            "redis-server on port {} did not answer within 5 s",
            self.port
        );
    }

    fn ping(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 7];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `check` every 2 ms until it holds or `within` has passed; the
/// time it took, or `None`.
pub async fn within(within: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if check() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Polls the asynchronous `check` every 10 ms until it holds or `limit`
/// has passed (real time: for what a real server decides); `true` if it
/// held.
pub async fn poll<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A loopback upstream that accepts every connection, reads what it is
/// sent and never answers (a wedged provider), on a task of the current
/// runtime; its address.
///
/// # Panics
///
/// When no loopback port can be bound.
pub async fn silent_upstream() -> std::net::SocketAddr {
    use tokio::io::AsyncReadExt;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0_u8; 4096];
                while let Ok(n) = sock.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    addr
}
