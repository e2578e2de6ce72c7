//! A response body that holds something (a share of the memory budget, a mark that an answer is
//! still unsent) until hyper drops it: the answer sent in full, or its stream or connection gone.
//! So what an answer holds lasts as long as the answer itself, not only until it is made: a
//! client that never opens its HTTP/2 flow-control window keeps it, and is bounded by it.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::response::Response;
use hyper::body::{Frame, SizeHint};

/// `inner`, holding `guard` until dropped.
pub struct Held<G> {
    inner: Body,
    _guard: G,
}

/// `response` with `guard` held until its body is dropped.
pub fn hold<G: Send + Unpin + 'static>(response: Response, guard: G) -> Response {
    response.map(|inner| {
        Body::new(Held {
            inner,
            _guard: guard,
        })
    })
}

impl<G: Unpin> HttpBody for Held<G> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
