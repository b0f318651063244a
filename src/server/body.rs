//! Request bodies under stated bounds, read before any handler runs.
//!
//! - A `Content-Length` over the route's limit gets 413 at once: the body is never read, and an
//!   `Expect: 100-continue` client never gets `100 Continue`.
//! - The whole body must arrive within `timeout` (408), and a body that turns out longer than
//!   the limit stops being read there (413).
//! - Memory: the first [`SMALL_PART`] bytes of each body come from one byte budget and the rest
//!   from another, both shared by every connection. Stalled large bodies can exhaust the large
//!   budget, but an ordinary AdmissionReview or extender call (tens of KB) is served from the
//!   small one. A body that cannot get its bytes within its `timeout` gets 429.
//!
//! Every refusal is JSON with the reason, and counted in `gpu_share_requests_total`. Every answer
//! carries `Server-Timing: read;dur=<ms>, handle;dur=<ms>`: the time the body took to arrive and
//! the time the handler took.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use bytes::BytesMut;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;
use crate::shared::json_error;

/// The part of each body drawn from the small budget.
pub const SMALL_PART: usize = 64 << 10;

/// The byte budgets shared by every request of a listener.
pub struct BodyBudget {
    small: Arc<Semaphore>,
    large: Arc<Semaphore>,
    small_bytes: usize,
    large_bytes: usize,
    /// How long a body may take to arrive.
    pub timeout: Duration,
}

impl BodyBudget {
    /// `small_bytes` for the first 64 KiB of each body, `large_bytes` for the rest.
    pub fn new(small_bytes: usize, large_bytes: usize, timeout: Duration) -> Self {
        let cap = |n: usize| n.min(Semaphore::MAX_PERMITS);
        BodyBudget {
            small: Arc::new(Semaphore::new(cap(small_bytes))),
            large: Arc::new(Semaphore::new(cap(large_bytes))),
            small_bytes: cap(small_bytes),
            large_bytes: cap(large_bytes),
            timeout,
        }
    }

    /// Bytes of bodies held now.
    pub fn held(&self) -> usize {
        (self.small_bytes - self.small.available_permits())
            + (self.large_bytes - self.large.available_permits())
    }
}

/// The bounds of one route.
pub struct BodyRule {
    /// The endpoint label in metrics (`mutate`, `filter`, ...).
    pub endpoint: &'static str,
    pub limit: usize,
    pub budget: Arc<BodyBudget>,
    pub metrics: Arc<Metrics>,
}

/// Held for the request's lifetime: the bytes its body takes.
#[derive(Default)]
struct Held(Vec<OwnedSemaphorePermit>);

enum Refusal {
    TooLarge(String),
    Slow(String),
    Busy(String),
    Broken(String),
}

/// The middleware: reads the body under the rule's bounds, then runs the handler on it.
pub async fn bounded(State(rule): State<Arc<BodyRule>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let (parts, body) = req.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let read = match declared {
        Some(n) if n > rule.limit as u64 => Err(Refusal::TooLarge(format!(
            "request body of {n} bytes is over the {} limit for {}",
            human(rule.limit),
            parts.uri.path()
        ))),
        _ => read_body(&rule, body).await,
    };
    let (bytes, held) = match read {
        Ok(x) => x,
        Err(refusal) => {
            let (status, outcome, message) = match refusal {
                Refusal::TooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large", m),
                Refusal::Slow(m) => (StatusCode::REQUEST_TIMEOUT, "body_timeout", m),
                Refusal::Busy(m) => (StatusCode::TOO_MANY_REQUESTS, "busy", m),
                Refusal::Broken(m) => (StatusCode::BAD_REQUEST, "bad_request", m),
            };
            rule.metrics
                .observe(rule.endpoint, outcome, start.elapsed());
            tracing::debug!(endpoint = rule.endpoint, %status, reason = %message, "request body refused");
            let mut response = json_error(status, &message);
            if status == StatusCode::TOO_MANY_REQUESTS {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            }
            if status != StatusCode::BAD_REQUEST {
                // The rest of the body was not read: the connection cannot carry another request.
                response.headers_mut().insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
            }
            return response;
        }
    };
    let read = start.elapsed();
    let handled = Instant::now();
    let mut response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    drop(held);
    // The service's own time, for load tests and browsers' network panels (W3C Server Timing).
    let timing = format!(
        "read;dur={:.3}, handle;dur={:.3}",
        read.as_secs_f64() * 1e3,
        handled.elapsed().as_secs_f64() * 1e3
    );
    if let Ok(v) = header::HeaderValue::from_str(&timing) {
        response.headers_mut().insert("server-timing", v);
    }
    response
}

async fn read_body(rule: &BodyRule, body: Body) -> Result<(bytes::Bytes, Held), Refusal> {
    let deadline = tokio::time::Instant::now() + rule.budget.timeout;
    let slow = || {
        Refusal::Slow(format!(
            "the request body did not arrive within {}s",
            rule.budget.timeout.as_secs_f64()
        ))
    };
    let mut body = body;
    // Each chunk is copied out as it arrives (so the connection's read buffer is not kept
    // alive by it) and the body is joined at the end: the memory a body holds is what it has
    // taken from the budget, never the size it declares (a stalled body that declared 4 MiB
    // and sent 16 KiB holds 16 KiB).
    let mut parts: Vec<bytes::Bytes> = Vec::new();
    let mut len = 0usize;
    let mut held = Held::default();
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(slow()),
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(Refusal::Broken(format!(
                    "reading the request body failed: {e}"
                )));
            }
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if len + data.len() > rule.limit {
            return Err(Refusal::TooLarge(format!(
                "request body is over the {} limit",
                human(rule.limit)
            )));
        }
        // What this chunk takes from each budget.
        let small = data.len().min(SMALL_PART.saturating_sub(len));
        let large = data.len() - small;
        for (n, pool) in [(small, &rule.budget.small), (large, &rule.budget.large)] {
            if n == 0 {
                continue;
            }
            let permit =
                tokio::time::timeout_at(deadline, pool.clone().acquire_many_owned(n as u32))
                    .await
                    .map_err(|_| {
                        Refusal::Busy(format!(
                            "too many request bodies in flight: {} of {} held; retry",
                            human(rule.budget.held()),
                            human(rule.budget.small_bytes + rule.budget.large_bytes)
                        ))
                    })?
                    .map_err(|_| Refusal::Busy("the service is shutting down".into()))?;
            held.0.push(permit);
        }
        len += data.len();
        parts.push(bytes::Bytes::copy_from_slice(&data));
    }
    let bytes = match parts.len() {
        0 => bytes::Bytes::new(),
        1 => parts.pop().unwrap_or_default(),
        _ => {
            let mut buf = BytesMut::with_capacity(len);
            for p in parts {
                buf.extend_from_slice(&p);
            }
            buf.freeze()
        }
    };
    Ok((bytes, held))
}

/// `4 MiB`, `64 KiB`, `17 B`.
pub fn human(bytes: usize) -> String {
    match bytes {
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_words() {
        assert_eq!(human(4 << 20), "4 MiB");
        assert_eq!(human(64 << 10), "64 KiB");
        assert_eq!(human(17), "17 B");
        assert_eq!(human((1 << 20) + (1 << 19)), "1.5 MiB");
    }
}
