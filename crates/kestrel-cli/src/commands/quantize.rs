use std::path::Path;

use kestrel_gguf::GgmlType;

use super::CliResult;

pub fn run(input: &Path, output: &Path, ty: &str) -> CliResult {
    let target = match ty.to_ascii_lowercase().as_str() {
        "q8_0" => GgmlType::Q8_0,
        "q4_0" => GgmlType::Q4_0,
        "q4_1" => GgmlType::Q4_1,
        "f16" => GgmlType::F16,
        "f32" => GgmlType::F32,
        other => return Err(format!("unknown --type {other:?} (q8_0, q4_0, q4_1, f16, f32)").into()),
    };
    let report = kestrel_gguf::quantize_model(input, output, target, &mut |done, total| {
        eprint!("\rquantizing: {done}/{total} tensors");
    })?;
    eprintln!();
    println!(
        "wrote {}: {} tensors ({} converted, {} kept, {} fell back to f16), {:.1} MiB -> {:.1} MiB",
        output.display(),
        report.tensors,
        report.converted,
        report.copied,
        report.fallback_f16,
        report.input_bytes as f64 / 1048576.0,
        report.output_bytes as f64 / 1048576.0
    );
    Ok(())
}
