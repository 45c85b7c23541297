//! `leasehold status` and `leasehold health`: a small HTTP/1.1 client for a node's API, and
//! the status table.

use std::time::Duration;

use super::args::{HealthArgs, StatusArgs};

/// `GET path` on a node's HTTP API (plain HTTP/1.1): the status code and the body.
async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| anyhow::anyhow!("{addr} did not answer within 10s"))?
        .map_err(|e| anyhow::anyhow!("cannot reach the node's HTTP API at {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("{addr} sent no HTTP answer"))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{addr} sent no HTTP status"))?;
    Ok((code, body.to_string()))
}

pub(super) async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let (code, body) = http_get(&args.http, "/v1/status").await?;
    anyhow::ensure!(
        code == 200,
        "GET /v1/status on {} answered {code}: {body}",
        args.http
    );
    if args.json {
        println!("{body}");
        return Ok(());
    }
    let v: serde_json::Value = serde_json::from_str(&body)?;
    let s = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    println!("node {}", s(&v["node"]));
    let members = v["members"].as_array().cloned().unwrap_or_default();
    if !members.is_empty() {
        println!("members ({} live):", members.len());
        for m in &members {
            println!(
                "  {:<24} capacity {:<4} version {:<10} http {:<22} since {}",
                s(&m["node"]),
                s(&m["capacity"]),
                s(&m["version"]),
                s(&m["http"]),
                s(&m["since"])
            );
            let t = &m["tasks"];
            println!(
                "  {:<24} last heartbeat {}; tasks: {} slots, {} running, {} done, {} failed, {} reclaimed, {} refused",
                "",
                s(&m["seen"]),
                s(&t["slots"]),
                s(&t["running"]),
                s(&t["done"]),
                s(&t["failed"]),
                s(&t["reclaimed"]),
                s(&t["refused"])
            );
        }
    }
    println!(
        "{:<24} {:<10} {:<16} {:<18} {:>10}  {:<30} NEXT RUN",
        "JOB", "STATE", "LEADER", "TOKEN", "LEASE LEFT", "LAST RUN"
    );
    for j in v["jobs"].as_array().into_iter().flatten() {
        let left = j["lease_ms_left"]
            .as_u64()
            .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
            .unwrap_or_else(|| "-".into());
        let last = match &j["last_run"] {
            serde_json::Value::Null => "-".to_string(),
            r => format!("{} {}", s(&r["period"]), s(&r["status"])),
        };
        let next = match &j["next_run"] {
            serde_json::Value::Null => "-".to_string(),
            r => format!("{} at {}", s(&r["period"]), s(&r["at"])),
        };
        let state = if j["paused"] == true {
            format!("{} (paused)", s(&j["state"]))
        } else {
            s(&j["state"])
        };
        println!(
            "{:<24} {:<10} {:<16} {:<18} {:>10}  {:<30} {}",
            s(&j["job"]),
            state,
            s(&j["leader"]),
            s(&j["token"]),
            left,
            last,
            next
        );
        for r in j["open_runs"].as_array().into_iter().flatten() {
            let t = &r["tasks"];
            let tasks = if t.is_null() {
                String::new()
            } else {
                format!(
                    "; {} tasks: {} done, {} running, {} queued, {} failed",
                    s(&t["total"]),
                    s(&t["done"]),
                    s(&t["running"]),
                    s(&t["queued"]),
                    s(&t["failed"])
                )
            };
            println!(
                "  open run {} {} (step {}, attempt {}, node {}){tasks}",
                s(&r["period"]),
                s(&r["status"]),
                s(&r["step"]),
                s(&r["attempt"]),
                s(&r["node"])
            );
        }
    }
    for file in v["compiling"].as_array().cloned().unwrap_or_default() {
        println!("compiling: {} (served once loaded)", s(&file));
    }
    let refused = v["refused"].as_array().cloned().unwrap_or_default();
    if !refused.is_empty() {
        println!("refused files:");
        for r in refused {
            println!("  {}: {}", s(&r["file"]), s(&r["reason"]));
        }
    }
    Ok(())
}

/// The address to ask for a listen address: an unspecified IP (`0.0.0.0`, `[::]`) is reached
/// on the loopback address of its family; anything else (a name, a real address) as given.
fn reachable(listen: &str) -> String {
    match listen.parse::<std::net::SocketAddr>() {
        Ok(mut a) if a.ip().is_unspecified() => {
            a.set_ip(match a.ip() {
                std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
            a.to_string()
        }
        _ => listen.to_string(),
    }
}

pub(super) async fn health(args: HealthArgs) -> anyhow::Result<()> {
    let addr = reachable(&args.http);
    let path = if args.ready { "/readyz" } else { "/healthz" };
    let (code, body) = http_get(&addr, path).await?;
    anyhow::ensure!(code == 200, "{path} answered {code}: {}", body.trim());
    println!("{}", body.trim());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::reachable;

    #[test]
    fn only_unspecified_addresses_become_loopback() {
        assert_eq!(reachable("0.0.0.0:8080"), "127.0.0.1:8080");
        assert_eq!(reachable("[::]:8080"), "[::1]:8080");
        assert_eq!(reachable("10.0.0.0:8080"), "10.0.0.0:8080");
        assert_eq!(reachable("node-a:8080"), "node-a:8080");
    }
}
