//! One compose project per test: `docker-compose.yml` with `docker-compose.local.yml`, under a
//! project name of its own and with a deployment directory of its own
//! (`LEASEHOLD_DEPLOY_DIR`), taken down (volumes included) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use leasehold_harness::fixtures::deploy_billing;
use leasehold_harness::{TempDir, guests, output_in, output_within, repo_root, wait_for};

/// The replicas of the compose file.
pub(crate) const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];
/// The bearer token the tests start the project with.
pub(crate) const TOKEN: &str = "container-tier-token";

/// Customers the billing job charges per period in these tests.
pub(crate) const CUSTOMERS: usize = 300;

/// What a project's replicas mount at `/jobs` and `/data`: `billing` (with [`CUSTOMERS`]
/// customers) and `reconciliation` (with its sample day), as `./dev deploy-dir` fills
/// `deploy/`, in a temporary directory of the test's own.
pub(crate) struct Deploy {
    dir: TempDir,
}

impl Deploy {
    pub(crate) fn new(name: &str) -> Self {
        let dir = TempDir::new(&format!("containers-{name}"));
        let (jobs, data) = deploy_billing(dir.path(), CUSTOMERS);
        std::fs::copy(
            guests().wasm("reconciliation"),
            jobs.join("reconciliation.wasm"),
        )
        .unwrap();
        copy_dir(
            &repo_root().join("guest-jobs/reconciliation/sample"),
            &data.join("reconciliation"),
        );
        Deploy { dir }
    }

    /// Adds the `ticker` fixture (one period a second, catch-up of every missed one).
    pub(crate) fn with_ticker(self) -> Self {
        std::fs::copy(guests().wasm("ticker"), self.jobs().join("ticker.wasm")).unwrap();
        self
    }

    /// Adds `billing-pg`: the billing component under another name, granted the compose file's
    /// `ledger` database (its charges are booked in PostgreSQL's `billing_charges`), with the
    /// same customers and `ms` of delay per customer.
    pub(crate) fn with_billing_pg(self, ms: u64) -> Self {
        let jobs = self.jobs();
        std::fs::copy(jobs.join("billing.wasm"), jobs.join("billing-pg.wasm")).unwrap();
        std::fs::write(
            jobs.join("billing-pg.toml"),
            "name = \"billing-pg\"\n[sql.databases]\nledger = \"ledger\"\n",
        )
        .unwrap();
        let data = self.dir.join("data");
        std::fs::create_dir_all(data.join("billing-pg")).unwrap();
        std::fs::copy(
            data.join("billing/customers.csv"),
            data.join("billing-pg/customers.csv"),
        )
        .unwrap();
        std::fs::write(data.join("billing-pg/delay-ms"), ms.to_string()).unwrap();
        self
    }

    /// Makes billing pause `ms` per customer (its `delay-ms` input), so that a run lasts.
    pub(crate) fn with_billing_delay(self, ms: u64) -> Self {
        std::fs::write(self.dir.join("data/billing/delay-ms"), ms.to_string()).unwrap();
        self
    }

    /// The directory mounted at `/jobs`.
    pub(crate) fn jobs(&self) -> PathBuf {
        self.dir.join("jobs")
    }
}

/// Copies the files under `from` into `to`, creating directories.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A running compose project.
pub(crate) struct Compose {
    project: String,
    root: PathBuf,
    deploy: Deploy,
}

impl Compose {
    /// `up -d --no-build` with `deploy` mounted, then waits (up to 120 s) until Redis and the
    /// three replicas are healthy by their own health checks.
    pub(crate) async fn up(name: &str, deploy: Deploy) -> Self {
        let c = Compose {
            project: format!("lh-{name}-{}", std::process::id()),
            root: repo_root(),
            deploy,
        };
        c.compose(&["up", "-d", "--no-build"]);
        for service in ["redis", "postgres", "node-a", "node-b", "node-c"] {
            c.healthy(service).await;
        }
        c
    }

    /// Waits (up to 120 s) until `service` is healthy by its own health check.
    pub(crate) async fn healthy(&self, service: &str) {
        wait_for(
            &format!("{service} healthy"),
            Duration::from_secs(120),
            || {
                let out = self.docker_out(&[
                    "inspect",
                    "-f",
                    "{{.State.Health.Status}}",
                    &self.container(service),
                ]);
                let healthy = String::from_utf8_lossy(&out.stdout).trim() == "healthy";
                async move { healthy.then_some(()) }
            },
        )
        .await;
    }

