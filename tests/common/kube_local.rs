//! A real Kubernetes API server (kube-apiserver + etcd) for the end-to-end suite, started once
//! per test binary through `../shared/tools/k8s-local` (or the scripts `DUBBO_CP_K8S_LOCAL`
//! names), with `deploy/` applied by kubectl, and the real `dubbo-cp` binary running as deploy/'s
//! ServiceAccount.
//!
//! Where the binaries come from is configuration, as envtest's `KUBEBUILDER_ASSETS` is:
//! `KUBE_APISERVER` and `ETCD` name them, or `KUBEBUILDER_ASSETS` names a directory holding both;
//! by default the scripts' own kube-apiserver and `etcd` on the PATH (Debian's `etcd-server`).
//! When they cannot be found the suite fails, saying how to provide them: it never passes
//! without a server.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The API server of this test binary.
pub struct Cluster {
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub api_port: u16,
    pub ca_file: PathBuf,
    /// What the first `kubectl apply -k deploy/` printed.
    pub first_apply: String,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn how_to_provide() -> &'static str {
    "the end-to-end suite needs a real kube-apiserver and etcd, and kubectl: \
     set KUBE_APISERVER=/path/to/kube-apiserver and ETCD=/path/to/etcd (or KUBEBUILDER_ASSETS=DIR \
     holding both, as envtest does), or install Debian's etcd-server (`apt-get install -y \
     etcd-server`) and keep ../shared/tools/k8s-local beside the checkout (or set \
     DUBBO_CP_K8S_LOCAL to its path); .ci/run does all of this"
}

/// The API server of this test binary, started on first use.
pub fn cluster() -> &'static Cluster {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    CLUSTER.get_or_init(start_cluster)
}

fn start_cluster() -> Cluster {
    let scripts = std::env::var_os("DUBBO_CP_K8S_LOCAL")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared/tools/k8s-local"));
    assert!(
        scripts.join("up.sh").is_file(),
        "no {}: {}",
        scripts.join("up.sh").display(),
        how_to_provide()
    );
    let mut up = Command::new("bash");
    up.arg(scripts.join("up.sh"));
    // Native sidecars (init containers with `restartPolicy: Always`, what the webhook injects
    // for the agent): on by default from 1.29, behind this gate in the 1.28 of k8s-local.
    let mut apiserver_args = std::env::var("APISERVER_ARGS").unwrap_or_default();
    apiserver_args.push_str(" --feature-gates=SidecarContainers=true");
    up.env("APISERVER_ARGS", apiserver_args.trim_start());
    let assets = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from);
    if let Some(assets) = &assets
        && std::env::var_os("KUBE_APISERVER").is_none()
    {
        up.env("KUBE_APISERVER", assets.join("kube-apiserver"));
    }
    if std::env::var_os("ETCD").is_none() {
        // Given, or Debian's etcd-server, installed when missing (as the browser and Prometheus
        // tests install theirs), so a fresh machine runs the suite with no step beforehand.
        let etcd = match &assets {
            Some(assets) => assets.join("etcd"),
            None => super::distribution_binary(&["etcd"], "etcd-server"),
        };
        up.env("ETCD", etcd);
    }
    // Not removed on drop: the reaper below removes it once this process has exited.
    let dir = tempfile::Builder::new()
        .prefix("dubbo-cp-k8s-")
        .tempdir()
        .expect("no temporary directory")
        .keep();
    let output = up
        .arg(&dir)
        .stdin(Stdio::null())
        .output()
        .expect("cannot run bash");
    assert!(
        output.status.success(),
        "the API server did not start ({}): {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        how_to_provide(),
        String::from_utf8_lossy(&output.stdout)
    );
    reap_when_done(&scripts, &dir);
    let env = std::fs::read_to_string(dir.join("env")).expect("up.sh wrote no env file");
    let var = |name: &str| {
        env.lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name} in {env}"))
            .to_owned()
    };
    let mut cluster = Cluster {
        kubeconfig: PathBuf::from(var("KUBECONFIG")),
        api_port: var("K8S_API_PORT").parse().expect("bad port"),
        ca_file: PathBuf::from(var("K8S_CA")),
        dir,
        first_apply: String::new(),
    };
    let deploy = repo().join("deploy");
    cluster.first_apply = cluster.kubectl_ok(&["apply", "-k", &deploy.to_string_lossy()]);
    for crd in cluster.kubectl_ok(&["get", "crd", "-o", "name"]).lines() {
        cluster.kubectl_ok(&["wait", "--for=condition=Established", crd, "--timeout=60s"]);
    }
    cluster
}

