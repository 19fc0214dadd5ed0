//! Device errors nobody captured, and the loss of the device, recorded instead of panicking.
//!
//! wgpu's default handler for an uncaptured error panics, and a panic kills a wasm worker (and
//! the CLI): a failed buffer allocation or a device reset would end the user's session. Kestrel
//! records the first fault instead and reports it, with a code, from the call that was running.

use std::sync::{Arc, Mutex};

use crate::GpuError;

/// What went wrong on the device.
#[derive(Clone, Debug)]
enum Fault {
    /// The device is gone (driver reset, `destroy`, the browser reclaiming it): nothing on it
    /// works again, so this is never cleared.
    Lost(String),
    /// An allocation failed.
    OutOfMemory(String),
    /// A validation or internal error.
    Error(String),
}

/// The faults of one device, shared by its handlers and every clone of the [`crate::Gpu`].
#[derive(Clone, Default)]
pub(crate) struct DeviceFaults(Arc<Mutex<Option<Fault>>>);

impl DeviceFaults {
    /// Installs the recording handlers on `device`.
    pub(crate) fn install(device: &wgpu::Device) -> Self {
        let faults = Self::default();
        let on_error = faults.clone();
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            let fault = match &error {
                wgpu::Error::OutOfMemory { .. } => Fault::OutOfMemory(error.to_string()),
                _ => Fault::Error(error.to_string()),
            };
            on_error.record(fault);
        }));
        let on_lost = faults.clone();
        device.set_device_lost_callback(move |reason, message| on_lost.record(Fault::Lost(format!("{reason:?}: {message}"))));
        faults
    }

    fn record(&self, fault: Fault) {
        if let Ok(mut slot) = self.0.lock() {
            // A loss replaces an earlier error (it explains it); otherwise the first fault stays.
            if slot.is_none() || matches!(fault, Fault::Lost(_)) {
                *slot = Some(fault);
            }
        }
    }

    /// The recorded fault as an error: a loss stays recorded (every later call fails the same
    /// way), any other fault is reported once.
    pub(crate) fn check(&self) -> Result<(), GpuError> {
        let Ok(mut slot) = self.0.lock() else {
            return Err(GpuError::Device("the fault record was poisoned by a panic".into()));
        };
        match slot.take() {
            None => Ok(()),
            Some(Fault::Lost(message)) => {
                *slot = Some(Fault::Lost(message.clone()));
                Err(GpuError::DeviceLost(message))
            }
            Some(Fault::OutOfMemory(message)) => Err(GpuError::OutOfMemory(message)),
            Some(Fault::Error(message)) => Err(GpuError::Device(message)),
        }
    }
}
