//! README "Compose quick start", run as written: the `console` block under that heading is
//! read from README.md, each `$ ` command is run with bash in the repository's root, in order,
//! and what the README shows under a command must appear in its output.
//!
//! How the shown output is compared: line by line, in order, each shown line matching one
//! output line; runs of spaces match any run of spaces, and `…` matches anything (names that
//! depend on the clone's directory, times, tokens). A command whose shown output has not
//! appeared yet is run again until it does (up to 120 s): every command in the block can be
//! repeated (`up -d` and `down` are idempotent, a trigger of a requested period is answered
//! with the same run), and an operator waits the same way for containers to become healthy.
//! `export NAME=VALUE` lines are evaluated once, so that later commands see the same value.

use std::process::Command;
use std::time::{Duration, Instant};

use leasehold_harness::{deadline, output_in, output_within, repo_root};

/// One `$ ` command of the block and the output shown under it.
#[derive(Debug)]
struct Step {
    command: String,
    shown: Vec<String>,
}

/// The steps of the `console` block under the heading `### Compose quick start`.
fn quick_start(readme: &str) -> Vec<Step> {
    let section = readme
        .split("### Compose quick start")
        .nth(1)
        .expect("README has a \"Compose quick start\" section");
    let block = section
        .split("```console\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("the section has a console block");
    let mut steps: Vec<Step> = Vec::new();
    let mut continued = false;
    for line in block.lines() {
        if continued {
            let step = steps.last_mut().unwrap();
            step.command.push('\n');
            step.command.push_str(line);
        } else if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_string(),
                shown: Vec::new(),
            });
        } else if !line.trim().is_empty() {
            steps
                .last_mut()
                .expect("output shown before any command")
                .shown
                .push(line.to_string());
        }
        continued = line.ends_with('\\');
    }
    steps
}

/// `line` with every run of whitespace made one space, trimmed.
fn squeeze(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether output line `actual` matches shown line `shown` (`…` matches anything).
fn matches(shown: &str, actual: &str) -> bool {
    let (shown, actual) = (squeeze(shown), squeeze(actual));
    let parts: Vec<String> = shown.split('…').map(|p| p.trim().to_string()).collect();
    let mut rest = actual.as_str();
    for (i, part) in parts.iter().enumerate() {
        let last = i == parts.len() - 1;
        if i == 0 && !part.is_empty() {
            let Some(r) = rest.strip_prefix(part.as_str()) else {
                return false;
            };
            rest = r;
        } else if last && !part.is_empty() {
            return rest.ends_with(part.as_str()) && (parts.len() > 1 || rest == part);
        } else if !part.is_empty() {
            let Some(at) = rest.find(part.as_str()) else {
                return false;
            };
            rest = &rest[at + part.len()..];
        }
    }
    // A shown line without `…` must be the whole line.
    parts.len() > 1 || rest.is_empty()
}

/// Whether every shown line matches an output line, in order.
fn shown_in(shown: &[String], output: &str) -> bool {
    let mut lines = output.lines();
    shown
        .iter()
        .all(|s| lines.by_ref().any(|line| matches(s, line)))
}

#[test]
fn the_matcher_reads_shown_output_as_the_readme_explains() {
    assert!(!matches(
        "…node-a_1 leasehold …",
        "main_node-a_1 /usr/local/bin/leasehold r ..."
    ));
    assert!(matches(
        "…node-a_1 …Up (healthy) 0.0.0.0:8081->8080/tcp…",
        "main_node-a_1   /usr/local/bin/leasehold r ...   Up (healthy)   0.0.0.0:8081->8080/tcp, :::8081"
    ));
    assert!(matches("node node-a", "node   node-a"));
    assert!(!matches("node node-a", "node node-a and more"));
    assert!(!matches("node node-b", "node node-a"));
    assert!(matches("done …", "done 2026-11-27"));
    assert!(!matches("done …", "run done"));
    assert!(shown_in(&["a".into(), "c…".into()], "a\nb\ncd\n"));
    assert!(!shown_in(&["c…".into(), "a".into()], "a\nb\ncd\n"));
    let steps =
        quick_start("### Compose quick start\n```console\n$ echo a \\\n  b\na b\n$ true\n```\n");
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].command, "echo a \\\n  b");
    assert_eq!(steps[0].shown, ["a b"]);
}

#[tokio::test]
#[ignore = "container tier: needs Docker and ./dev images (./dev test runs it)"]
async fn the_readme_compose_quick_start_works_as_written() {
    let root = repo_root();
    let steps = quick_start(&std::fs::read_to_string(root.join("README.md")).unwrap());
    assert!(
        steps.iter().any(|s| s.command.contains("down")),
        "the quick start ends by taking the project down"
    );
    // Whatever happens, the project is taken down at the end (as its last command does).
    struct Down(Vec<(String, String)>);
    impl Drop for Down {
        fn drop(&mut self) {
            let mut cmd = Command::new("docker-compose");
            cmd.current_dir(repo_root())
                .envs(self.0.iter().cloned())
                .args(["down", "-v", "-t", "5"]);
            let _ = output_within(cmd);
        }
    }
    let mut down = Down(Vec::new());
    deadline(Duration::from_secs(900), async {
        for step in &steps {
            if let Some(assignment) = step.command.strip_prefix("export ") {
                let (name, value) = assignment.split_once('=').expect("export NAME=VALUE");
                let mut cmd = Command::new("bash");
                cmd.current_dir(&root)
                    .envs(down.0.iter().cloned())
                    .args(["-c", &format!("printf %s {value}")]);
                let out = output_within(cmd);
                assert!(out.status.success(), "{}", step.command);
                let value = String::from_utf8(out.stdout).unwrap();
                eprintln!("$ {} ({name} set)", step.command);
                down.0.push((name.to_string(), value));
                continue;
            }
            let started = Instant::now();
            loop {
                let mut cmd = Command::new("bash");
                cmd.current_dir(&root).envs(down.0.iter().cloned()).args([
                    "-o",
                    "pipefail",
                    "-c",
                    &step.command,
                ]);
                // `./dev images` may make the base image (debootstrap): minutes.
                let out = output_in(cmd, Duration::from_secs(600));
                let output = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                if out.status.success() && shown_in(&step.shown, &output) {
                    eprintln!("$ {}\n{output}", step.command);
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "README quick start: `{}` ({}) did not show\n{}\nit printed:\n{output}",
                    step.command,
                    out.status,
                    step.shown.join("\n")
                );
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    })
    .await;
}
