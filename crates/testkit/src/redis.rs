//! A real Redis server (Debian's `redis-server`) on a free loopback port,
//! for the fleet's load store; killed on drop. No persistence: each test
//! gets an empty store.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    /// Start one; panics with a hint when `redis-server` is not installed.
    pub fn start() -> Redis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server not found: `./dev setup` installs it (apt redis-server)");
        let redis = Redis { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    /// `redis://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
