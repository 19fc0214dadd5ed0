//! The test build's hook (the `test-hooks` feature, which the browser suite's build enables and
//! the npm package's never does): traps the instance on purpose, so that the suite reaches the
//! package's crash recovery, which no real request should.

use js_sys::Promise;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

use crate::{js_error, Engine};

#[wasm_bindgen]
impl Engine {
    /// Traps the instance as a bug would, `how`: 'panic' (a Rust panic, which aborts:
    /// `RuntimeError: unreachable`), 'stack_overflow' (unbounded recursion), or 'panic_in_future'
    /// (a panic in the returned promise's future, as in a step: the promise never settles, and the
    /// trap surfaces as the worker's uncaught error). A method, so that a trap leaves the engine
    /// borrowed, as a real one would.
    #[wasm_bindgen(js_name = trapForTest)]
    pub fn trap_for_test(&self, how: &str) -> Result<Promise, JsValue> {
        match how {
            "panic" => panic!("the test hook's panic"),
            "stack_overflow" => Ok(Promise::resolve(&JsValue::from_f64(recurse(0) as f64))),
            "panic_in_future" => Ok(future_to_promise(panic_when_polled())),
            _ => Err(js_error("invalid_option", &format!("unknown trap {how:?}: expected 'panic', 'stack_overflow' or 'panic_in_future'"))),
        }
    }
}

/// Recurses until the stack overflows: each frame keeps its value live across the call, so that
/// no optimisation turns the recursion into a loop (`u64::MAX` is never reached).
fn recurse(depth: u64) -> u64 {
    if std::hint::black_box(depth) == u64::MAX {
        return 0;
    }
    std::hint::black_box(recurse(depth + 1)) ^ depth
}

async fn panic_when_polled() -> Result<JsValue, JsValue> {
    panic!("the test hook's panic in a future");
}
