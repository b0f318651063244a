//! kube's mock API service for unit tests: a client, the handle that answers its requests, and
//! the responses it sends.

use http::{Request, Response};
use kube::client::Body;

/// The server side: `next_request()` gives each request and the means to answer it.
pub type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// A client whose every request goes to the returned handle.
pub fn client() -> (kube::Client, Handle) {
    let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(svc, "default"), handle)
}

/// A response with `status` and `body` as it is.
pub fn text(status: u16, body: impl Into<Vec<u8>>) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(body.into()))
        .expect("a status code and a body make a response")
}

/// A response with `status` and `body` as JSON.
pub fn json(status: u16, body: &serde_json::Value) -> Response<Body> {
    text(status, body.to_string())
}
