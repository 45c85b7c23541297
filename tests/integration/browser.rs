//! The console in a real browser: headless Chromium from Debian's packages, driven through
//! `chromedriver` (WebDriver, the `fantoccini` client) against three real replicas
//! ([`crate::console::Console`]). The page follows a crashed leader without a reload; signing
//! in and triggering from the page starts the run; the hostile guest's markup renders as text
//! and runs nothing; the keyboard reaches every action. Each test saves screenshots under
//! `target/console-screenshots/`.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::console::Console;
use crate::harness::*;

/// WebDriver's key code for Tab.
/// The WebDriver key code of Tab.
const TAB: char = '\u{E004}';

/// A `chromedriver` of its own on a free port and one headless Chromium session through it;
/// both are stopped on drop.
struct Browser {
    driver: Child,
    client: Option<Client>,
}

impl Browser {
    async fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // A process group of its own: the Chromium it starts is in it too, and goes with it.
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("chromedriver (Debian's chromium-driver; ./dev setup installs it)");
        let mut browser = Browser {
            driver,
            client: None,
        };
        // Debian's /usr/bin/chromium is a wrapper script; the browser itself is under lib.
        let binary = ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("chromium (./dev setup installs it)");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": binary,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let client = wait_for(
            "chromedriver to start a session",
            Duration::from_secs(60),
            || {
                let (caps, url) = (caps.clone(), url.clone());
                async move {
                    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                        .capabilities(caps)
                        .connect(&url)
                        .await
                        .ok()
                }
            },
        )
        .await;
        browser.client = Some(client);
        browser
    }

    fn c(&self) -> &Client {
        self.client.as_ref().unwrap()
    }

    /// The text of the page's `<main>`.
    async fn main_text(&self) -> String {
        match self.c().find(Locator::Css("main")).await {
            Ok(e) => e.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Waits until `<main>` shows `needle` (the page updating itself: no reload is asked for).
    async fn wait_text(&self, what: &str, needle: &str, limit: Duration) -> String {
        wait_for(what, limit, || async {
            let t = self.main_text().await;
            t.contains(needle).then_some(t)
        })
        .await
    }

    /// Saves a screenshot as `target/console-screenshots/<name>.png`.
    async fn screenshot(&self, name: &str) {
        let png = self.c().screenshot().await.unwrap();
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| repo_root().join("target"))
            .join("console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// Runs `script` in the page and returns what it returns.
    async fn js(&self, script: &str) -> Value {
        self.c().execute(script, vec![]).await.unwrap()
    }

    /// Presses and releases `key` as a keyboard does: on whatever element has the focus.
    async fn press(&self, key: char) {
        let keys = KeyActions::new("keyboard".into())
            .then(KeyAction::Down { value: key })
            .then(KeyAction::Up { value: key });
        self.c().perform_actions(keys).await.unwrap();
    }
}

impl Drop for Browser {
    /// Kills chromedriver's whole process group: killing chromedriver alone leaves its
    /// Chromium running, reparented, long after the test (two browsers of about 500 MB each
    /// per `./dev test`, found still running).
    fn drop(&mut self) {
        let group = format!("-{}", self.driver.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[tokio::test]
async fn the_open_overview_follows_a_crashed_leader_without_a_reload() {
    deadline(Duration::from_secs(240), async {
        let mut c = Console::start("browser-crash").await;
        let b = Browser::start().await;
        let leader = c.settled_leader("ticker").await;
        let i: usize = leader[1..].parse().unwrap();
        let watcher = (i + 1) % 3;
        b.c()
            .goto(&format!("http://{}/ui", c.http[watcher]))
            .await
            .unwrap();
        let text = b
            .wait_text("the overview", "Members", Duration::from_secs(20))
            .await;
        for n in ["n0", "n1", "n2"] {
            assert!(text.contains(n), "{n} is not among the members: {text}");
        }
        // A mark in the page: a reload would clear it.
        b.js("window.leaseholdMark = 42; return true;").await;
        let row = |text: &str| {
            text.lines()
                .find(|l| l.starts_with("ticker"))
                .unwrap_or_default()
                .to_string()
        };
        assert!(row(&text).contains(&leader), "{}", row(&text));
        b.screenshot("overview").await;
        // The newest term, as the watcher's API has it: (node, token).
        let newest = || async {
            let (_, t) = http(&c.http[watcher], "GET", "/v1/jobs/ticker/terms", None).await;
            let t = &t["terms"][0];
            (
                t["node"].as_str().unwrap_or_default().to_string(),
                t["token"].as_u64().unwrap_or(0),
            )
        };
        let (was, old_token) = newest().await;
        assert_eq!(was, leader, "the newest term is not the leader's");
        assert!(
            row(&text).contains(&old_token.to_string()),
            "{}",
            row(&text)
        );
        c.hosts[i].kill();
        // TTL 2 s: the page shows the successor and its term's token within TTL plus a few
        // seconds (the limit is generous for a loaded machine: WebDriver calls are slow).
        wait_for(
            "the page to show a new leader and its token",
            Duration::from_secs(20),
            || async {
                let r = row(&b.main_text().await);
                let (now, token) = newest().await;
                (now != leader
                    && token > old_token
                    && r.contains(&now)
                    && r.contains(&token.to_string()))
                .then_some(())
            },
        )
        .await;
        assert_eq!(
            b.js("return window.leaseholdMark").await,
            json!(42),
            "the page was reloaded"
        );
        b.c()
            .goto(&format!(
                "http://{}/ui/leadership?q=ticker",
                c.http[watcher]
            ))
            .await
            .unwrap();
        b.wait_text(
            "the killed term as crashed",
            "crashed",
            Duration::from_secs(20),
        )
        .await;
        b.screenshot("leadership").await;
        // The ticker's page: its runs as a timeline, each with the terms that ran it.
        b.c()
            .goto(&format!("http://{}/ui/jobs/ticker", c.http[watcher]))
            .await
            .unwrap();
        b.wait_text("the ticker's runs", "done", Duration::from_secs(20))
            .await;
        let cells = b
            .js("return document.querySelectorAll('.timeline .cell.s-done').length")
            .await;
        assert!(cells.as_u64().unwrap() > 0, "no run in the timeline");
        b.screenshot("timeline").await;
    })
    .await;
}

#[tokio::test]
async fn signed_in_the_page_triggers_runs_shows_hostile_text_as_text_and_every_action_is_reachable_by_keyboard()
 {
    deadline(Duration::from_secs(300), async {
        let c = Console::start("browser-act").await;
        let b = Browser::start().await;
        let base = format!("http://{}", c.http[0]);
        // Read-only before sign-in: no form offers an action.
        b.c().goto(&format!("{base}/ui/jobs/probe")).await.unwrap();
        b.wait_text("the job page", "Sign in to trigger", Duration::from_secs(20)).await;
        assert!(b.c().find_all(Locator::Css("main button")).await.unwrap().is_empty());
        // Sign in through the form.
        b.c().goto(&format!("{base}/ui/signin")).await.unwrap();
        let field = b.c().find(Locator::Id("token")).await.unwrap();
        field.send_keys("console-s3cret").await.unwrap();
        b.c().find(Locator::Id("signin")).await.unwrap().click().await.unwrap();
        b.wait_text("the overview after sign-in", "Members", Duration::from_secs(20)).await;
        assert!(b.c().find(Locator::Css("header form button")).await.is_ok(), "no sign-out: not signed in");
        // The session cookie is not readable by script.
        let cookies = b.js("return document.cookie").await;
        assert!(!cookies.as_str().unwrap_or("").contains("lh_session"), "{cookies}");

        // Trigger the probe from its page: the run appears and fails with its hostile error.
        let attempt = || async {
            let (_, runs) = http(&c.http[1], "GET", "/v1/jobs/probe/runs", None).await;
            let r = &runs["runs"][0];
            (r["attempt"].as_u64().unwrap_or(0), r["status"].clone())
        };
        let (before, _) = attempt().await;
        b.c().goto(&format!("{base}/ui/jobs/probe")).await.unwrap();
        b.c().find(Locator::Id("trigger")).await.unwrap().click().await.unwrap();
        b.wait_text("the trigger's answer", "requested", Duration::from_secs(20)).await;
        wait_for("the triggered attempt to fail", Duration::from_secs(60), || async {
            let (now, status) = attempt().await;
            (now > before && status == "failed").then_some(())
        })
        .await;
        let text = b.wait_text("the failed run", "<script>document.title", Duration::from_secs(60)).await;
        assert!(text.contains("onerror="), "{text}");
        // Markup from the guest is text: no script ran, no element was made of it.
        assert_ne!(b.js("return document.title").await, json!("pwned"));
        assert_eq!(b.js("return document.querySelectorAll('main img, main script').length").await, json!(0));
        let overflow = b.js("return document.documentElement.scrollWidth <= window.innerWidth + 1").await;
        assert_eq!(overflow, json!(true), "a long unbroken line widened the page");
        b.screenshot("job").await;

        // Keyboard: Tab from the top reaches the period field and every action's button.
        let want = ["period", "trigger", "pause", "resume"];
        b.wait_text("the re-run button", "Re-run", Duration::from_secs(20)).await;
        let mut reached = std::collections::BTreeSet::new();
        b.js("document.activeElement && document.activeElement.blur(); window.scrollTo(0, 0); return true;").await;
        for _ in 0..60 {
            // Pressed on the page, not sent to an element: the live section is swapped every
            // second, so an element looked up first may be gone by the time keys reach it.
            b.press(TAB).await;
            let focused = b.js("var e = document.activeElement; return e ? (e.id || e.textContent.trim()) : ''").await;
            if let Some(f) = focused.as_str() {
                reached.insert(f.to_string());
            }
        }
        for id in want {
            assert!(reached.contains(id), "Tab never reached {id}: {reached:?}");
        }
        assert!(
            reached.iter().any(|r| r.starts_with("rerun-")),
            "Tab never reached a re-run: {reached:?}"
        );
        assert!(reached.contains("Sign out"), "{reached:?}");

        // Re-run the failed period from its button: a new attempt of it starts.
        let (before, _) = attempt().await;
        b.js("document.querySelector(\"button[id^='rerun-']\").click(); return true;")
            .await;
        b.wait_text("the re-run's answer", "requested", Duration::from_secs(20))
            .await;
        wait_for("the re-run's attempt", Duration::from_secs(60), || async {
            let (now, _) = attempt().await;
            (now > before).then_some(())
        })
        .await;
    })
    .await;
}
