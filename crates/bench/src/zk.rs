//! The ZooKeeper way: what a Dubbo SDK does against a ZooKeeper metadata center for each
//! mapping — read `/dubbo/mapping/<interface>` and its version; if the application is missing,
//! write the comma-separated list back with the version check (or create the node); on a version
//! conflict wait a random time below 100 ms and retry, up to 10 times. Against a real ZooKeeper
//! server (Debian's `zookeeper` package) started here on loopback with a fresh data directory.

use std::hash::{BuildHasher, Hasher};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use zookeeper_client::{Acls, Client, CreateMode, Error};

const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";
const CAS_RETRIES: usize = 10;

pub struct ZooKeeperServer {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts ZooKeeper standalone (durable: forceSync on, as shipped) and waits until it answers.
pub async fn start() -> anyhow::Result<ZooKeeperServer> {
    if !std::path::Path::new(ZOOKEEPER_JAR).exists() {
        bail!(
            "{ZOOKEEPER_JAR} is missing: install Debian's zookeeper package (benches/run-all installs it)"
        );
    }
    let dir = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let config = dir.path().join("zoo.cfg");
    std::fs::create_dir_all(dir.path().join("data"))?;
    std::fs::write(
        &config,
        format!(
            "tickTime=2000\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
             admin.enableServer=false\nmaxClientCnxns=0\n",
            dir.path().join("data").display()
        ),
    )?;
    let child = Command::new("java")
        .args(["-cp", &format!("/etc/zookeeper/conf:{ZOOKEEPER_JAR}")])
        .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start ZooKeeper (java)")?;
    let server = ZooKeeperServer {
        child,
        port,
        _dir: dir,
    };
    for _ in 0..200 {
        if let Ok(client) = Client::connect(&server.address()).await {
            ensure_parents(&client).await?;
            return Ok(server);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("ZooKeeper did not start within 20 s")
}

impl ZooKeeperServer {
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

async fn ensure_parents(client: &Client) -> anyhow::Result<()> {
    for path in ["/dubbo", "/dubbo/mapping"] {
        match client
            .create(
                path,
                b"",
                &CreateMode::Persistent.with_acls(Acls::anyone_all()),
            )
            .await
        {
            Ok(_) | Err(Error::NodeExists) => {}
            Err(err) => bail!("cannot create {path}: {err}"),
        }
    }
    Ok(())
}

fn random_wait() -> Duration {
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    Duration::from_millis(bits % 100)
}

/// One mapping, the way the SDK writes it. Returns whether it ended stored.
pub async fn register(client: Client, interface: String, application: String) -> bool {
    let path = format!("/dubbo/mapping/{interface}");
    for _ in 0..CAS_RETRIES {
        match client.get_data(&path).await {
            Ok((data, stat)) => {
                let current = String::from_utf8_lossy(&data);
                if current.split(',').any(|app| app == application) {
                    return true;
                }
                let next = if current.is_empty() {
                    application.clone()
                } else {
                    format!("{current},{application}")
                };
                match client
                    .set_data(&path, next.as_bytes(), Some(stat.version))
                    .await
                {
                    Ok(_) => return true,
                    Err(Error::BadVersion) => tokio::time::sleep(random_wait()).await,
                    Err(_) => return false,
                }
            }
            Err(Error::NoNode) => {
                let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
                match client.create(&path, application.as_bytes(), &options).await {
                    Ok(_) => return true,
                    Err(Error::NodeExists) => tokio::time::sleep(random_wait()).await,
                    Err(_) => return false,
                }
            }
            Err(_) => return false,
        }
    }
    false
}
