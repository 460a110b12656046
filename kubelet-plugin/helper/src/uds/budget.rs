//! A bound on the memory the kubelet-facing servers spend on requests.
//!
//! HTTP/2 flow control does not bound it: tonic reads a request's message into a
//! buffer of its own as the bytes come (giving the client new window as it goes) until
//! the declared length (up to 4 MiB) is there, so every open stream of every
//! connection may hold a message's worth. Here every request body takes its bytes from
//! one budget shared by all calls of a server and gives them back when the call has
//! been answered; a call whose message would take the budget past its size fails with
//! RESOURCE_EXHAUSTED instead (the kubelet retries it).

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use futures::future::BoxFuture;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::Bytes;

/// Charges the request bodies of the services below it against one budget.
#[derive(Debug, Clone)]
pub(crate) struct RequestBudgetLayer {
    budget: Arc<Semaphore>,
    bytes: usize,
}

impl RequestBudgetLayer {
    /// A budget of `bytes` for the request messages of all calls in flight together.
    pub(crate) fn new(bytes: usize) -> Self {
        let bytes = bytes.min(Semaphore::MAX_PERMITS);
        Self {
            budget: Arc::new(Semaphore::new(bytes)),
            bytes,
        }
    }

    /// Bytes of the budget not taken now.
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.budget.available_permits()
    }
}

impl<S> tower::Layer<S> for RequestBudgetLayer {
    type Service = RequestBudget<S>;

    fn layer(&self, inner: S) -> RequestBudget<S> {
        RequestBudget {
            inner,
            budget: self.budget.clone(),
            bytes: self.bytes,
        }
    }
}

/// See [`RequestBudgetLayer`].
#[derive(Debug, Clone)]
pub(crate) struct RequestBudget<S> {
    inner: S,
    budget: Arc<Semaphore>,
    bytes: usize,
}

type Held = Arc<Mutex<Option<OwnedSemaphorePermit>>>;

impl<S> tower::Service<http::Request<Body>> for RequestBudget<S>
where
    S: tower::Service<http::Request<Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The bytes stay taken until the answer is ready, not only while the message
        // is read: tonic drops the body once it has decoded the message, and the
        // decoded claims take as much memory again while they are worked on.
        let held: Held = Arc::default();
        let budget = self.budget.clone();
        let bytes = self.bytes;
        let charged = held.clone();
        let request = request.map(move |body| {
            Body::new(Charged {
                inner: body,
                budget,
                bytes,
                held: charged,
            })
        });
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            drop(held);
            answer
        })
    }
}

/// A request body whose data frames take their size from the budget.
struct Charged {
    inner: Body,
    budget: Arc<Semaphore>,
    bytes: usize,
    held: Held,
}

impl http_body::Body for Charged {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
            let taken = u32::try_from(data.len())
                .ok()
                .and_then(|n| this.budget.clone().try_acquire_many_owned(n).ok());
            let Some(taken) = taken else {
                return Poll::Ready(Some(Err(Status::resource_exhausted(format!(
                    "the plugin is receiving or working on {} bytes of requests, its limit; retry later",
                    this.bytes
                )))));
            };
            let mut held = this.held.lock().unwrap_or_else(PoisonError::into_inner);
            match held.as_mut() {
                Some(permit) => permit.merge(taken),
                None => *held = Some(taken),
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
