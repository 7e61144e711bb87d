use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

fn args(argv: &[&str]) -> ServeArgs {
    let argv = std::iter::once("dubbo-cp").chain(argv.iter().copied());
    Cli::try_parse_from(argv).unwrap().serve
}

/// The configuration from a file's text and flags, validated.
fn load(yaml: &str, argv: &[&str]) -> Result<Config, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dubbo-cp.yaml");
    std::fs::write(&path, yaml).unwrap();
    let mut args = args(argv);
    args.config_file = Some(path);
    Config::load(&args)
}

fn refusal(yaml: &str) -> String {
    match load(yaml, &[]) {
        Err(ConfigError::Invalid(problems)) => problems.join("; "),
        other => panic!("expected a refusal of {yaml:?}, got {other:?}"),
    }
}

/// docs/configuration.md's settings table, generated from the declarations above: key, flag, environment
/// variable, default and meaning (the field's doc comment) of every setting.
fn settings_table() -> String {
    let defaults = flatten_keys(&Config::default());
    let cmd = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
    let mut table =
        String::from("| key | flag | environment | default | meaning |\n|---|---|---|---|---|\n");
    for arg in cmd.get_arguments() {
        let key = arg.get_id().as_str();
        let Some(default) = defaults.get(key) else {
            continue;
        };
        let code = |text: &str| format!("`{text}`");
        let flag = arg.get_long().map(|l| code(&format!("--{l}")));
        let env = arg.get_env().map(|e| code(&e.to_string_lossy()));
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        // The help carries the default for --help; the table has a column for it.
        let meaning = help
            .strip_suffix(&format!(" [default: {default}]"))
            .unwrap_or(&help);
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            code(key),
            flag.unwrap_or_default(),
            env.unwrap_or_default(),
            code(default),
            meaning
        ));
    }
    table
}

#[test]
fn durations_carry_units_and_a_yaml_integer_is_nanoseconds() {
    // The reference's files write integer nanoseconds (wire.md §4).
    let parsed =
        Config::parse("debounce:\n  after: 100000000\n  max: 10s\n  enable: false\n").unwrap();
    assert_eq!(parsed.debounce.after, Duration::from_millis(100));
    assert_eq!(parsed.debounce.max, Duration::from_secs(10));
    assert!(!parsed.debounce.enable);
    // Also inside the flattened writer settings.
    let parsed = Config::parse("kubernetes:\n  parkedRetryInterval: 2000000000\n").unwrap();
    assert_eq!(
        parsed.kubernetes.writer.parked_retry,
        Duration::from_secs(2)
    );
    // A string without a unit is refused, naming the form.
    let refused = Config::parse("debounce:\n  after: \"10\"\n")
        .unwrap_err()
        .to_string();
    assert!(refused.contains("\"10\" has no unit"), "{refused}");
    // Flags take units; a bare number is refused with the flag named.
    let flagged = load("", &["--debounce-after", "5ms", "--debounce-max", "1m"]).unwrap();
    assert_eq!(flagged.debounce.after, Duration::from_millis(5));
    assert_eq!(flagged.debounce.max, Duration::from_secs(60));
    let refused = Cli::try_parse_from(["dubbo-cp", "--debounce-after", "10"])
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("--debounce-after: \"10\" has no unit; write a duration with its unit"),
        "{refused}"
    );
    let zero = load("", &["--mapping-expire-after", "0"]).unwrap();
    assert_eq!(zero.mapping.expire_after, Duration::ZERO);
}

#[test]
fn defaults_match_the_reference() {
    let config = load("", &[]).unwrap();
    assert_eq!(config, Config::default());
    assert_eq!(config.grpc_addr.to_string(), DEFAULT_GRPC_ADDR);
    assert_eq!(config.admin_addr.to_string(), DEFAULT_ADMIN_ADDR);
    assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    assert_eq!(
        config.debounce,
        DebounceConfig {
            after: Duration::from_millis(100),
            max: Duration::from_secs(10),
            enable: true,
        }
    );
    // A file of comments only is no file at all.
    assert_eq!(Config::parse("# nothing\n").unwrap(), Config::default());
}

#[test]
fn flags_beat_file_beats_defaults() {
    let config = load(
        "grpcAddr: 127.0.0.1:1000\nadminAddr: 127.0.0.1:2000\ndebounce:\n  after: 1s\n  max: 20s\n\
         kubernetes:\n  qps: 7\n  burst: 9\n",
        &[
            "--grpc-addr",
            "127.0.0.1:3000",
            "--debounce-after",
            "5ms",
            "--kube-qps",
            "3.5",
        ],
    )
    .unwrap();
    assert_eq!(config.grpc_addr.port(), 3000, "flag beats file");
    assert_eq!(config.admin_addr.port(), 2000, "file beats default");
    assert_eq!(
        config.debounce.after,
        Duration::from_millis(5),
        "flag beats file"
    );
    assert_eq!(
        config.debounce.max,
        Duration::from_secs(20),
        "file beats default"
    );
    assert_eq!(config.kubernetes.writer.qps, 3.5, "flag beats file");
    assert_eq!(config.kubernetes.writer.burst, 9, "file beats default");
    assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    // Boolean flags given bare mean true; optional settings can be set by a flag.
    let config = load(
        "auth:\n  legacyAnswers: false\n",
        &[
            "--legacy-answers",
            "--auth-token-review",
            "false",
            "--auth-admins",
            "a/b,c/d",
        ],
    )
    .unwrap();
    assert!(config.auth.legacy_answers);
    assert_eq!(config.auth.token_review, Some(false));
    assert_eq!(config.auth.admins, ["a/b", "c/d"]);
}

