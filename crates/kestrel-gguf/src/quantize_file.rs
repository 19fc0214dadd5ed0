//! Whole-model conversion: each tensor is read, re-encoded as the type `quantize_recipe`
//! chose for it and written, streaming, so the model is never held in memory at once.

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use crate::error::GgufError;
use crate::file::{io_error, stream_file};
use crate::metadata::{Metadata, MetadataValue};
use crate::quant::{dequantize, quantize};
use crate::quantize_recipe::{plan, Choice, QuantizeTarget};
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
    /// Tensors re-encoded (to the target or to the type the recipe picked).
    pub converted: usize,
    /// Tensors whose rows are not whole blocks of the wanted type, written as llama.cpp's
    /// fallback type instead (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, otherwise F16).
    pub fallback: usize,
    /// Tensors copied unchanged (not quantized, or already of their output type).
    pub copied: usize,
    /// Output tensors per type, in ggml id order, types with no tensor left out.
    pub by_type: Vec<(GgmlType, usize)>,
    pub input_bytes: u64,
    pub output_bytes: u64,
}

/// Converts the model at `input` as `target` says (a `GgmlType` converts into a pure
/// target), writing `output`; `progress` gets (tensors done, tensor count). A partial output
/// is removed on failure.
pub fn quantize_model(
    input: &Path,
    output: &Path,
    target: impl Into<QuantizeTarget>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<QuantizeReport, GgufError> {
    let target = target.into();
    let file_type = target.file_type()?;
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
    target: QuantizeTarget,
    file_type: u32,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<QuantizeReport, GgufError> {
    let mut writer: Option<GgufWriter<BufWriter<File>>> = None;
    let mut choices: Vec<Choice> = Vec::new();
    let mut report = QuantizeReport::default();
    let mut done = 0;
    stream_file(input, &mut |event| {
        match event {
            StreamEvent::Header(header) => {
                let mut metadata: Metadata = header.metadata.clone();
                metadata.set(FILE_TYPE_KEY, MetadataValue::U32(file_type));
                metadata.set(QUANTIZATION_VERSION_KEY, MetadataValue::U32(QUANTIZATION_VERSION));
                choices = plan(&header.metadata, &header.tensors, target)?;
                // Tensors are written in the input's data order so that each one can be
                // converted and written as soon as it is read.
                let specs: Vec<TensorSpec> = header
                    .data_order()
                    .into_iter()
                    .filter_map(|i| Some((header.tensors.get(i)?, choices.get(i)?)))
                    .map(|(t, choice)| TensorSpec { name: t.name.clone(), dims: t.dims.clone(), ggml_type: choice.ty })
                    .collect();
                report.tensors = specs.len();
                report.by_type = count_types(specs.iter().map(|s| s.ggml_type));
                let file = File::create(output).map_err(io_error(output))?;
                let w = GgufWriter::new(BufWriter::new(file), &metadata, &specs);
                writer = Some(w.map_err(at_output(output))?);
            }
            StreamEvent::Tensor { index, info, bytes } => {
                let choice = choices.get(index).copied().unwrap_or(Choice { ty: info.ggml_type, fallback: false });
                report.fallback += usize::from(choice.fallback);
                let converted = if choice.ty == info.ggml_type {
                    report.copied += 1;
                    None
                } else {
                    report.converted += 1;
                    Some(convert_tensor(info, bytes, choice.ty)?)
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

/// How many of `types` are of each type, in ggml id order.
fn count_types(types: impl Iterator<Item = GgmlType> + Clone) -> Vec<(GgmlType, usize)> {
    GgmlType::ALL.iter().map(|&ty| (ty, types.clone().filter(|&t| t == ty).count())).filter(|&(_, n)| n > 0).collect()
}

/// The writer does not know the output's path; this puts it into its I/O errors.
fn at_output(output: &Path) -> impl Fn(GgufError) -> GgufError + '_ {
    move |e| match e {
        GgufError::Io { source, .. } => io_error(output)(source),
        other => other,
    }
}

fn convert_tensor(info: &TensorInfo, bytes: &[u8], to: GgmlType) -> Result<Vec<u8>, GgufError> {
    let name_it = |e| GgufError::InTensor { name: info.name.clone(), source: Box::new(e) };
    let mut values = vec![0f32; info.n_elements() as usize];
    dequantize(info.ggml_type, bytes, &mut values).map_err(name_it)?;
    quantize(to, &values).map_err(name_it)
}
