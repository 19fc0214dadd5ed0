//! Parses arbitrary JSON as generation options, the way requests reach the engine: as
//! `GenerateOptions` itself and as the engine core's `Request` (the browser's and the server's: the
//! options flattened beside other fields, so serde buffers them, another deserializer path).
//!
//! Asserted: parsing either fails or gives options that validate, or fail validation with
//! an `invalid_option` error naming the option; valid options survive their wire format
//! (serialize, parse back: the same options).
#![no_main]

use kestrel_engine::Request;
use kestrel_engine::GenerateOptions;
use kestrel_model::ModelError;
use libfuzzer_sys::fuzz_target;

/// The default model's vocabulary size (token ids in options are checked against it).
const VOCAB: usize = 49152;

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
    match std::str::from_utf8(data).map(Request::parse) {
        Ok(Ok(request)) => check(&request.options),
        Ok(Err(e)) => assert_eq!(e.code, "invalid_option", "{e}"),
        Err(_) => {}
    }
});
