use std::path::Path;

use kestrel_gguf::{GgmlType, QuantizeTarget};

use super::CliResult;

const TYPES: &str = "q4_k_m, q8_0, q6_k, q5_k, q5_1, q5_0, q4_k, q4_1, q4_0, f16, f32";

pub fn run(input: &Path, output: &Path, ty: &str) -> CliResult {
    let target = match ty.to_ascii_lowercase().as_str() {
        "q4_k_m" => QuantizeTarget::Q4KM,
        "q8_0" => GgmlType::Q8_0.into(),
        "q6_k" => GgmlType::Q6_K.into(),
        "q5_k" => GgmlType::Q5_K.into(),
        "q5_1" => GgmlType::Q5_1.into(),
        "q5_0" => GgmlType::Q5_0.into(),
        "q4_k" => GgmlType::Q4_K.into(),
        "q4_1" => GgmlType::Q4_1.into(),
        "q4_0" => GgmlType::Q4_0.into(),
        "f16" => GgmlType::F16.into(),
        "f32" => GgmlType::F32.into(),
        other => return Err(format!("unknown --type {other:?} ({TYPES})").into()),
    };
    let report = kestrel_gguf::quantize_model(input, output, target, &mut |done, total| {
        eprint!("\rquantizing: {done}/{total} tensors");
    })?;
    eprintln!();
    let by_type: Vec<String> = report.by_type.iter().map(|(ty, n)| format!("{n} {ty}")).collect();
    println!(
        "wrote {}: {} tensors ({}; {} converted, {} kept, {} with a fallback type for their row length), {:.1} MiB -> {:.1} MiB",
        output.display(),
        report.tensors,
        by_type.join(", "),
        report.converted,
        report.copied,
        report.fallback,
        report.input_bytes as f64 / 1048576.0,
        report.output_bytes as f64 / 1048576.0
    );
    Ok(())
}