#[test]
fn unknown_or_malformed_fields_are_errors() {
    let error = |yaml: &str| Config::parse(yaml).expect_err("accepted").to_string();
    assert!(error("grpcAdr: 127.0.0.1:1\n").contains("grpcAdr"));
    assert!(error("debounce:\n  aftr: 1s\n").contains("aftr"));
    // The writer's keys are flattened into the section: unknown keys there are still caught.
    assert!(error("kubernetes:\n  qpss: 1\n").contains("qpss"));
    assert!(error("debounce:\n  after: soon\n").contains("soon"));
    assert!(error("debounce:\n  after: -5\n").contains("negative"));
    assert!(error("grpcAddr: not-an-address\n").contains("grpcAddr"));
    assert!(error("ingest:\n  queueCapacity: many\n").contains("queueCapacity"));
    assert!(Config::parse("").is_ok());
}

#[test]
fn bad_flags_are_errors() {
    let argv = ["dubbo-cp", "--debounce-max", "soon"];
    let err = Cli::try_parse_from(argv).err().unwrap().to_string();
    assert!(
        err.contains("--debounce-max") && err.contains("soon"),
        "{err}"
    );
}

#[test]
fn debounce_after_must_not_exceed_max() {
    let message = refusal("debounce:\n  after: 20s\n  max: 10s\n");
    assert_eq!(
        message,
        "debounce.after (20s) must not exceed debounce.max (10s)"
    );
    assert!(load("debounce:\n  after: 10s\n  max: 10s\n", &[]).is_ok());
    // Relations hold across sources: a flag against the file.
    assert!(matches!(
        load("debounce:\n  max: 1s\n", &["--debounce-after", "2s"]),
        Err(ConfigError::Invalid(_))
    ));
}

#[test]
fn rates_must_be_finite_and_above_zero() {
    for (yaml, key) in [
        ("ingest:\n  ratePerCaller: 0\n", "ingest.ratePerCaller"),
        ("ingest:\n  ratePerCaller: -1\n", "ingest.ratePerCaller"),
        (
            "dds:\n  newStreamsPerSecond: .nan\n",
            "dds.newStreamsPerSecond",
        ),
        ("kubernetes:\n  qps: .inf\n", "kubernetes.qps"),
    ] {
        let message = refusal(yaml);
        assert!(
            message.starts_with(&format!("{key} must be a finite number above 0, not ")),
            "{message}"
        );
    }
    assert_eq!(
        refusal("ingest:\n  ratePerCaller: 0\n"),
        "ingest.ratePerCaller must be a finite number above 0, not 0"
    );
    assert!(load("ingest:\n  ratePerCaller: 0.001\n", &[]).is_ok());
}

#[test]
fn bursts_and_capacities_must_be_at_least_one() {
    for (yaml, key) in [
        ("ingest:\n  queueCapacity: 0\n", "ingest.queueCapacity"),
        ("ingest:\n  maxBatch: 0\n", "ingest.maxBatch"),
        ("ingest:\n  burstPerCaller: 0\n", "ingest.burstPerCaller"),
        (
            "ingest:\n  maxApplicationsPerKey: 0\n",
            "ingest.maxApplicationsPerKey",
        ),
        ("dds:\n  newStreamsBurst: 0\n", "dds.newStreamsBurst"),
        ("dds:\n  maxStreams: 0\n", "dds.maxStreams"),
        (
            "grpc:\n  maxConcurrentStreams: 0\n",
            "grpc.maxConcurrentStreams",
        ),
        ("kubernetes:\n  burst: 0\n", "kubernetes.burst"),
        (
            "kubernetes:\n  maxParallelWrites: 0\n",
            "kubernetes.maxParallelWrites",
        ),
    ] {
        assert_eq!(refusal(yaml), format!("{key} must be at least 1, not 0"));
    }
    assert_eq!(
        refusal("ingest:\n  queueBytes: 1000\n"),
        "ingest.queueBytes must be at least 1048576 (the largest request), not 1000"
    );
}

