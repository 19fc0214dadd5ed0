//! Parses arbitrary JSON as generation options, the way requests reach the engine: as
//! `GenerateOptions` itself and flattened into a request beside other fields (the wasm
//! engine's request: serde then buffers the fields, another deserializer path).
//!
//! Asserted: parsing either fails or gives options that validate, or fail validation with
//! an `invalid_option` error naming the option; valid options survive their wire format
//! (serialize, parse back: the same options).
#![no_main]

use kestrel_model::{GenerateOptions, ModelError};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;

/// The default model's vocabulary size (token ids in options are checked against it).
const VOCAB: usize = 49152;

#[derive(Deserialize)]
struct Request {
    #[serde(rename = "prompt")]
    _prompt: Option<String>,
    #[serde(flatten)]
    options: GenerateOptions,
}

fn check(options: &GenerateOptions) {
    match options.validate(VOCAB) {
        Ok(()) => {
            let json = serde_json::to_string(options).expect("valid options serialize");
            let back: GenerateOptions = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json} does not parse back: {e}"));
            assert_eq!(&back, options, "the wire format changed the options: {json}");
        }
        Err(e @ ModelError::InvalidOption { name, .. }) => {
            assert_eq!(e.code(), "invalid_option");
            assert!(e.to_string().contains(name), "{e} does not name {name}");
        }
        Err(e) => panic!("validation gave a {} error: {e}", e.code()),
    }
}

fuzz_target!(|data: &[u8]| {
    kestrel_fuzz::report_stack_overflows();
    if let Ok(options) = serde_json::from_slice::<GenerateOptions>(data) {
        check(&options);
    }
    if let Ok(request) = serde_json::from_slice::<Request>(data) {
        check(&request.options);
    }
});
