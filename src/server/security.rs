//! Who may call and how they are told apart: the auth policy, service-account tokens, the bind
//! check, the serving identity, the CA and the admission webhook.

use super::*;

/// The CA (if enabled), the authentication policy (which trusts the CA's tokens), and in
/// Kubernetes mode the expiry of applications whose pods are gone and the canary controller.
pub(super) async fn open_security(
    config: &Config,
    kube_client: Option<&kube::Client>,
    source: &Source,
    wiring: &mut Wiring,
) -> anyhow::Result<Security> {
    let Wiring {
        tasks,
        registry,
        shutdown_rx,
        ..
    } = wiring;
    let authority = open_ca(config, kube_client, source, registry, tasks).await?;
    let (policy, pods) = auth_policy(config, kube_client, registry, tasks, shutdown_rx.clone())?;
    start_expiry(config, source, kube_client.zip(pods), registry, tasks);
    if let Some(client) = kube_client {
        start_canaries(config, &source.index, client, registry, tasks)?;
    }
    let policy = policy.with_dubbo_jwt(
        authority
            .clone()
            .map(|a| Arc::new(a) as Arc<dyn TokenVerifier>),
    );
    Ok(Security { authority, policy })
}

/// The authentication and authorization of the configuration: a token file (watched for
/// changes), service-account tokens in Kubernetes mode, or none.
pub(super) fn auth_policy(
    config: &Config,
    kube_client: Option<&kube::Client>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<(Policy, Option<Arc<PodView>>)> {
    let policy = |authenticator: Option<Arc<dyn Authenticator>>| {
        Policy::new(
            authenticator,
            config.auth.admins.clone(),
            config.auth.legacy_answers,
        )
        .with_trust_domain(Some(config.tls.trust_domain.clone()))
    };
    if config.uses_token_review() {
        let client =
            kube_client.context("service-account authentication needs a Kubernetes client")?;
        let (authenticator, pods) = service_accounts(config, client, registry, tasks);
        return Ok((policy(Some(authenticator)), Some(pods)));
    }
    let Some(path) = &config.auth.token_file else {
        return Ok((policy(None), None));
    };
    let (tokens, modified) = StaticTokens::open(path)?;
    let reload = config.auth.reload_interval;
    let watched = tokens.clone();
    tasks.spawn("token file watch", async move {
        tokio::select! {
            () = watched.watch(reload, modified) => {}
            () = signalled(&mut shutdown) => {}
        }
        Ok(())
    });
    Ok((policy(Some(tokens)), None))
}

/// Kubernetes authentication: the cluster's token keys and its pods, both kept by background
/// tasks, in front of a paced TokenReview.
pub(super) fn service_accounts(
    config: &Config,
    client: &kube::Client,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> (Arc<dyn Authenticator>, Arc<PodView>) {
    let auth = &config.auth;
    let requests = Arc::new(RateLimiter::new(
        auth.token_reviews_per_second,
        auth.token_reviews_burst,
    ));
    let keys = Arc::new(ServiceAccountKeys::new(
        client.clone(),
        auth.keys_refresh_interval,
    ));
    let refresh = keys
        .clone()
        .run(auth.keys_refresh_interval, tasks.shutdown_receiver());
    tasks.spawn("service-account keys", async move {
        refresh.await;
        Ok(())
    });
    let pods = Arc::new(PodView::new(client.clone(), requests.clone()));
    let watch = pods.clone().run(tasks.shutdown_receiver());
    tasks.spawn("pod watch", async move {
        watch.await;
        Ok(())
    });
    let authenticator = ServiceAccountAuthenticator::new(
        keys,
        pods.clone(),
        TokenReviewer::new(client.clone()),
        requests,
        auth.api_audiences.clone(),
        CacheSettings {
            ttl: auth.cache_ttl,
            negative_ttl: auth.negative_cache_ttl,
            max_bytes: auth.cache_bytes,
        },
    );
    authenticator.stats().register_metrics(registry);
    (Arc::new(authenticator), pods)
}

/// Refuses to serve an unauthenticated control plane beyond loopback unless told to.
pub(super) fn check_bind_policy(config: &Config) -> anyhow::Result<()> {
    let tls_exposed = (config.tls.cert_file.is_some() || config.ca.enabled)
        && !config.tls.addr.ip().is_loopback();
    let xds_exposed = config.xds.enabled && !config.xds.addr.ip().is_loopback();
    if (config.grpc_addr.ip().is_loopback() && !tls_exposed && !xds_exposed)
        || config.authenticates()
    {
        return Ok(());
    }
    if !config.insecure_allow_unauthenticated {
        if xds_exposed && config.grpc_addr.ip().is_loopback() && !tls_exposed {
            anyhow::bail!(
                "refusing to serve xDS unauthenticated on {} (xds.addr): bind a loopback address, \
                 configure authentication, or pass --insecure-allow-unauthenticated to accept that \
                 anyone who reaches this port can read every service's endpoints",
                config.xds.addr
            );
        }
        anyhow::bail!(
            "refusing to serve unauthenticated registrations on {}: bind a loopback address, or pass \
             --insecure-allow-unauthenticated to accept that anyone who reaches this port can steer traffic",
            config.grpc_addr
        );
    }
    tracing::warn!(
        grpc_addr = %config.grpc_addr,
        "INSECURE: serving without authentication on a non-loopback address; anyone who reaches \
         this port can register mappings"
    );
    Ok(())
}

/// The admission webhook: its HTTPS server with a certificate from the CA, the watches it reads
/// and the configuration object it keeps.
pub(super) fn start_webhook(
    config: &Config,
    // The webhook's listener, and the TLS port pods are told to ask for certificates on.
    (listener, tls_port): (TcpListener, u16),
    authority: &Authority,
    client: &kube::Client,
    tls_stats: Arc<TlsStats>,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<()> {
    use crate::webhook::{self, cluster::ClusterLookup, configuration};
    let (service, namespace) = (&config.ca.service_name, &config.ca.namespace);
    let mut names = vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        "localhost".to_owned(),
    ];
    if let Some(url) = &config.webhook.url {
        let host = http::Uri::try_from(url.as_str())
            .ok()
            .and_then(|uri| uri.host().map(|h| h.trim_matches(['[', ']']).to_owned()))
            .with_context(|| format!("webhook.url {url:?} has no host"))?;
        names.push(host);
    }
    let addr = listener.local_addr()?;
    let (configs, maintain) = TlsConfigs::start(
        ServingIdentity::Ca { names },
        None,
        Some(authority.clone()),
        tls_stats.clone(),
        WEBHOOK_ALPN,
        tasks.shutdown_receiver(),
    )?;
    tasks.spawn("webhook certificate", async move {
        maintain.await;
        Ok(())
    });
    let lookup = Arc::new(ClusterLookup::new(client.clone()));
    let watches = lookup
        .clone()
        .run(client.clone(), tasks.shutdown_receiver());
    tasks.spawn("webhook watches", async move {
        watches.await;
        Ok(())
    });
    let stats = Arc::new(webhook::WebhookStats::default());
    stats.register_metrics(registry);
    let hook = webhook::Webhook {
        lookup: lookup.clone(),
        cluster: Some(lookup),
        slots: Arc::new(tokio::sync::Semaphore::new(webhook::MAX_CONCURRENT_REVIEWS)),
        ca_address: config
            .webhook
            .ca_address
            .clone()
            .unwrap_or_else(|| format!("{service}.{namespace}.svc:{tls_port}"))
            .into(),
        agent_image: config.webhook.agent_image.as_str().into(),
        timeout: config.webhook.timeout,
        stats,
    };
    let incoming = crate::tls::incoming(listener, configs.current, TCP_KEEPALIVE, tls_stats);
    let serve = axum::serve(
        crate::tls::TlsListener { incoming, addr },
        webhook::router(hook),
    )
    .with_graceful_shutdown(wait_for_shutdown(tasks.shutdown_receiver()));
    tasks.spawn("webhook server", async move {
        serve.await.context("webhook server failed")
    });
    let target = configuration::Target {
        url: config.webhook.url.clone(),
        service: service.clone(),
        namespace: namespace.clone(),
        port: addr.port(),
        // A little more than our own deadline, so the API server sees our answer (never more
        // than 10 s, the default it would wait).
        timeout_seconds: u32::try_from(config.webhook.timeout.as_secs() + 1)
            .unwrap_or(10)
            .clamp(1, 10),
    };
    let config_stats = Arc::new(configuration::ConfigurationStats::default());
    config_stats.register_metrics(registry);
    let keep = configuration::run(
        client.clone(),
        target,
        authority.clone(),
        config_stats,
        tasks.shutdown_receiver(),
    );
    tasks.spawn("webhook configuration", async move {
        keep.await;
        Ok(())
    });
    Ok(())
}

/// Where the TLS port's certificate comes from: the given files, else the CA; no TLS port
/// without either.
pub(super) fn serving_identity(config: &Config) -> anyhow::Result<Option<ServingIdentity>> {
    match (&config.tls.cert_file, &config.tls.key_file) {
        (Some(cert), Some(key)) => Ok(Some(ServingIdentity::Files {
            cert: cert.clone(),
            key: key.clone(),
        })),
        (Some(_), None) | (None, Some(_)) => {
            anyhow::bail!("tls.certFile and tls.keyFile go together: give both or neither")
        }
        (None, None) if config.ca.enabled => {
            let (service, namespace) = (&config.ca.service_name, &config.ca.namespace);
            Ok(Some(ServingIdentity::Ca {
                names: vec![
                    "localhost".to_owned(),
                    format!("{service}.{namespace}.svc"),
                    format!("{service}.{namespace}.svc.cluster.local"),
                ],
            }))
        }
        (None, None) => Ok(None),
    }
}

/// The certificate authority: its roots in the store (standalone), Secret `dubbo-ca-secret`
/// (Kubernetes), the ensemble (ZooKeeper mode with `zookeeper.auth`), or the operator's files;
/// in Kubernetes mode the roots are also published to every namespace.
pub(super) async fn open_ca(
    config: &Config,
    kube_client: Option<&kube::Client>,
    source: &Source,
    registry: &mut Registry,
    tasks: &mut Supervisor,
) -> anyhow::Result<Option<Authority>> {
    let ca = &config.ca;
    if !ca.enabled {
        return Ok(None);
    }
    let settings = CaSettings {
        root_validity: ca.root_validity,
        cert_validity: ca.cert_validity,
        auto_rotate: ca.auto_rotate,
    };
    let backend = match (&ca.cert_file, &ca.key_file, kube_client) {
        (Some(cert), Some(key), _) => Backend::Files(crate::ca::store::from_files(cert, key)?),
        (Some(_), None, _) | (None, Some(_), _) => {
            anyhow::bail!("ca.certFile and ca.keyFile go together: give both or neither")
        }
        (None, None, Some(client)) => {
            let data_dir = config.data_dir.clone();
            let cache = tokio::task::spawn_blocking(move || {
                SqliteRoots::open(&data_dir.join(store::DB_FILE))
            })
            .await
            .context("CA cache open task failed")??;
            Backend::Secret {
                secret: SecretRoots::new(client.clone(), &ca.namespace),
                cache: Arc::new(cache),
            }
        }
        (None, None, None) => {
            let data_dir = config.data_dir.clone();
            let roots = tokio::task::spawn_blocking(move || {
                SqliteRoots::open(&data_dir.join(store::DB_FILE))
            })
            .await
            .context("CA store open task failed")??;
            match &source.zookeeper {
                Some(zk) if zk.shares_roots => Backend::Ensemble {
                    roots: crate::ca::ensemble::EnsembleRoots::new(zk.session.subscribe()),
                    cache: Arc::new(roots),
                },
                Some(_) => {
                    tracing::warn!(
                        "ZooKeeper mode without zookeeper.auth: the CA's signing key is not put \
                         in the ensemble (anyone could read it), so this replica keeps its own \
                         root and workloads served by other replicas will not trust it. Give every \
                         replica the same identity (--zookeeper-auth FILE holding \
                         digest:USER:PASSWORD) to share one root, or the same --ca-cert/--ca-key"
                    );
                    Backend::Sqlite(Arc::new(roots))
                }
                None => Backend::Sqlite(Arc::new(roots)),
            }
        }
    };
    let (authority, manager) = Authority::open(backend, settings)
        .await
        .context("cannot start the certificate authority")?;
    let mut authority = authority.with_trust_domain(&config.tls.trust_domain);
    authority.stats.register_metrics(registry);
    if let Some(zk) = &source.zookeeper {
        // Replicas on one ensemble compare their roots, however each got them.
        let (fleet, follow) = crate::ca::fleet::start(
            zk.session.subscribe(),
            authority.subscribe(),
            tasks.shutdown_receiver(),
        );
        tasks.spawn("CA roots of the fleet", async move {
            follow.await;
            Ok(())
        });
        authority = authority.with_fleet(fleet);
    }
    let shutdown = tasks.shutdown_receiver();
    tasks.spawn("CA roots", async move {
        manager.run(shutdown).await;
        Ok(())
    });
    if let Some(client) = kube_client {
        let stats = Arc::new(PublishStats::default());
        stats.register_metrics(registry);
        let publish = crate::ca::publish::run(
            client.clone(),
            authority.clone(),
            stats,
            tasks.shutdown_receiver(),
        );
        tasks.spawn("CA ConfigMaps", async move {
            publish.await;
            Ok(())
        });
    }
    Ok(Some(authority))
}
