//! Whole-model conversion to a plain ggml type, with llama.cpp's rules for which tensors to
//! convert (llama-quant.cpp): only tensors of two or more dimensions are quantized; a tensor
//! whose row length is not a whole number of the target's blocks falls back to F16.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use crate::error::GgufError;
use crate::file::{io_error, stream_file};
use crate::metadata::{Metadata, MetadataValue};
use crate::quant::{dequantize, quantize};
use crate::stream::StreamEvent;
use crate::tensor::TensorInfo;
use crate::types::GgmlType;
use crate::writer::{GgufWriter, TensorSpec};

const FILE_TYPE_KEY: &str = "general.file_type";
const QUANTIZATION_VERSION_KEY: &str = "general.quantization_version";
/// ggml's GGML_QNT_VERSION, which llama.cpp writes into every file it quantizes.
const QUANTIZATION_VERSION: u32 = 2;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuantizeReport {
    pub tensors: usize,
    /// Tensors converted to the target type.
    pub converted: usize,
    /// Tensors that fell back to F16 because their rows are not whole blocks.
    pub fallback_f16: usize,
    /// Tensors copied unchanged (1-D, or already of the target type).
    pub copied: usize,
    pub input_bytes: u64,
    pub output_bytes: u64,
}

/// llama.cpp's LLAMA_FTYPE for a file whose weights are mostly `target`.
fn llama_file_type(target: GgmlType) -> Option<u32> {
    match target {
        GgmlType::F32 => Some(0),
        GgmlType::F16 => Some(1),
        GgmlType::Q4_0 => Some(2),
        GgmlType::Q4_1 => Some(3),
        GgmlType::Q8_0 => Some(7),
        _ => None,
    }
}

/// Dimensions ignoring trailing ones, as ggml_n_dims counts them.
fn effective_dims(t: &TensorInfo) -> usize {
    t.dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1)
}

/// The type `t` gets in the output.
fn output_type(t: &TensorInfo, target: GgmlType) -> GgmlType {
    if effective_dims(t) < 2 {
        return t.ggml_type;
    }
    match t.dims.first() {
        Some(&cols) if cols.is_multiple_of(target.block_size()) => target,
        _ => GgmlType::F16,
    }
}

/// Converts the model at `input` to `target` (F32, F16, Q4_0, Q4_1 or Q8_0), writing
/// `output`; `progress` gets (tensors done, tensor count). A partial output is removed on
/// failure.
pub fn quantize_model(
    input: &Path,
    output: &Path,
    target: GgmlType,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<QuantizeReport, GgufError> {
    let file_type = llama_file_type(target).ok_or(GgufError::UnsupportedType {
        ty: target,
        operation: "model quantization",
    })?;
    let result = convert(input, output, target, file_type, progress);
    if result.is_err() {
        // Best effort: the error being returned matters more than a failed cleanup.
        let _ = std::fs::remove_file(output);
    }
    result
}

fn convert(
    input: &Path,
    output: &Path,
    target: GgmlType,
    file_type: u32,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<QuantizeReport, GgufError> {
    let mut writer: Option<GgufWriter<BufWriter<File>>> = None;
    let mut out_types = Vec::new();
    let mut report = QuantizeReport::default();
    let mut done = 0;
    stream_file(input, &mut |event| {
        match event {
            StreamEvent::Header(header) => {
                let mut metadata: Metadata = header.metadata.clone();
                metadata.set(FILE_TYPE_KEY, MetadataValue::U32(file_type));
                metadata.set(
                    QUANTIZATION_VERSION_KEY,
                    MetadataValue::U32(QUANTIZATION_VERSION),
                );
                // Tensors are written in the input's data order so that each one can be
                // converted and written as soon as it is read.
                let specs: Vec<TensorSpec> = header
                    .data_order()
                    .into_iter()
                    .filter_map(|i| header.tensors.get(i))
                    .map(|t| TensorSpec {
                        name: t.name.clone(),
                        dims: t.dims.clone(),
                        ggml_type: output_type(t, target),
                    })
                    .collect();
                out_types = header
                    .tensors
                    .iter()
                    .map(|t| output_type(t, target))
                    .collect();
                report.tensors = specs.len();
                let file = File::create(output).map_err(io_error(output))?;
                let w = GgufWriter::new(BufWriter::new(file), &metadata, &specs);
                writer = Some(w.map_err(at_output(output))?);
            }
            StreamEvent::Tensor { index, info, bytes } => {
                let to = out_types.get(index).copied().unwrap_or(info.ggml_type);
                let converted = if to == info.ggml_type {
                    report.copied += 1;
                    None
                } else {
                    if to == target {
                        report.converted += 1;
                    } else {
                        report.fallback_f16 += 1;
                    }
                    Some(convert_tensor(info, bytes, to)?)
                };
                report.input_bytes += bytes.len() as u64;
                let data = converted.as_deref().unwrap_or(bytes);
                report.output_bytes += data.len() as u64;
                if let Some(w) = writer.as_mut() {
                    w.write_tensor(data).map_err(at_output(output))?;
                }
                done += 1;
                progress(done, report.tensors);
            }
        }
        Ok(())
    })?;
    if let Some(w) = writer {
        w.finish().map_err(at_output(output))?;
    }
    Ok(report)
}

/// The writer does not know the output's path; this puts it into its I/O errors.
fn at_output(output: &Path) -> impl Fn(GgufError) -> GgufError + '_ {
    move |e| match e {
        GgufError::Io { source, .. } => io_error(output)(source),
        other => other,
    }
}

fn convert_tensor(info: &TensorInfo, bytes: &[u8], to: GgmlType) -> Result<Vec<u8>, GgufError> {
    let name_it = |e| GgufError::InTensor {
        name: info.name.clone(),
        source: Box::new(e),
    };
    let mut values = vec![0f32; info.n_elements() as usize];
    dequantize(info.ggml_type, bytes, &mut values).map_err(name_it)?;
    quantize(to, &values).map_err(name_it)
}
