//! The operator console (`/ui`) over HTTP, against three real replicas: every node shows the
//! cluster (members, leaders, terms), actions need a session of that node and the session's
//! CSRF token (a refused action changes nothing in Redis), hostile text from a guest is
//! escaped, and the pages follow a leader's crash.

use std::time::Duration;

use redis::AsyncCommands;
use serde_json::Value;

use crate::harness::*;

const TOKEN: &str = "console-s3cret";

/// An HTTP answer: status, raw header block, body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    /// The values of header `name` (case-insensitive).
    fn header(&self, name: &str) -> Vec<String> {
        self.head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_string())
            .collect()
    }
}

/// One HTTP/1.1 request with extra `headers` and, if any, a form body; 10 s deadline.
async fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    form: Option<&str>,
) -> Answer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        let body = form.unwrap_or("");
        if form.is_some() {
            req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
        }
        req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        String::from_utf8(raw).unwrap()
    };
    let text = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("HTTP request timed out");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap();
    Answer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

/// Three replicas serving the ticker and the probe (mode `hostile`: its error and stderr are
/// markup), each with the console and the token.
pub(crate) struct Console {
    pub redis: RedisServer,
    pub _dir: TempDir,
    pub hosts: Vec<HostProcess>,
    /// Each host's HTTP address.
    pub http: Vec<String>,
}

impl Console {
    pub(crate) async fn start(name: &str) -> Console {
        let redis = RedisServer::start().await;
        let dir = TempDir::new(name);
        let (jobs, data) = (dir.join("jobs"), dir.join("data"));
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::create_dir_all(data.join("probe")).unwrap();
        std::fs::write(data.join("probe/mode"), "hostile").unwrap();
        for g in ["ticker", "probe"] {
            std::fs::copy(guests().wasm(g), jobs.join(format!("{g}.wasm"))).unwrap();
        }
        // A file no host can load: listed as refused, with why.
        std::fs::write(jobs.join("broken.wasm"), b"not wasm").unwrap();
        // One attempt: the hostile run fails at once.
        std::fs::write(jobs.join("probe.toml"), "[retry]\nattempts = 1\n").unwrap();
        let mut hosts = Vec::new();
        let mut http = Vec::new();
        for i in 0..3 {
            let node = format!("n{i}");
            let host = start_host_with_env(
                &[
                    "run",
                    "--redis-url",
                    &redis.url(),
                    "--jobs-dir",
                    jobs.to_str().unwrap(),
                    "--data-dir",
                    data.to_str().unwrap(),
                    "--node-id",
                    &node,
                    "--lease-ttl",
                    "2s",
                    "--heartbeat",
                    "500ms",
                    "--http",
                    "127.0.0.1:0",
                ],
                &[("LEASEHOLD_HTTP_TOKEN", TOKEN)],
            );
            hosts.push(host);
        }
        for h in &hosts {
            http.push(h.http_addr(Duration::from_secs(60)).await);
        }
        for addr in &http {
            wait_for(
                "the node to serve both jobs",
                Duration::from_secs(60),
                || async {
                    let (code, body) = crate::harness::http(addr, "GET", "/v1/jobs", None).await;
                    (code == 200 && body["jobs"].as_array().is_some_and(|j| j.len() == 2))
                        .then_some(())
                },
            )
            .await;
        }
        Console {
            redis,
            _dir: dir,
            hosts,
            http,
        }
    }

    /// The node whose term holds `job`'s lease, once one does.
    /// The node leading `job` once it is the job's preferred member (balancing hands a job to
    /// it shortly after start, so an earlier holder would be a moment's).
    pub(crate) async fn settled_leader(&self, job: &str) -> String {
        let want = crate::harness::preferred_node(job, self.hosts.len());
        wait_for(
            "the preferred member to lead",
            Duration::from_secs(120),
            || async {
                let leader = self.leader(job).await;
                (leader == want).then_some(leader)
            },
        )
        .await
    }

    pub(crate) async fn leader(&self, job: &str) -> String {
        wait_for("a leader", Duration::from_secs(30), || async {
            let owner: Option<String> = self
                .redis
                .conn()
                .await
                .get(format!("lh:{{{job}}}:lease"))
                .await
                .ok()
                .flatten();
            owner.map(|o| o.split(':').next().unwrap().to_string())
        })
        .await
    }

