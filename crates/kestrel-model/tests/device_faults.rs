//! Failures of the device in the middle of a generation: each gives a coded error instead of a
//! panic, and the model (or a model loaded on a new device) works again afterwards.

mod common;

use kestrel_engine::generation::{GenerateOptions, Generator, Prompt};
use kestrel_model::ModelError;

fn options() -> GenerateOptions {
    GenerateOptions { max_tokens: 8, ignore_eos: true, ..GenerateOptions::greedy() }
}

/// Generates from "Hello", calling `at_token` with each token's index.
fn generate(model: &mut Generator, at_token: &mut dyn FnMut(usize)) -> Result<Vec<u32>, ModelError> {
    let prompt = model.encode(&Prompt::Text("Hello")).expect("encode");
    let mut index = 0;
    let generation = pollster::block_on(model.generate(&prompt, &options(), &mut |_| {
        at_token(index);
        index += 1;
        true
    }))?;
    Ok(generation.tokens)
}

/// The small synthetic model on a device of its own (each test here breaks its device, which must
/// not go back to the shared pool), and the tokens it generates while the device is sound.
fn sound_model() -> (kestrel_gpu::Gpu, Generator, Vec<u32>) {
    let gpu = common::own_gpu();
    let mut model = Generator::new(common::load_on(&gpu, &common::synthetic::QWEN3_F32.write(), 64));
    let expected = generate(&mut model, &mut |_| {}).expect("generate while the device is sound");
    (gpu, model, expected)
}

#[test]
fn device_lost_mid_generation_is_coded_and_a_new_device_works() {
    let (gpu, mut model, expected) = sound_model();
    assert_eq!(expected.len(), options().max_tokens);

    let err = generate(&mut model, &mut |i| {
        if i == 2 {
            gpu.device.destroy();
        }
    })
    .expect_err("a generation across a device loss must fail");
    assert_eq!(err.code(), "device_lost", "{err}");
    // The loss is for good: the next request on the same model fails the same way, not with a panic.
    let err = generate(&mut model, &mut |_| {}).expect_err("a lost device stays lost");
    assert_eq!(err.code(), "device_lost", "{err}");

    // A new device loads the model again and gives the same tokens as before the loss.
    let mut model = Generator::new(common::load_on(&common::own_gpu(), &common::synthetic::QWEN3_F32.write(), 64));
    assert_eq!(generate(&mut model, &mut |_| {}).expect("generate on a new device"), expected);
}

#[test]
fn failed_allocation_mid_generation_is_coded_and_the_next_request_works() {
    let (gpu, mut model, expected) = sound_model();

    // A buffer larger than the device allows fails on the device, outside any error scope: the
    // error wgpu would otherwise turn into a panic.
    let err = generate(&mut model, &mut |i| {
        if i == 2 {
            let size = gpu.limits.max_buffer_size.saturating_add(4);
            let _ = gpu.device.create_buffer(&kestrel_gpu::wgpu::BufferDescriptor {
                label: Some("too large"),
                size,
                usage: kestrel_gpu::wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            });
        }
    })
    .expect_err("a generation during a device error must fail");
    assert_eq!(err.code(), "gpu", "{err}");
    assert!(err.to_string().contains("too large"), "{err}");
    // The error was this request's: the next one runs, from a fresh prefill, to the same tokens.
    assert_eq!(generate(&mut model, &mut |_| {}).expect("generate after the error"), expected);
}
