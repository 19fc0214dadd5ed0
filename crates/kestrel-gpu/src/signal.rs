//! A one-shot future completed by a wgpu callback (a buffer map, the queue's work done), which
//! may run on another thread natively. On wasm the callback comes from the browser's promise, so
//! awaiting never blocks the worker.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// The receiving and the sending side are clones of one signal.
pub(crate) struct Signal<T> {
    state: Arc<Mutex<(Option<T>, Option<Waker>)>>,
}

impl<T> Clone for Signal<T> {
    fn clone(&self) -> Self {
        Self { state: self.state.clone() }
    }
}

impl<T> Default for Signal<T> {
    fn default() -> Self {
        Self { state: Arc::new(Mutex::new((None, None))) }
    }
}

impl<T> Signal<T> {
    pub(crate) fn complete(&self, value: T) {
        let waker = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.0 = Some(value);
            state.1.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Future for Signal<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match state.0.take() {
            Some(value) => Poll::Ready(value),
            None => {
                state.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}
