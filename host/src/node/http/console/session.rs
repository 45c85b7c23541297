//! Console sign-in: sessions, their cookie, and the CSRF token every form carries.
//!
//! **Model.** Signing in posts the node's `--http-token` in a form body (never a URL, never
//! logged); the node compares it in constant time and, when it matches, keeps a session in
//! memory (a random id, a random CSRF token, an expiry) and sets the id in a cookie that is
//! `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page sends it) and
//! `Path=/ui`. Cookies ignore ports, so several nodes on one host would see each other's: the
//! cookie's name carries this node's id, and the id is known only to the node that issued it
//! (a restart forgets every session). Every form that changes state carries the session's
//! CSRF token in a hidden field, compared in constant time; an action without a session or
//! without the token is refused and changes nothing. Without a configured token nobody can
//! sign in and the pages stay read-only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;

/// How long a session lasts after sign-in.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// The most sessions a node keeps (the oldest are dropped first).
const MAX_SESSIONS: usize = 256;

/// The sessions this node issued.
#[derive(Clone, Default)]
pub(crate) struct Sessions {
    inner: Arc<Mutex<HashMap<String, Session>>>,
}

#[derive(Clone)]
struct Session {
    csrf: String,
    expires: Instant,
}

/// A signed-in visitor.
pub(crate) struct SignedIn {
    /// The session's id (the cookie's value).
    pub id: String,
    /// The session's CSRF token.
    pub csrf: String,
}

/// 244 random bits (two v4 UUIDs), hex.
fn random_hex() -> String {
    uuid::Uuid::new_v4().simple().to_string() + &uuid::Uuid::new_v4().simple().to_string()
}

/// The cookie's name on node `node`: `lh_session_` and the node id's letters, digits, `-` and
/// `_` (other characters as `_`).
pub(crate) fn cookie_name(node: &str) -> String {
    let id: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("lh_session_{id}")
}

/// Compares without stopping at the first difference.
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Sessions {
    /// A new session; its `Set-Cookie` value for node `node`.
    pub(crate) fn open(&self, node: &str) -> (SignedIn, String) {
        let (id, csrf) = (random_hex(), random_hex());
        let mut map = self.inner.lock().expect("sessions");
        let now = Instant::now();
        map.retain(|_, s| s.expires > now);
        if map.len() >= MAX_SESSIONS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            id.clone(),
            Session {
                csrf: csrf.clone(),
                expires: now + SESSION_TTL,
            },
        );
        let cookie = format!(
            "{}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}",
            cookie_name(node),
            SESSION_TTL.as_secs()
        );
        (SignedIn { id, csrf }, cookie)
    }

    /// The visitor's session on node `node`, if its cookie names a live one.
    pub(crate) fn current(&self, node: &str, headers: &HeaderMap) -> Option<SignedIn> {
        let name = cookie_name(node);
        let id = headers
            .get_all(axum::http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.to_string())?;
        let map = self.inner.lock().expect("sessions");
        let s = map.get(&id).filter(|s| s.expires > Instant::now())?;
        Some(SignedIn {
            csrf: s.csrf.clone(),
            id,
        })
    }

    /// Ends session `id`; the `Set-Cookie` value that clears it.
    pub(crate) fn close(&self, node: &str, id: &str) -> String {
        self.inner.lock().expect("sessions").remove(id);
        format!(
            "{}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0",
            cookie_name(node)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_session_is_found_only_by_its_own_nodes_cookie() {
        let sessions = Sessions::default();
        let (s, cookie) = sessions.open("n1");
        assert!(cookie.starts_with(&format!("lh_session_n1={}; ", s.id)));
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        let mut h = HeaderMap::new();
        let v = format!("other=1; lh_session_n1={}; lh_session_n2=zz", s.id);
        h.insert(
            axum::http::header::COOKIE,
            HeaderValue::from_str(&v).unwrap(),
        );
        assert_eq!(sessions.current("n1", &h).unwrap().csrf, s.csrf);
        // Node n2 sees n1's cookie (cookies ignore ports) but never its session.
        assert!(sessions.current("n2", &h).is_none());
        sessions.close("n1", &s.id);
        assert!(sessions.current("n1", &h).is_none());
        assert_eq!(cookie_name("a.b c"), "lh_session_a_b_c");
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