    /// Waits (up to 180 s) until `node` is ready: `/readyz` answers 200 once the jobs present at
    /// its start are loaded (a debug-built host compiles the reconciliation for a while after
    /// its health check, which is liveness only, passes).
    pub(crate) async fn ready(&self, node: &str) {
        let addr = self.http(node);
        wait_for(
            &format!("{node} ready"),
            Duration::from_secs(180),
            || async {
                let (code, _) =
                    leasehold_harness::http_with(&addr, "GET", "/readyz", None, None).await;
                (code == 200).then_some(())
            },
        )
        .await;
    }

    /// The deployment directory the replicas mount.
    pub(crate) fn deploy(&self) -> &Deploy {
        &self.deploy
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.current_dir(&self.root)
            .env("LEASEHOLD_HTTP_TOKEN", TOKEN)
            .env("LEASEHOLD_DEPLOY_DIR", self.deploy.dir.path())
            .env("COMPOSE_PROJECT_NAME", &self.project);
        cmd
    }

    /// `docker-compose <args>` on this project; panics unless it succeeds.
    pub(crate) fn compose(&self, args: &[&str]) -> Output {
        let mut cmd = self.command("docker-compose");
        cmd.args(["-f", "docker-compose.yml", "-f", "docker-compose.local.yml"])
            .args(args);
        let out = output_in(cmd, Duration::from_secs(120));
        assert!(
            out.status.success(),
            "docker-compose {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn docker_out(&self, args: &[&str]) -> Output {
        let mut cmd = self.command("docker");
        cmd.args(args);
        output_within(cmd)
    }

    /// `docker <args>`; panics unless it succeeds.
    pub(crate) fn docker(&self, args: &[&str]) -> Output {
        let out = self.docker_out(args);
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// The container id of `service`.
    pub(crate) fn container(&self, service: &str) -> String {
        let out = self.compose(&["ps", "-q", service]);
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(!id.is_empty(), "no container for {service}");
        id
    }

    /// The compose network's name.
    pub(crate) fn network(&self) -> String {
        format!("{}_default", self.project)
    }

    /// `service`'s address on the compose network.
    fn ip(&self, service: &str) -> String {
        let format = format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            self.network()
        );
        let out = self.docker(&["inspect", "-f", &format, &self.container(service)]);
        let ip = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            !ip.is_empty(),
            "{service} has no address on {}",
            self.network()
        );
        ip
    }

    /// `host:port` of `node`'s HTTP API.
    pub(crate) fn http(&self, node: &str) -> String {
        format!("{}:8080", self.ip(node))
    }

    /// A client of the project's Redis.
    pub(crate) fn redis_client(&self) -> redis::Client {
        redis::Client::open(format!("redis://{}:6379", self.ip("redis"))).unwrap()
    }

    /// A connection to the project's Redis (waits up to 30 s for it to answer).
    pub(crate) async fn redis(&self) -> redis::aio::MultiplexedConnection {
        wait_for("the compose redis", Duration::from_secs(30), || async {
            self.redis_client()
                .get_multiplexed_async_connection()
                .await
                .ok()
        })
        .await
    }

    /// A connection to the project's PostgreSQL as its owner (the compose file's default
    /// password), waiting up to 30 s for it to answer.
    pub(crate) async fn postgres(&self) -> tokio_postgres::Client {
        let url = format!(
            "postgres://postgres:leasehold-admin@{}:5432/leasehold",
            self.ip("postgres")
        );
        wait_for("the compose postgres", Duration::from_secs(30), || async {
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .ok()?;
            tokio::spawn(conn);
            Some(client)
        })
        .await
    }

    /// Runs the `leasehold` binary under test on this machine.
    pub(crate) fn leasehold(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        cmd.args(args);
        let out = output_within(cmd);
        assert!(
            out.status.success(),
            "leasehold {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `docker exec` in `service`'s container.
    pub(crate) fn exec(&self, service: &str, args: &[&str]) -> Output {
        let mut all = vec!["exec", "-T", service];
        all.extend_from_slice(args);
        self.compose(&all)
    }

    /// Everything `service` logged so far.
    pub(crate) fn logs(&self, service: &str) -> String {
        let out = self.docker_out(&["logs", &self.container(service)]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for s in NODES {
                let logs = self.logs(s);
                let tail: Vec<&str> = logs.lines().rev().take(30).collect();
                eprintln!(
                    "--- {s} (last lines, newest first) ---\n{}",
                    tail.join("\n")
                );
            }
        }
        let mut cmd = self.command("docker-compose");
        cmd.args([
            "-f",
            "docker-compose.yml",
            "-f",
            "docker-compose.local.yml",
            "down",
            "-v",
            "--remove-orphans",
            "-t",
            "5",
        ]);
        let _ = output_within(cmd);
    }
}