    /// Signs in on host `i`: the session cookie (`name=value`).
    pub(crate) async fn sign_in(&self, i: usize) -> String {
        let a = request(
            &self.http[i],
            "POST",
            "/ui/signin",
            &[],
            Some(&format!("token={TOKEN}")),
        )
        .await;
        assert_eq!(a.status, 303, "{}", a.body);
        let cookie = a.header("set-cookie").pop().expect("a session cookie");
        assert!(
            cookie.starts_with(&format!("lh_session_n{i}="))
                && cookie.contains("HttpOnly")
                && cookie.contains("SameSite=Strict"),
            "{cookie}"
        );
        cookie.split(';').next().unwrap().to_string()
    }
}

/// The CSRF token in a page's forms.
fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    page[at..].split('"').next().unwrap().to_string()
}

/// What Redis holds of an operator's requests and pause flags for `job`.
async fn operator_state(redis: &RedisServer, job: &str) -> (bool, bool) {
    let mut c = redis.conn().await;
    let requested: bool = c.exists(format!("lh:{{{job}}}:requested")).await.unwrap();
    let paused: bool = c.exists(format!("lh:{{{job}}}:paused")).await.unwrap();
    (requested, paused)
}

#[tokio::test]
async fn every_node_shows_the_cluster_and_actions_need_its_session_and_csrf() {
    deadline(Duration::from_secs(240), async {
        let c = Console::start("console").await;
        let leader = c.settled_leader("ticker").await;
        // Every node's overview shows the three members and the ticker's leader.
        for addr in &c.http {
            let a = wait_for(
                "the overview to show the leader",
                Duration::from_secs(20),
                || async {
                    let a = request(addr, "GET", "/ui", &[], None).await;
                    (a.status == 200 && a.body.contains(&format!("<td>{leader}</td>"))).then_some(a)
                },
            )
            .await;
            for n in ["n0", "n1", "n2"] {
                assert!(a.body.contains(&format!("<td>{n}</td>")), "{n} missing");
            }
            let csp = a.header("content-security-policy").join(" ");
            assert!(
                csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
                "{csp}"
            );
            assert!(!a.body.contains("name=\"csrf\""), "no forms before sign-in");
            let refused = a
                .body
                .split("<h2>Refused files</h2>")
                .nth(1)
                .unwrap_or_default();
            assert!(
                refused.contains("broken.wasm"),
                "the refused file is not listed"
            );
        }
        // Refused: no session; a wrong token; a session of another node; no CSRF token.
        for act in [
            "action=pause&csrf=",
            "action=trigger&period=2019-06-01&csrf=",
        ] {
            let a = request(&c.http[0], "POST", "/ui/jobs/probe/act", &[], Some(act)).await;
            assert_eq!(a.status, 403, "{act}: {}", a.body);
        }
        let a = request(&c.http[0], "POST", "/ui/signin", &[], Some("token=wrong")).await;
        assert_eq!((a.status, a.header("set-cookie").len()), (401, 0));
        let other = c.sign_in(1).await;
        let ours = c.sign_in(0).await;
        let page = request(
            &c.http[0],
            "GET",
            "/ui/jobs/probe",
            &[("Cookie", &ours)],
            None,
        )
        .await;
        let csrf = csrf_of(&page.body);
        let both = format!("{other}; {ours}");
        for action in ["action=pause", "action=trigger&period=2019-06-01"] {
            for (cookie, form) in [
                (other.as_str(), format!("{action}&csrf={csrf}")),
                (ours.as_str(), action.to_string()),
                (ours.as_str(), format!("{action}&csrf=0000")),
            ] {
                let a = request(
                    &c.http[0],
                    "POST",
                    "/ui/jobs/probe/act",
                    &[("Cookie", cookie)],
                    Some(&form),
                )
                .await;
                assert_eq!(a.status, 403, "{form}: {}", a.body);
            }
            let cross = request(
                &c.http[0],
                "POST",
                "/ui/jobs/probe/act",
                &[("Cookie", &ours), ("Sec-Fetch-Site", "cross-site")],
                Some(&format!("{action}&csrf={csrf}")),
            )
            .await;
            assert_eq!(cross.status, 403, "{action} from another site");
        }
        assert_eq!(
            operator_state(&c.redis, "probe").await,
            (false, false),
            "a refused action changed Redis"
        );

        // With the session and its token: pause, resume, trigger.
        let post = |form: String| {
            let (addr, cookie) = (c.http[0].clone(), both.clone());
            async move {
                request(
                    &addr,
                    "POST",
                    "/ui/jobs/probe/act",
                    &[("Cookie", &cookie)],
                    Some(&form),
                )
                .await
            }
        };
        let a = post(format!("action=pause&csrf={csrf}")).await;
        assert_eq!(a.status, 303);
        assert!(operator_state(&c.redis, "probe").await.1, "paused");
        let a = post(format!("action=resume&csrf={csrf}")).await;
        assert_eq!(a.status, 303);
        assert!(!operator_state(&c.redis, "probe").await.1, "not paused");
        // The probe's own period ran (and failed) when it was first led: the trigger re-runs
        // it as the next attempt.
        let newest = || async {
            let (_, runs) =
                crate::harness::http(&c.http[1], "GET", "/v1/jobs/probe/runs", None).await;
            let r = &runs["runs"][0];
            (r["attempt"].as_u64().unwrap_or(0), r["status"] == "failed")
        };
        let before = wait_for("the first run to fail", Duration::from_secs(60), || async {
            let (attempt, failed) = newest().await;
            failed.then_some(attempt)
        })
        .await;
        let a = post(format!("action=trigger&period=&csrf={csrf}")).await;
        assert_eq!(a.status, 303, "{}", a.body);
        let to = a.header("location").pop().unwrap();
        assert!(to.starts_with("/ui/jobs/probe?said="), "{to}");

        // The hostile run fails; its error is shown as text on every node.
        wait_for(
            "the triggered attempt to fail",
            Duration::from_secs(60),
            || async {
                let (attempt, failed) = newest().await;
                (attempt > before && failed).then_some(())
            },
        )
        .await;
        // Its stderr is in the record, a field of its own.
        let (_, runs) = crate::harness::http(&c.http[2], "GET", "/v1/jobs/probe/runs", None).await;
        let stderr = runs["runs"][0]["stderr"].as_str().unwrap_or_default();
        assert!(
            stderr.starts_with("<script>document.title="),
            "{}",
            runs["runs"][0]
        );
        for addr in &c.http {
            let page = request(addr, "GET", "/ui/jobs/probe", &[], None).await;
            assert_eq!(page.status, 200);
            assert!(
                page.body.contains("&lt;script&gt;document.title="),
                "the error is not shown"
            );
            assert!(
                page.body.contains("&quot;&gt;&lt;img src=x onerror="),
                "the breakout is not shown"
            );
            assert!(
                page.body
                    .contains("<pre class=\"stderr\">&lt;script&gt;document.title="),
                "the stderr tail is not shown"
            );
            for raw in ["<script>document", "<img", "onerror=\""] {
                assert!(
                    !page.body.contains(raw),
                    "{raw:?} reached the page unescaped"
                );
            }
        }
        // Signed in, the failed run offers a re-run.
        let page = request(
            &c.http[0],
            "GET",
            "/ui/jobs/probe",
            &[("Cookie", &ours)],
            None,
        )
        .await;
        assert!(
            page.body.contains(">Re-run</button>"),
            "no re-run for the failed run"
        );

        // The term history, as JSON and on the leadership page.
        let (code, terms) =
            crate::harness::http(&c.http[2], "GET", "/v1/jobs/ticker/terms", None).await;
        assert_eq!(code, 200);
        assert_eq!(
            terms["terms"][0]["node"],
            Value::String(leader.clone()),
            "{terms}"
        );
        assert_eq!(terms["terms"][0]["end"], Value::Null, "{terms}");

        // The token was never logged by any node.
        for h in &c.hosts {
            assert!(
                h.log_lines_with(TOKEN).is_empty(),
                "the token is in a log line"
            );
        }
        // Signing out ends the session: its forms are refused.
        let a = request(
            &c.http[0],
            "POST",
            "/ui/signout",
            &[("Cookie", &ours)],
            Some(&format!("csrf={csrf}")),
        )
        .await;
        assert_eq!(a.status, 303);
        let a = post(format!("action=pause&csrf={csrf}")).await;
        assert_eq!(a.status, 403);
        assert!(!operator_state(&c.redis, "probe").await.1, "not paused");
    })
    .await;
}