#[test]
fn timeouts_and_intervals_must_be_above_zero() {
    for (yaml, key) in [
        ("ingest:\n  commitTimeout: 0\n", "ingest.commitTimeout"),
        ("dds:\n  sendTimeout: 0s\n", "dds.sendTimeout"),
        ("grpc:\n  keepaliveInterval: 0\n", "grpc.keepaliveInterval"),
        ("grpc:\n  keepaliveTimeout: 0\n", "grpc.keepaliveTimeout"),
        ("grpc:\n  maxConnectionAge: 0\n", "grpc.maxConnectionAge"),
        ("auth:\n  reloadInterval: 0\n", "auth.reloadInterval"),
        (
            "kubernetes:\n  parkedRetryInterval: 0\n",
            "kubernetes.parkedRetryInterval",
        ),
    ] {
        assert_eq!(refusal(yaml), format!("{key} must be above zero, not 0ns"));
    }
    // Zero is a meaningful "do not wait" here.
    assert!(load("shutdownGrace: 0\ngrpc:\n  maxConnectionAgeGrace: 0\n", &[]).is_ok());
}

#[test]
fn every_problem_is_reported_at_once() {
    let message = refusal("ingest:\n  maxBatch: 0\ndds:\n  maxStreams: 0\n");
    assert_eq!(
        message,
        "ingest.maxBatch must be at least 1, not 0; dds.maxStreams must be at least 1, not 0"
    );
}

#[test]
fn printed_config_read_back_is_the_same_config() {
    let config = load(
        "tls:\n  certFile: /c.pem\n  trustDomain: cluster.local\nauth:\n  admins: [ops/admin]\n",
        &[
            "--debounce-max",
            "3s",
            "--log-format",
            "json",
            "--mode",
            "kubernetes",
            "--kube-qps",
            "0.25",
            "--auth-token-review",
            "false",
            "--grpc-max-connection-age-grace",
            "1500ms",
            "--commit-timeout",
            "1ns",
        ],
    )
    .unwrap();
    let yaml = config.to_yaml().unwrap();
    assert!(yaml.contains("max: 3s"), "{yaml}");
    let again = load(&yaml, &[]).unwrap();
    assert_eq!(again, config);
    // And the defaults, every key printed.
    let defaults = Config::default().to_yaml().unwrap();
    assert_eq!(Config::parse(&defaults).unwrap(), Config::default());
    assert!(defaults.contains("tokenFile: null"), "{defaults}");
}

#[test]
fn every_setting_is_a_flag_and_a_variable() {
    let keys: Vec<String> = flatten_keys(&Config::default()).into_keys().collect();
    let cmd = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
    let mut ids: Vec<String> = cmd
        .get_arguments()
        .map(|arg| arg.get_id().to_string())
        .filter(|id| id != CONFIG_FILE_ARG)
        .collect();
    ids.sort();
    assert_eq!(ids, keys, "every key is an argument whose id is the key");
    for arg in cmd.get_arguments() {
        assert!(arg.get_long().is_some(), "{} has no flag", arg.get_id());
        let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
        assert!(
            env.is_some_and(|e| e.starts_with("DUBBO_CP_")),
            "{} has no DUBBO_CP_ variable",
            arg.get_id()
        );
        assert!(!arg.is_required_set(), "{} is required", arg.get_id());
    }
}

#[test]
fn the_documented_table_is_the_generated_one() {
    let readme = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
    )
    .unwrap();
    let table = settings_table();
    assert!(
        readme.contains(&table),
        "docs/configuration.md's settings table is out of date; replace it with:\n\n{table}"
    );
    for key in flatten_keys(&Config::default()).keys() {
        assert!(table.contains(&format!("| `{key}` |")), "{key} missing");
    }
}

#[test]
fn the_example_in_deploy_holds_every_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/dubbo-cp.yaml");
    assert_eq!(Config::read(&path).unwrap(), Config::default());
    // Every key is spelled out (empty where the default is unset).
    let text = std::fs::read_to_string(&path).unwrap();
    let value: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let mut in_file = BTreeMap::new();
    walk_keys("", &value, &mut in_file);
    let in_file: Vec<&String> = in_file.keys().collect();
    let keys = flatten_keys(&Config::default());
    assert_eq!(in_file, keys.keys().collect::<Vec<_>>());
}

/// Every duration setting goes through the one parser: a bare number is refused with the
/// flag named, whichever setting it is.
#[test]
fn every_duration_flag_needs_a_unit() {
    use clap::Args;
    let command = ServeArgs::augment_args(clap::Command::new("dubbo-cp"));
    // The duration settings: those a value with a unit parses into a Duration for.
    let durations: Vec<(String, String)> = command
        .get_arguments()
        .filter_map(|arg| Some((arg.get_id().to_string(), arg.get_long()?.to_owned())))
        .filter(|(id, long)| {
            command
                .clone()
                .try_get_matches_from(["dubbo-cp", &format!("--{long}"), "1500ms"])
                .is_ok_and(|matches| {
                    matches.try_get_one::<Duration>(id).ok().flatten()
                        == Some(&Duration::from_millis(1500))
                })
        })
        .collect();
    assert!(durations.len() >= 20, "{durations:?}");
    for (_, long) in durations {
        let flag = format!("--{long}");
        let refused = command
            .clone()
            .try_get_matches_from(["dubbo-cp", &flag, "10"])
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains(&format!("{flag}: \"10\" has no unit; write a duration")),
            "{refused}"
        );
    }
}