/// Stops etcd and the API server when this test process exits, however it exits (libtest has
/// no hook after the last test): a detached shell waits for our pid, then runs down.sh.
fn reap_when_done(scripts: &Path, dir: &Path) {
    after_this_process(&format!(
        "bash '{down}' '{dir}'; rm -rf '{dir}'",
        down = scripts.join("down.sh").display(),
        dir = dir.display(),
    ));
}

/// Kills process `pid` (a control plane kept in a static, never dropped) when this test
/// process exits.
pub fn reap_with_this_process(pid: u32) {
    after_this_process(&format!("kill {pid} 2>/dev/null"));
}

fn after_this_process(command: &str) {
    let script = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {command}",
        pid = std::process::id(),
    );
    let _ = Command::new("setsid")
        .args(["sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

impl Cluster {
    pub fn api_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.api_port)
    }

    /// kubectl as the cluster admin.
    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = Command::new("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run kubectl ({e}): {}", how_to_provide()));
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        child.wait_with_output().unwrap()
    }

    /// kubectl that must succeed; its standard output.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        self.kubectl_in(args, None)
    }

    /// kubectl with `input` on its standard input, which must succeed.
    pub fn kubectl_in(&self, args: &[&str], input: Option<&str>) -> String {
        let output = self.kubectl(args, input);
        assert!(
            output.status.success(),
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// `kubectl get -o json` of one object, None when it does not exist.
    pub fn get_json(&self, args: &[&str]) -> Option<Value> {
        let mut all = vec!["get", "-o", "json"];
        all.extend_from_slice(args);
        let output = self.kubectl(&all, None);
        output
            .status
            .success()
            .then(|| serde_json::from_slice(&output.stdout).unwrap())
    }

    /// A namespace with the ServiceAccount `default` (no controller-manager makes it here),
    /// labelled as given; either may exist already (tests share namespaces such as the docs'
    /// `demo`).
    pub fn namespace(&self, name: &str, labels: &[&str]) {
        self.create_unless_exists(&["create", "namespace", name]);
        if !labels.is_empty() {
            let mut args = vec!["label", "--overwrite", "namespace", name];
            args.extend_from_slice(labels);
            self.kubectl_ok(&args);
        }
        self.create_unless_exists(&["create", "serviceaccount", "default", "-n", name]);
    }

    fn create_unless_exists(&self, args: &[&str]) {
        let output = self.kubectl(args, None);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success()
                || stderr.contains("AlreadyExists")
                || stderr.contains("already exists"),
            "kubectl {} failed: {stderr}",
            args.join(" ")
        );
    }

    /// A real service-account token (`kubectl create token`), optionally for `audience` and
    /// bound to a pod.
    pub fn token(
        &self,
        namespace: &str,
        account: &str,
        audience: Option<&str>,
        pod: Option<&str>,
    ) -> String {
        let mut args = vec![
            "create",
            "token",
            account,
            "-n",
            namespace,
            "--duration",
            "2h",
        ];
        if let Some(audience) = audience {
            args.extend(["--audience", audience]);
        }
        if let Some(pod) = pod {
            args.extend(["--bound-object-kind", "Pod", "--bound-object-name", pod]);
        }
        self.kubectl_ok(&args).trim().to_owned()
    }

    /// A kubeconfig that authenticates as ServiceAccount `namespace/account` with a real token.
    pub fn service_account_kubeconfig(&self, namespace: &str, account: &str) -> PathBuf {
        let token = self.token(namespace, account, None, None);
        let path = self.dir.join(format!("{namespace}-{account}.kubeconfig"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {}\n    \
             certificate-authority: {}\nusers:\n- name: {account}\n  user:\n    token: {token}\n\
             contexts:\n- name: local\n  context: {{cluster: local, user: {account}}}\n\
             current-context: local\n",
            self.api_url(),
            self.ca_file.display(),
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// A pod of `namespace` (it stays Pending: there is no kubelet), with `labels`.
    pub fn pod(&self, namespace: &str, name: &str, labels: Value) -> Value {
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
        });
        let created = self.kubectl_in(&["create", "-o", "json", "-f", "-"], Some(&pod.to_string()));
        serde_json::from_str(&created).unwrap()
    }

    /// Waits until `check` holds, asking every 100 ms (the API server is another process;
    /// each look is one request).
    pub async fn wait_until(&self, what: &str, wait: Duration, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + wait;
        while !check() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The real binary in Kubernetes mode against the cluster, as deploy/'s ServiceAccount. Its
/// logs go to a file (printed when a test fails to start it), so nothing is written to a closed
/// pipe when a test process ends before it.
pub struct ControlPlane {
    pub child: std::process::Child,
    grpc: SocketAddr,
    admin: SocketAddr,
    xds: Option<SocketAddr>,
    pub log: PathBuf,
    _data_dir: tempfile::TempDir,
}

impl ControlPlane {
    pub fn grpc(&self) -> SocketAddr {
        self.grpc
    }

    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// The xDS port, unless xDS is off.
    pub fn xds(&self) -> Option<SocketAddr> {
        self.xds
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `dubbo-cp serve --mode kubernetes` with the kubeconfig of `dubbo-system/dubbo-cp`,
/// ephemeral ports (unless `extra` names them) and `extra` arguments; returns once it serves.
pub fn control_plane(cluster: &Cluster, extra: &[&str]) -> ControlPlane {
    let kubeconfig = cluster.service_account_kubeconfig("dubbo-system", "dubbo-cp");
    let data_dir = tempfile::tempdir().unwrap();
    let mut args = vec!["serve", "--mode", "kubernetes", "--shutdown-grace", "2s"];
    for flag in [
        "--grpc-addr",
        "--admin-addr",
        "--tls-addr",
        "--webhook-addr",
        "--xds-addr",
    ] {
        if !extra.contains(&flag) {
            args.extend([flag, "127.0.0.1:0"]);
        }
    }
    args.extend_from_slice(extra);
    let log = data_dir.path().join("dubbo-cp.log");
    let file = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_dubbo-cp"))
        .args(&args)
        .arg("--data-dir")
        .arg(data_dir.path())
        .env("KUBECONFIG", &kubeconfig)
        .env("DUBBO_CP_NAMESPACE", "dubbo-system")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("cannot spawn dubbo-cp");
    let mut plane = ControlPlane {
        child,
        grpc: SocketAddr::from(([0, 0, 0, 0], 0)),
        admin: SocketAddr::from(([0, 0, 0, 0], 0)),
        xds: None,
        log,
        _data_dir: data_dir,
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let line = loop {
        let text = std::fs::read_to_string(&plane.log).unwrap_or_default();
        if let Some(line) = text.lines().find(|l| l.contains("dubbo-cp serving")) {
            break line.to_owned();
        }
        let exited = plane.child.try_wait().ok().flatten();
        assert!(
            exited.is_none() && Instant::now() < deadline,
            "dubbo-cp {} before serving:\n{text}",
            exited.map_or("did not start in time".to_owned(), |s| format!(
                "exited ({s})"
            ))
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let field = |name: &str| -> SocketAddr {
        line.split_whitespace()
            .find_map(|word| word.strip_prefix(&format!("{name}=")))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line:?}"))
    };
    plane.grpc = field("grpc_addr");
    plane.admin = field("admin_addr");
    plane.xds = line
        .split_whitespace()
        .find_map(|word| word.strip_prefix("xds_addr="))
        .and_then(|value| value.parse().ok());
    plane
}

/// A free loopback port (bound, then released) for a server whose address must be known
/// before it starts.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}
