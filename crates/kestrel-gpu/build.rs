//! Tells the crate where its WGSL sources are (`KESTREL_SHADERS_DIR`, for `include_str!` in
//! src/shaders.rs): the repository's top-level `shaders/`, where the kernels live beside the
//! crates, or the crate's own `shaders/`, which a copy of the crate packaged alone carries (a
//! package holds only files under its manifest's folder, so its release step copies them in).

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let candidates = [manifest.join("shaders"), manifest.join("../../shaders")];
    let Some(dir) = candidates.iter().find(|dir| dir.join("quant.wgsl").is_file()) else {
        panic!("kestrel-gpu: no WGSL sources in {} or {}", candidates[0].display(), candidates[1].display());
    };
    let dir = dir.canonicalize().unwrap_or_else(|e| panic!("kestrel-gpu: {}: {e}", dir.display()));
    // A directory: cargo scans everything in it, so a new or removed kernel file reruns this.
    println!("cargo:rerun-if-changed={}", dir.display());
    println!("cargo:rustc-env=KESTREL_SHADERS_DIR={}", dir.display());
}
