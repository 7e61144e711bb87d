//! A real ZooKeeper (Debian's `zookeeper` package, 3.8) on a free loopback port, all its state in
//! a temporary directory; installed with apt-get when missing. It can be stopped and started
//! again on the same port with the same data (an ensemble outage), and paused.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use zookeeper_client::{Acls, Client, CreateMode, Error};

const JAR: &str = "/usr/share/java/zookeeper.jar";
/// tickTime: session timeouts negotiate into [2 ticks, 20 ticks] = [1 s, 10 s].
const TICK_MS: u64 = 500;

pub struct ZooKeeper {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        self.stop();
    }
}

impl ZooKeeper {
    /// Starts a fresh server and waits until it answers.
    pub async fn start() -> ZooKeeper {
        super::install_package("zookeeper", &|| {
            std::path::Path::new(JAR).exists() && which("java")
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut zk = ZooKeeper {
            child: None,
            port,
            dir: tempfile::tempdir().unwrap(),
        };
        zk.resume_serving().await;
        zk
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn config(&self) -> PathBuf {
        let data = self.dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let config = self.dir.path().join("zoo.cfg");
        std::fs::write(
            &config,
            format!(
                "tickTime={TICK_MS}\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\n\
                 minSessionTimeout={}\nmaxSessionTimeout={}\nadmin.enableServer=false\n\
                 maxClientCnxns=0\n4lw.commands.whitelist=ruok,srvr,wchs\n",
                data.display(),
                self.port,
                TICK_MS * 2,
                TICK_MS * 20,
            ),
        )
        .unwrap();
        config
    }

    /// Starts the server (again, after [`ZooKeeper::stop`]: same port, same data).
    pub async fn resume_serving(&mut self) {
        assert!(self.child.is_none(), "already running");
        let config = self.config();
        let child = Command::new("java")
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg(format!("-Dzookeeper.log.dir={}", self.dir.path().display()))
            .args(["-cp", &format!("{JAR}:/etc/zookeeper/conf")])
            .arg("org.apache.zookeeper.server.ZooKeeperServerMain")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start ZooKeeper (java)");
        self.child = Some(child);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Ok(client)) =
                tokio::time::timeout(Duration::from_secs(2), Client::connect(&self.address())).await
                && client.list_children("/").await.is_ok()
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "ZooKeeper did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the server (its data stays for [`ZooKeeper::resume_serving`]).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A four-letter command's answer (`wchs`: how many watches the server holds).
    pub fn four_letters(&self, command: &str) -> String {
        four_letters(self.port, command)
    }

    /// A client of this server, as an SDK would hold one.
    pub async fn client(&self) -> Client {
        Client::connect(&self.address())
            .await
            .expect("cannot connect to ZooKeeper")
    }
}

fn which(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
}

/// Writes `data` at `path`, creating it and its parents (persistent), as dubbo-admin or an
/// operator would.
pub async fn put(client: &Client, path: &str, data: &[u8]) {
    let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
    match client.set_data(path, data, None).await {
        Ok(_) => {}
        Err(Error::NoNode) => {
            if let Some((parent, _)) = path.rsplit_once('/')
                && !parent.is_empty()
            {
                client.mkdir(parent, &options).await.unwrap();
            }
            client.create(path, data, &options).await.unwrap();
        }
        Err(err) => panic!("set {path}: {err}"),
    }
}

/// The node's bytes as UTF-8, or None when it does not exist.
pub async fn get(client: &Client, path: &str) -> Option<String> {
    match client.get_data(path).await {
        Ok((data, _)) => Some(String::from_utf8(data).unwrap()),
        Err(Error::NoNode) => None,
        Err(err) => panic!("get {path}: {err}"),
    }
}

/// What the SDK's `MetadataServiceNameMapping` does for one mapping: read the node and its
/// version; if the application is missing, append it and write with the version check (or create
/// the node); on a lost ticket wait a random time below 100 ms and retry, up to 10 times.
pub async fn sdk_register(client: &Client, interface: &str, application: &str) -> bool {
    let path = format!("/dubbo/mapping/{interface}");
    let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
    for _ in 0..10 {
        match client.get_data(&path).await {
            Ok((data, stat)) => {
                let current = String::from_utf8_lossy(&data).into_owned();
                if current.split(',').any(|app| app.trim() == application) {
                    return true;
                }
                let next = if current.is_empty() {
                    application.to_owned()
                } else {
                    format!("{current},{application}")
                };
                match client
                    .set_data(&path, next.as_bytes(), Some(stat.version))
                    .await
                {
                    Ok(_) => return true,
                    Err(Error::BadVersion) => {}
                    Err(err) => panic!("{err}"),
                }
            }
            Err(Error::NoNode) => {
                let _ = client.mkdir("/dubbo/mapping", &options).await;
                match client.create(&path, application.as_bytes(), &options).await {
                    Ok(_) => return true,
                    Err(Error::NodeExists) => {}
                    Err(err) => panic!("{err}"),
                }
            }
            Err(err) => panic!("{err}"),
        }
        let wait = std::collections::hash_map::RandomState::new();
        use std::hash::{BuildHasher, Hasher};
        tokio::time::sleep(Duration::from_millis(wait.build_hasher().finish() % 100)).await;
    }
    false
}

/// ZooKeeper mode on `zk`, with a short debounce and shutdown.
pub fn zk_config(data_dir: &std::path::Path, zk: &ZooKeeper) -> dubbo_cp::config::Config {
    let mut config = super::test_config(data_dir);
    config.zookeeper.address = Some(zk.address());
    config.zookeeper.session_timeout = Duration::from_secs(4);
    config.debounce.after = Duration::from_millis(20);
    config.debounce.max = Duration::from_millis(200);
    config.shutdown_grace = Duration::from_secs(2);
    config
}

/// Waits (up to 20 s) until `check` holds of the admin port's mappings.
pub async fn wait_mappings(
    admin: std::net::SocketAddr,
    what: &str,
    check: impl Fn(&super::Mappings) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mappings = super::admin_mappings(admin).await;
        if check(&mappings) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: never; mappings are {mappings:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (up to 20 s) until the node at `path` holds `expected` (None: gone).
pub async fn wait_node(client: &zookeeper_client::Client, path: &str, expected: Option<&str>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let value = get(client, path).await;
        if value.as_deref() == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{path} holds {value:?}, not {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Three ZooKeeper servers on loopback forming one ensemble (Debian's package, the same jar),
/// each stoppable and startable on its own with its data kept: a rolling restart.
pub struct Ensemble {
    servers: Vec<Option<Child>>,
    /// Client ports, by server.
    pub ports: Vec<u16>,
    dir: tempfile::TempDir,
}

impl Drop for Ensemble {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            self.stop(i);
        }
    }
}

fn free_ports(count: usize) -> Vec<u16> {
    // Held together while picking, so no two are alike.
    let listeners: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

impl Ensemble {
    /// Starts three servers and waits until the ensemble serves.
    pub async fn start() -> Ensemble {
        super::install_package("zookeeper", &|| {
            std::path::Path::new(JAR).exists() && which("java")
        });
        let ports = free_ports(9);
        let dir = tempfile::tempdir().unwrap();
        let peers: String = (0..3)
            .map(|i| {
                format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    i + 1,
                    ports[3 + i],
                    ports[6 + i]
                )
            })
            .collect();
        for (i, client_port) in ports[..3].iter().enumerate() {
            let data = dir.path().join(format!("s{}", i + 1));
            std::fs::create_dir_all(&data).unwrap();
            std::fs::write(data.join("myid"), format!("{}\n", i + 1)).unwrap();
            std::fs::write(
                dir.path().join(format!("zoo{}.cfg", i + 1)),
                format!(
                    "tickTime={TICK_MS}\ninitLimit=20\nsyncLimit=10\ndataDir={}\nclientPort={}\n\
                     clientPortAddress=127.0.0.1\nminSessionTimeout={}\nmaxSessionTimeout={}\n\
                     admin.enableServer=false\nmaxClientCnxns=0\n\
                     4lw.commands.whitelist=ruok,srvr,mntr\n{peers}",
                    data.display(),
                    client_port,
                    TICK_MS * 2,
                    TICK_MS * 20,
                ),
            )
            .unwrap();
        }
        let mut ensemble = Ensemble {
            servers: vec![None, None, None],
            ports: ports[..3].to_vec(),
            dir,
        };
        for i in 0..3 {
            ensemble.spawn(i);
        }
        for i in 0..3 {
            ensemble.wait_serving(i).await;
        }
        ensemble
    }

    /// The connect string of all three.
    pub fn address(&self) -> String {
        self.ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&mut self, i: usize) {
        assert!(self.servers[i].is_none(), "server {i} already runs");
        let log_dir = self.dir.path().join(format!("log{}", i + 1));
        std::fs::create_dir_all(&log_dir).unwrap();
        let child = Command::new("java")
            .args(["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg("-Dzookeeper.admin.enableServer=false")
            .arg(format!("-Dzookeeper.log.dir={}", log_dir.display()))
            .args(["-cp", &format!("{JAR}:/etc/zookeeper/conf")])
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(self.dir.path().join(format!("zoo{}.cfg", i + 1)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cannot start ZooKeeper (java)");
        self.servers[i] = Some(child);
    }

    /// Waits until server `i` is a follower or the leader (`srvr` names its mode).
    pub async fn wait_serving(&self, i: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            let answer = four_letters(self.ports[i], "srvr");
            if answer.contains("Mode: leader") || answer.contains("Mode: follower") {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "server {i} of the ensemble never served: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops server `i` (its data stays).
    pub fn stop(&mut self, i: usize) {
        if let Some(mut child) = self.servers[i].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts server `i` again and waits until it serves in the ensemble.
    pub async fn resume(&mut self, i: usize) {
        self.spawn(i);
        self.wait_serving(i).await;
    }

    /// A client of the whole ensemble, as an SDK would hold one.
    pub async fn client(&self) -> Client {
        Client::connect(&self.address())
            .await
            .expect("cannot connect to the ensemble")
    }
}

/// A four-letter command's answer from the server on `port` (empty when it does not answer).
pub fn four_letters(port: u16, command: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(command.as_bytes()).is_err() {
        return String::new();
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
}
