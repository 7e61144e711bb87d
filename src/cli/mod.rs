//! The command line: `serve` runs the control plane; the other sub-commands are clients of it.

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::{Config, ServeArgs};
use crate::pb::snp::ServiceMappingRequest;
use crate::pb::snp::service_name_mapping_service_client::ServiceNameMappingServiceClient;
use crate::{server, telemetry};

#[macro_use]
mod output;
mod bootstrap;
mod ca;
mod canary;
mod columns;
mod connect;
mod rules;
mod status;
mod watch;
mod xds;

pub use connect::{ServerArg, TokenArg, chain as error_chain};
use rules::{AdminArg, RuleOutput};

#[derive(Debug, Parser)]
#[command(
    name = "dubbo-cp",
    version,
    about = "A control plane for Apache Dubbo services"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the control plane: standalone by default (embedded SQLite); `--mode kubernetes` for
    /// custom resources; `--zookeeper HOST:PORT` for Dubbo's ZooKeeper registry and config center.
    Serve {
        #[command(flatten)]
        args: Box<ServeArgs>,
        /// Print the effective configuration as YAML and exit.
        #[arg(long)]
        print_config: bool,
    },
    /// Register a service-name mapping, as an SDK does at start-up.
    Register {
        #[command(flatten)]
        server: ServerArg,
        #[command(flatten)]
        token: TokenArg,
        #[arg(short, long)]
        namespace: String,
        #[arg(short, long)]
        application: String,
        /// Interfaces the application serves.
        #[arg(required = true)]
        interfaces: Vec<String>,
        /// After `success`, wait until the discovery stream serves every interface with the
        /// application (registrations are durable at once and merged into mappings within a
        /// debounce window).
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits.
        #[arg(long, default_value = "30s", value_parser = crate::duration::DurationArg)]
        wait_timeout: std::time::Duration,
    },
    /// Remove an application from mappings (standalone only: in Kubernetes mode edit the
    /// objects, in ZooKeeper mode the mapping nodes; an admin identity when authentication is
    /// configured): from the interfaces given, or from every one it serves.
    Unregister {
        #[command(flatten)]
        admin: AdminArg,
        #[arg(short, long)]
        namespace: String,
        #[arg(short, long)]
        application: String,
        interfaces: Vec<String>,
    },
    /// Print the CustomResourceDefinitions (ServiceNameMapping, the five rule kinds, Canary) as YAML.
    Crd,
    /// Subscribe to the discovery stream like a data-plane client and print every state.
    Watch {
        #[command(flatten)]
        server: ServerArg,
        #[command(flatten)]
        token: TokenArg,
        /// Kind to watch (e.g. ServiceNameMapping, TagRoute).
        #[arg(long = "type", default_value = "ServiceNameMapping")]
        kind: String,
        #[arg(short, long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Print what is served: `mappings` (from one discovery-stream subscription; with
    /// `--application` the interfaces that application serves, from the admin API),
    /// `applications` (each with its number of interfaces), or the rules of a kind
    /// (`tagroutes`, `conditionroutes`, `dynamicconfigs`, `authenticationpolicies`,
    /// `authorizationpolicies`, from the admin API; in both modes what clients are served).
    Get {
        what: String,
        #[command(flatten)]
        server: ServerArg,
        #[command(flatten)]
        admin: AdminArg,
        /// Only this namespace. Without it `get` lists every namespace (kubectl's `-A`), not a
        /// default one.
        #[arg(short, long, conflicts_with = "all_namespaces")]
        namespace: Option<String>,
        /// Every namespace, as kubectl's `-A`: what `get` lists without `-n` too.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        /// `get mappings`: only the interfaces this application serves.
        #[arg(short, long)]
        application: Option<String>,
        /// `text` (columns), `yaml` or `json`.
        #[arg(short, long, value_enum, default_value_t = RuleOutput::Text)]
        output: RuleOutput,
    },
    /// Create or update rules from Kubernetes-style manifests, all or nothing (standalone and
    /// ZooKeeper mode; in Kubernetes mode rules are custom resources: use kubectl apply).
    Apply {
        #[command(flatten)]
        admin: AdminArg,
        /// A manifest file, a directory of them, or `-` for standard input.
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<std::path::PathBuf>,
        /// Return once every object is what clients are served (in ZooKeeper mode: written and
        /// read back by the watch), as `register --wait` does.
        #[arg(long)]
        wait: bool,
        /// How long `--wait` waits.
        #[arg(long, default_value = "30s", value_parser = crate::duration::DurationArg)]
        wait_timeout: std::time::Duration,
    },
    /// Print a gRPC xDS bootstrap (server, credentials, node with namespace and locality) for
    /// `GRPC_XDS_BOOTSTRAP_CONFIG`.
    Bootstrap(bootstrap::BootstrapArgs),
    /// Keep a workload certificate from the CA in a directory (`cert-chain.pem`, `key.pem`,
    /// `root-cert.pem`) for gRPC's file_watcher certificate provider, renewed before expiry and
    /// when the roots rotate (`--once`: write it and exit).
    Agent(dubbo_cp_agent::AgentArgs),
    /// Which clients have which revisions of each kind (`--stale`: only those behind); with
    /// `--compare ADMIN...`, whether several replicas serve byte-identical state.
    Status(status::StatusArgs),
    /// What the xDS edge serves: `split SERVICE [-n NS] [--header k:v]` prints the share of
    /// calls each endpoint gets.
    Xds {
        #[command(subcommand)]
        command: xds::XdsCommand,
    },
    /// The certificate authority: `show` the roots, `root` prints their PEM bundle, `rotate`
    /// them, `issue` a certificate.
    Ca {
        #[command(subcommand)]
        command: ca::CaCommand,
    },
    /// Canaries (Kubernetes): `status`, `promote`, `abort`, `history`, `rollback --to-revision`.
    Canary {
        #[command(subcommand)]
        command: canary::CanaryCommand,
    },
    /// Delete rules: those named by manifests (`-f`), or `<kind> <name> -n <namespace>`. One
    /// that does not exist is an error, as with kubectl.
    Delete {
        #[command(flatten)]
        admin: AdminArg,
        #[arg(short = 'f', long = "filename")]
        files: Vec<std::path::PathBuf>,
        kind: Option<String>,
        name: Option<String>,
        #[arg(short, long, default_value = "default")]
        namespace: String,
        /// Succeed when an object to delete does not exist.
        #[arg(long)]
        ignore_not_found: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
    Yaml,
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { args, print_config } => {
            let config = Config::load(&args)?;
            if print_config {
                out!("{}", config.to_yaml()?);
                return Ok(());
            }
            telemetry::init(config.log.format);
            serve(config).await
        }
        Command::Register {
            mut server,
            token,
            namespace,
            application,
            interfaces,
            wait,
            wait_timeout,
        } => {
            server.token = token.token;
            register(&server, &namespace, &application, &interfaces).await?;
            if wait {
                let took = watch::wait_served(
                    &server,
                    &namespace,
                    &application,
                    &interfaces,
                    wait_timeout,
                )
                .await?;
                outln!("served after {} ms", took.as_millis());
            }
            Ok(())
        }
        Command::Unregister {
            admin,
            namespace,
            application,
            interfaces,
        } => status::unregister(&admin, namespace, application, interfaces).await,
        Command::Bootstrap(args) => bootstrap::run(&args),
        Command::Agent(args) => dubbo_cp_agent::run(args).await,
        Command::Crd => {
            out!("{}", crate::k8s::crd::crd_yaml()?);
            Ok(())
        }
        Command::Watch {
            mut server,
            token,
            kind,
            output,
        } => {
            server.token = token.token;
            watch::watch(&server, &kind, output).await
        }
        Command::Get {
            what,
            mut server,
            admin,
            namespace,
            application,
            output,
            all_namespaces: _,
        } => {
            let mappings = what == "mappings" || what == "mapping" || what == "snp";
            if mappings && application.is_some() || what == "applications" || what == "application"
            {
                status::applications(&admin, namespace.as_deref(), application.as_deref(), output)
                    .await
            } else if application.is_some() {
                anyhow::bail!("--application goes with get mappings")
            } else if mappings {
                // One --token for both ports.
                server.token = admin.token.clone();
                let output = match output {
                    RuleOutput::Text => Output::Text,
                    RuleOutput::Json => Output::Json,
                    RuleOutput::Yaml => Output::Yaml,
                };
                watch::get_mappings(&server, namespace.as_deref(), output).await?;
                status::say_pending(&admin).await;
                Ok(())
            } else {
                rules::get(&admin, &what, namespace.as_deref(), output).await
            }
        }
        Command::Apply {
            admin,
            files,
            wait,
            wait_timeout,
        } => rules::apply(&admin, &files, wait.then_some(wait_timeout)).await,
        Command::Ca { command } => ca::run(command).await,
        Command::Canary { command } => canary::run(command).await,
        Command::Status(args) => status::run(args).await,
        Command::Xds { command } => xds::run(command).await,
        Command::Delete {
            admin,
            files,
            kind,
            name,
            namespace,
            ignore_not_found,
        } => match (files.is_empty(), kind, name) {
            (false, None, None) => rules::delete_files(&admin, &files, ignore_not_found).await,
            (true, Some(kind), Some(name)) => {
                rules::delete_named(&admin, &kind, &name, &namespace, ignore_not_found).await
            }
            _ => anyhow::bail!("delete takes -f FILE, or KIND NAME [-n NAMESPACE]"),
        },
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let running = server::start(config).await?;
    shutdown_signal().await?;
    running.stop().await
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() -> anyhow::Result<()> {
    dubbo_cp_kit::shutdown::terminated()
        .await
        .context("cannot listen for SIGTERM or Ctrl-C")
}

async fn register(
    server: &ServerArg,
    namespace: &str,
    application: &str,
    interfaces: &[String],
) -> anyhow::Result<()> {
    let request = server.request(ServiceMappingRequest {
        namespace: namespace.to_owned(),
        application_name: application.to_owned(),
        interface_names: interfaces.to_vec(),
    })?;
    let response = server
        .within("registration", async {
            let channel = server.connect().await?;
            ServiceNameMappingServiceClient::new(channel)
                .register_service_app_mapping(request)
                .await
                .map_err(|status| server.failed("registration", &status))
        })
        .await?
        .into_inner();
    outln!(
        "success: {}, message: {}",
        response.success,
        response.message
    );
    anyhow::ensure!(response.success, "registration refused");
    Ok(())
}