#[tokio::test]
async fn the_pages_follow_a_crashed_leader_to_its_successor() {
    deadline(Duration::from_secs(180), async {
        let mut c = Console::start("console-crash").await;
        let leader = c.settled_leader("ticker").await;
        let i: usize = leader[1..].parse().unwrap();
        let killed: Value = crate::harness::http(&c.http[i], "GET", "/v1/jobs/ticker/terms", None)
            .await
            .1;
        let killed = killed["terms"][0]["token"].as_u64().unwrap();
        c.hosts[i].kill();
        let watcher = c.http[(i + 1) % 3].clone();
        let successor = wait_for(
            "the overview to show a new leader",
            Duration::from_secs(20),
            || async {
                let next = c.leader("ticker").await;
                let page = request(&watcher, "GET", "/ui", &[], None).await;
                (next != leader && page.body.contains(&format!("<td>{next}</td>"))).then_some(next)
            },
        )
        .await;
        // The leadership page shows the killed term as crashed and the new one leading.
        let page = wait_for(
            "the leadership page to show the crash",
            Duration::from_secs(20),
            || async {
                let p = request(&watcher, "GET", "/ui/leadership?q=ticker", &[], None).await;
                p.body
                    .contains(&format!("<td>{killed}</td><td>{leader}</td>"))
                    .then_some(p)
            },
        )
        .await;
        let row = page
            .body
            .split(&format!("<td>{killed}</td>"))
            .nth(1)
            .unwrap();
        let row = row.split("</tr>").next().unwrap();
        assert!(row.contains("s-crashed"), "{row}");
        assert!(page.body.contains(&format!("<td>{successor}</td>")));
        // `leasehold runs --terms` shows the same history.
        let out = run_leasehold(&["runs", "ticker", "--terms", "--redis-url", &c.redis.url()]);
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with(&killed.to_string()))
            .unwrap_or_else(|| panic!("term {killed} missing: {text}"));
        assert!(
            line.contains(&leader) && line.ends_with("crashed"),
            "{line}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_job_only_another_member_serves_is_listed_and_shown_from_redis() {
    deadline(Duration::from_secs(180), async {
        let c = Console::start("console-elsewhere").await;
        // A fourth member with a directory of its own: one job, `solo`, that no other serves.
        let dir = TempDir::new("console-solo");
        let jobs = dir.join("jobs");
        std::fs::create_dir_all(&jobs).unwrap();
        std::fs::copy(guests().wasm("ticker"), jobs.join("solo.wasm")).unwrap();
        std::fs::write(jobs.join("solo.toml"), "name = \"solo\"\n").unwrap();
        let mut solo = start_host_with_env(
            &[
                "run",
                "--redis-url",
                &c.redis.url(),
                "--jobs-dir",
                jobs.to_str().unwrap(),
                "--node-id",
                "n3",
                "--lease-ttl",
                "2s",
                "--heartbeat",
                "500ms",
            ],
            &[],
        );
        assert_eq!(c.leader("solo").await, "n3");
        // n0 lists it, led by n3, as served elsewhere; the role filter finds it alone.
        let row = wait_for(
            "n0's overview to list solo",
            Duration::from_secs(20),
            || async {
                let a = request(&c.http[0], "GET", "/ui?role=elsewhere", &[], None).await;
                let row = a
                    .body
                    .split("/ui/jobs/solo\">")
                    .nth(1)?
                    .split("</tr>")
                    .next()?;
                row.contains("<td>n3</td>")
                    .then(|| (a.body.clone(), row.to_string()))
            },
        )
        .await;
        assert!(row.1.contains("s-elsewhere"), "{}", row.1);
        assert!(
            !row.0.contains("/ui/jobs/ticker"),
            "the filter let a job of n0's own through"
        );
        assert!(row.0.contains(">1 jobs · page 1 of 1<"), "one job matched");
        // Its page on n0: what Redis has (leader, terms), who serves it, and no action.
        let signed = c.sign_in(0).await;
        let page = request(
            &c.http[0],
            "GET",
            "/ui/jobs/solo",
            &[("Cookie", &signed)],
            None,
        )
        .await;
        assert_eq!(page.status, 200, "{}", page.body);
        assert!(
            page.body
                .contains("Not served by this node. Served by: n3;"),
            "{}",
            page.body
        );
        assert!(
            page.body.contains("class=\"badge s-leading\""),
            "its open term is shown"
        );
        assert!(
            !page.body.contains("id=\"trigger\""),
            "an action offered for another's job"
        );
        // A job nobody serves is still not found.
        let a = request(&c.http[0], "GET", "/ui/jobs/nobody", &[], None).await;
        assert_eq!(a.status, 404);
        // Once n3 has left, n0 lists it no more.
        assert!(solo.terminate(Duration::from_secs(30)).await);
        wait_for(
            "solo to leave n0's overview",
            Duration::from_secs(20),
            || async {
                let a = request(&c.http[0], "GET", "/ui", &[], None).await;
                (a.status == 200 && !a.body.contains("/ui/jobs/solo")).then_some(())
            },
        )
        .await;
    })
    .await;
}
