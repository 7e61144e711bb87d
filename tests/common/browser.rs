//! A headless Chromium driven over its DevTools protocol (a few JSON commands on a WebSocket),
//! for the dashboard tests.
#![allow(dead_code)]
// Tests: a failed unwrap is the test failing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Chromium from the distribution (installed by the test setup when missing).
fn chromium() -> PathBuf {
    super::distribution_binary(
        &["chromium", "chromium-browser", "google-chrome"],
        "chromium",
    )
}

/// A headless Chromium and one page of it, driven over the DevTools protocol.
pub struct Browser {
    process: std::process::Child,
    socket: tungstenite::WebSocket<std::net::TcpStream>,
    session: String,
    next_id: u64,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Browser {
    pub fn open(url: &str) -> Browser {
        use std::io::BufRead;
        let profile = tempfile::tempdir().unwrap();
        let mut process = std::process::Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("cannot start chromium");
        let stderr = process.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if let Some(url) = line.split("DevTools listening on ").nth(1) {
                    let _ = tx.send(url.trim().to_owned());
                }
            }
        });
        let ws = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("chromium did not start");
        let address = ws
            .trim_start_matches("ws://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        let stream = std::net::TcpStream::connect(&address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let (socket, _) = tungstenite::client(ws.as_str(), stream).expect("DevTools handshake");
        let mut browser = Browser {
            process,
            socket,
            session: String::new(),
            next_id: 0,
            _profile: profile,
        };
        let target = browser.call("Target.createTarget", serde_json::json!({"url": url}));
        let attached = browser.call(
            "Target.attachToTarget",
            serde_json::json!({"targetId": target["targetId"], "flatten": true}),
        );
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        browser
    }

    /// One command; waits for its answer, skipping events.
    pub fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        self.next_id += 1;
        let mut message =
            serde_json::json!({"id": self.next_id, "method": method, "params": params});
        if !self.session.is_empty() {
            message["sessionId"] = self.session.clone().into();
        }
        self.socket
            .send(tungstenite::Message::text(message.to_string()))
            .unwrap();
        loop {
            let answer = self.socket.read().expect("DevTools connection lost");
            let Ok(text) = answer.to_text() else { continue };
            let answer: serde_json::Value = serde_json::from_str(text).unwrap();
            if answer["id"] == self.next_id {
                assert!(answer.get("error").is_none(), "{method}: {answer}");
                return answer["result"].clone();
            }
        }
    }

    pub fn evaluate(&mut self, expression: &str) -> serde_json::Value {
        let result = self.call(
            "Runtime.evaluate",
            serde_json::json!({"expression": expression, "returnByValue": true}),
        );
        result["result"]["value"].clone()
    }

    /// Evaluates `expression` until it is `true` (the page polls the server once a second).
    pub fn wait_for(&mut self, expression: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while self.evaluate(expression) != serde_json::Value::Bool(true) {
            assert!(
                std::time::Instant::now() < deadline,
                "page never showed: {expression}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn screenshot(&mut self, path: &Path) {
        use base64::Engine;
        let shot = self.call(
            "Page.captureScreenshot",
            serde_json::json!({"format": "png"}),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        std::fs::write(path, png).unwrap();
    }
}
