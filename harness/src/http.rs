//! A tiny HTTP/1.1 client for the host's API: one request per connection, JSON in and out.

use std::time::Duration;

/// One HTTP/1.1 request to `addr` (`host:port`), with an optional JSON body; returns the
/// status and the JSON body of the answer (a JSON string when the body is not JSON). 10 s
/// deadline.
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, serde_json::Value) {
    http_with(addr, method, path, body, None).await
}

/// [`http`] with an `Authorization` header.
pub async fn http_with(
    addr: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    authorization: Option<&str>,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        if let Some(a) = authorization {
            req.push_str(&format!("Authorization: {a}\r\n"));
        }
        if let Some(b) = body {
            req.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}",
                b.len()
            ));
        } else {
            req.push_str("Content-Length: 0\r\n\r\n");
        }
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        raw
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("HTTP request timed out");
    let text = String::from_utf8(raw).unwrap();
    let status: u16 = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    let json = serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_string()));
    (status, json)
}
