//! What the fuzz targets share: the default model's tokenizer, read once per process.
//!
//! The model is the one `./build.sh setup` fetches into the repository's `models/`;
//! `KESTREL_FUZZ_MODEL` names another GGUF file.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::sync::OnceLock;

use kestrel_gguf::{GgufHeader, GgufStreamReader};
use kestrel_tokenizer::Tokenizer;

/// The default model, relative to the repository root.
const DEFAULT_MODEL: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

fn model_path() -> PathBuf {
    match std::env::var_os("KESTREL_FUZZ_MODEL") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(DEFAULT_MODEL),
    }
}

/// Reads the model's header (metadata and tensor list) and none of its weights: the file
/// is streamed in chunks only until the stream reader has parsed the header.
fn read_header() -> Result<GgufHeader, String> {
    let path = model_path();
    let what = |e: &dyn std::fmt::Display| format!("{}: {e} (run ./build.sh setup, or set KESTREL_FUZZ_MODEL)", path.display());
    let mut file = File::open(&path).map_err(|e| what(&e))?;
    let mut reader = GgufStreamReader::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        if let Some(header) = reader.header() {
            return Ok(header.clone());
        }
        let n = file.read(&mut buf).map_err(|e| what(&e))?;
        if n == 0 {
            return Err(what(&"the file ends inside its header"));
        }
        reader.push(&buf[..n], &mut |_| Ok(())).map_err(|e| what(&e))?;
    }
}

/// Makes a stack overflow a reported crash. libFuzzer's SIGSEGV handler runs on the stack that
/// overflowed, so it faults again and the process dies without saving the input; on a stack of
/// its own (`sigaltstack`, with `SA_ONSTACK` added to libFuzzer's handler) it reports the crash
/// and writes the input to the artifacts. Call it from the target: libFuzzer installs its
/// handlers after `LLVMFuzzerInitialize`.
pub fn report_stack_overflows() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The alternate stack lives as long as the process: leaked on purpose.
        let stack: &'static mut [u8] = Box::leak(vec![0u8; 1 << 20].into_boxed_slice());
        // SAFETY: `stack` outlives every signal; the sigaction structs are plain data that
        // `sigaction` fills or reads.
        unsafe {
            let alt = libc::stack_t { ss_sp: stack.as_mut_ptr().cast(), ss_flags: 0, ss_size: stack.len() };
            if libc::sigaltstack(&alt, std::ptr::null_mut()) != 0 {
                return;
            }
            for signal in [libc::SIGSEGV, libc::SIGBUS] {
                let mut action: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, std::ptr::null(), &mut action) == 0 && action.sa_sigaction != libc::SIG_DFL {
                    action.sa_flags |= libc::SA_ONSTACK;
                    libc::sigaction(signal, &action, std::ptr::null_mut());
                }
            }
        }
    });
}

/// The default model's tokenizer, built on first use. A fuzz run without the model is
/// a setup error, so this panics (once, at the first input) rather than fuzz nothing.
pub fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let header = read_header().unwrap_or_else(|e| panic!("fuzz setup: {e}"));
        Tokenizer::from_gguf(&header.metadata).unwrap_or_else(|e| panic!("fuzz setup: the model's tokenizer: {e}"))
    })
}
