//! A real browser for the dashboard test: Debian's headless Chromium driven
//! over WebDriver by `chromedriver` (both from apt: `./dev test` installs
//! them). The protocol is a handful of JSON calls, so they are made here
//! with the kit's HTTP client rather than through a WebDriver crate.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A chromedriver process and one headless Chromium session; both end on
/// drop.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn program(env: &str, default: &str) -> String {
    std::env::var(env)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

impl Browser {
    /// Start chromedriver (`$CHROMEDRIVER`, default `/usr/bin/chromedriver`)
    /// and a headless Chromium (`$CHROMIUM`, default `/usr/bin/chromium`)
    /// that keeps its console log.
    pub fn start() -> Browser {
        let (driver_path, chromium) = (
            program("CHROMEDRIVER", "/usr/bin/chromedriver"),
            program("CHROMIUM", "/usr/bin/chromium"),
        );
        for path in [&driver_path, &chromium] {
            assert!(
                std::path::Path::new(path).exists(),
                "{path} not found: `./dev test` installs chromium and chromium-driver with apt"
            );
        }
        let port = free_port();
        let driver = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {driver_path}: {e}"));
        let agent = crate::http::agent();
        let base = format!("http://127.0.0.1:{port}");
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            agent,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while browser.call("GET", "/status", None).is_none() {
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let user_data = std::env::temp_dir().join(crate::unique("edgeroute-chromium"));
        // The flags a closed network needs: without the background-networking
        // ones Chromium keeps trying to reach its own services.
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,900",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([format!("--user-data-dir={}", user_data.display())])
        .collect::<Vec<_>>();
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": chromium, "args": args },
            "goog:loggingPrefs": { "browser": "ALL" },
        }}});
        let created = browser
            .call("POST", "/session", Some(capabilities))
            .expect("chromedriver answers POST /session");
        browser.session = created["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_string();
        browser
    }

    /// One WebDriver call; None when the driver cannot be reached.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Option<Value> {
        let url = format!("{}{path}", self.base);
        let response = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, body) => self
                .agent
                .post(&url)
                .header("content-type", "application/json")
                .send(serde_json::to_vec(&body.unwrap_or(json!({}))).unwrap()),
        };
        let mut response = response.ok()?;
        let text = response.body_mut().read_to_string().ok()?;
        serde_json::from_str(&text).ok()
    }

    /// A call in this session; panics with the driver's error.
    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let answer = self
            .call(method, &path, body)
            .unwrap_or_else(|| panic!("chromedriver did not answer {method} {path}"));
        if answer["value"]["error"].is_string() {
            panic!("WebDriver {method} {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    pub fn open(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({ "url": url })));
    }

    /// Run `script` (a function body; `return` gives the value) in the page.
    pub fn eval(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Evaluate `script` until it returns true.
    pub fn wait_for(&self, script: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.eval(script) == json!(true) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the page never made `{script}` true within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The browser console's entries since the last call (`level`,
    /// `message`, `source`).
    pub fn console(&self) -> Vec<Value> {
        let logs = self.session_call("POST", "/se/log", Some(json!({ "type": "browser" })));
        logs.as_array().cloned().unwrap_or_default()
    }

    /// A PNG of the viewport.
    pub fn screenshot(&self) -> Vec<u8> {
        use base64::Engine;
        let encoded = self.session_call("GET", "/screenshot", None);
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("a base64 screenshot"))
            .expect("valid base64")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
