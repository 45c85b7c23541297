//! Unit tests of configuration assembly: defaults, and every violation named by its setting.
use super::*;

fn raw() -> RawConfig {
    RawConfig {
        redis_url: "redis://127.0.0.1:6379".into(),
        jobs_dir: "/srv/jobs".into(),
        data_dir: None,
        cache_dir: Some("/var/cache/leasehold".into()),
        node_id: Some("n1".into()),
        lease_ttl: Duration::from_secs(10),
        heartbeat: Duration::from_secs(2),
        lease_margin: None,
        redis_timeout: None,
        http: None,
        http_token: None,
        limits: RawLimits {
            max_memory: 512 << 20,
            max_step_time: Duration::from_secs(600),
            max_write_size: 16 << 20,
            max_component_size: 64 << 20,
            guest_log_lines: 200,
            max_stored_keys: 1_000_000,
            max_stored_bytes: 1 << 30,
            max_instances: 64,
            max_tables: 64,
            max_memories: 64,
            instance_pool: 64,
        },
        allow_evicting_redis: false,
        min_replicas: 0,
        replica_timeout: None,
        capacity: 1,
        task_slots: None,
        databases: Vec::new(),
        max_statement_time: Duration::from_secs(60),
        max_sql_rows: 1_000_000,
        max_sql_result: 256 << 20,
        http_allow: Vec::new(),
        http_allow_private: false,
        max_http_timeout: Duration::from_secs(60),
        max_http_response: 16 << 20,
    }
}

#[test]
fn databases_are_named_postgres_urls_each_once() {
    let mut r = raw();
    r.databases = vec![
        "ledger=postgres://billing:secret@db:5432/accounts?pool=8".into(),
        "ledger=postgres://other@db/x".into(),
        "bad name=postgres://x@db/y".into(),
        "mysql=mysql://x@db/y".into(),
        "tls=postgres://x@db/y?sslmode=allow".into(),
        "root=postgres://x@db/y?sslrootcert=/ca.pem".into(),
    ];
    r.max_statement_time = Duration::from_millis(10);
    let err = NodeConfig::from_raw(r).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("database ledger is configured twice"),
        "{text}"
    );
    assert!(text.contains("database name \"bad name\""), "{text}");
    assert!(text.contains("is not a PostgreSQL URL"), "{text}");
    assert!(text.contains("sslmode=allow is not one of"), "{text}");
    assert!(
        text.contains("sslrootcert is set but sslmode is disable"),
        "{text}"
    );
    assert!(text.contains("max-statement-time (10ms)"), "{text}");
    assert!(!text.contains("secret"), "a password in an error: {text}");
    let mut r = raw();
    r.databases = vec!["ledger=postgres://billing:secret@db:5432/accounts?pool=8".into()];
    let cfg = NodeConfig::from_raw(r).unwrap();
    assert_eq!(cfg.databases[0].pool, 8);
    assert_eq!(cfg.databases[0].name, "ledger");
    assert!(!format!("{:?}", cfg.databases[0]).contains("secret"));
}

#[test]
fn a_good_configuration_gets_its_defaults() {
    let cfg = NodeConfig::from_raw(raw()).unwrap();
    assert_eq!(cfg.node_id, "n1");
    assert_eq!(cfg.timing.margin, Duration::from_secs(1));
    assert_eq!(cfg.limits, HostLimits::default());
}

#[test]
fn every_violation_names_its_setting_and_all_are_reported() {
    let mut r = raw();
    r.node_id = Some("a:b".into());
    r.heartbeat = Duration::from_secs(4);
    r.limits.max_memory = 1000;
    r.limits.max_stored_bytes = 100;
    r.limits.max_instances = 0;
    r.cache_dir = Some("/srv/jobs/.cache".into());
    r.http_token = Some(String::new());
    let e = NodeConfig::from_raw(r).unwrap_err();
    let settings: Vec<Setting> = e.violations.iter().map(|v| v.setting).collect();
    assert_eq!(
        settings,
        vec![
            Setting::NodeId,
            Setting::Heartbeat,
            Setting::MaxMemory,
            Setting::MaxStoredBytes,
            Setting::MaxInstances,
            Setting::CacheDir,
            Setting::HttpToken
        ],
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.starts_with("invalid configuration:\n  - node-id must be"),
        "{text}"
    );
    assert!(
        text.contains("max-memory (1000 bytes) must be at least 1 MiB")
            && text.contains("max-instances (0) must be between 1 and 10000"),
        "{text}"
    );
    assert!(
        text.contains("max-stored-bytes (100 bytes) must be at least 1 KiB"),
        "{text}"
    );
}

#[test]
fn node_ids_are_checked() {
    assert!(validate_node_id("node-a.1_x").is_ok());
    assert!(validate_node_id("").is_err());
    assert_eq!(
        validate_node_id("a:b").unwrap_err().setting,
        Setting::NodeId
    );
    assert!(validate_node_id(&"x".repeat(65)).is_err());
}

#[test]
fn an_etcd_url_names_the_hosts_store_and_refuses_what_is_redis_only() {
    for url in [
        "etcd://127.0.0.1:2379",
        "etcds://a:2379,b:2379?cacert=/ca.pem",
    ] {
        let mut r = raw();
        r.redis_url = url.into();
        let cfg = NodeConfig::from_raw(r).expect("an etcd URL names a host's store");
        assert_eq!(cfg.redis_url, url);
        let mut r = raw();
        r.redis_url = url.into();
        r.min_replicas = 1;
        let e = NodeConfig::from_raw(r).unwrap_err();
        let settings: Vec<Setting> = e.violations.iter().map(|v| v.setting).collect();
        assert_eq!(settings, vec![Setting::MinReplicas], "{e}");
        assert!(e.to_string().contains("applies to Redis only"), "{e}");
    }
    let mut r = raw();
    r.redis_url = "etcd://".into();
    let e = NodeConfig::from_raw(r).unwrap_err();
    let settings: Vec<Setting> = e.violations.iter().map(|v| v.setting).collect();
    assert_eq!(settings, vec![Setting::RedisUrl], "{e}");
}
