use crate::compiler::instructions::Instruction;
use crate::error::{Error, ErrorKind};

use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicU64, Ordering};
use std::sync::Arc;

/// The bytes of strings, lists and maps that one unit of fuel pays for.
///
/// Fuel bounds a template's time by its instructions; a few instructions can also make values
/// of any size (`{% set ns.s = ns.s ~ ns.s %}` in a loop doubles a string each turn), so the
/// memory of the values made is charged too, and the same budget bounds both.
pub(crate) const BYTES_PER_FUEL: u64 = 4;

thread_local! {
    /// The bytes of the values made on this thread so far (see [`note_made`]).
    static BYTES_MADE: Cell<u64> = const { Cell::new(0) };
}

/// Notes that a string, list or map of `bytes` bytes was made, for the fuel of the renders
/// under way on this thread.
pub(crate) fn note_made(bytes: usize) {
    BYTES_MADE.with(|made| made.set(made.get().wrapping_add(bytes as u64)));
}

fn bytes_made() -> u64 {
    BYTES_MADE.with(Cell::get)
}

/// Helper for tracking fuel consumption
pub struct FuelTracker {
    // The initial fuel level.
    initial: u64,
    // This should be an AtomicI64 but sadly 32bit targets do not necessarily have
    // AtomicI64 available.
    remaining: AtomicIsize,
    // `bytes_made()` when the tracker started, and the bytes already charged since.
    bytes_at_start: u64,
    bytes_charged: AtomicU64,
}

impl FuelTracker {
    /// Creates a new fuel tracker.
    ///
    /// The fuel tracker is always wrapped in an `Arc` so that it can be
    /// shared across nested invocations of the template evaluation.
    pub fn new(fuel: u64) -> Arc<FuelTracker> {
        Arc::new(FuelTracker {
            initial: fuel,
            remaining: AtomicIsize::new(fuel as isize),
            bytes_at_start: bytes_made(),
            bytes_charged: AtomicU64::new(0),
        })
    }

    /// Tracks an instruction, and the values made since the last one.  If it runs out of
    /// fuel an error is returned.
    pub fn track(&self, instr: &Instruction) -> Result<(), Error> {
        let made = bytes_made().wrapping_sub(self.bytes_at_start);
        let charged = self.bytes_charged.swap(made, Ordering::Relaxed);
        let fuel_to_consume = fuel_for_instruction(instr)
            + (made / BYTES_PER_FUEL).saturating_sub(charged / BYTES_PER_FUEL) as isize;
        if fuel_to_consume != 0 {
            let old_fuel = self.remaining.fetch_sub(fuel_to_consume, Ordering::Relaxed);
            if old_fuel - fuel_to_consume <= 0 {
                return Err(Error::from(ErrorKind::OutOfFuel));
            }
        }
        Ok(())
    }

    /// Returns the remaining fuel.
    pub fn remaining(&self) -> u64 {
        self.remaining.load(Ordering::Relaxed) as _
    }

    /// Returns the consumed fuel.
    pub fn consumed(&self) -> u64 {
        self.initial.saturating_sub(self.remaining())
    }
}

/// How much fuel does an instruction consume?
fn fuel_for_instruction(instruction: &Instruction) -> isize {
    match instruction {
        Instruction::BeginCapture(_)
        | Instruction::PushLoop(_)
        | Instruction::PushDidNotIterate
        | Instruction::PushWith
        | Instruction::PopFrame
        | Instruction::PopLoopFrame
        | Instruction::DupTop
        | Instruction::DiscardTop
        | Instruction::PushAutoEscape
        | Instruction::PopAutoEscape => 0,
        #[cfg(feature = "multi_template")]
        Instruction::ExportLocals => 0,
        #[cfg(feature = "macros")]
        Instruction::LoadBlocks | Instruction::BuildMacro(..) | Instruction::Return => 0,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use crate::Environment;

    fn render(src: &str) -> Result<String, String> {
        let mut env = Environment::new();
        env.set_fuel(Some(5_000_000));
        env.render_str(src, ()).map_err(|e| e.to_string())
    }

    #[test]
    fn fuel_pays_for_the_values_a_template_makes() {
        // Each of these makes gigabytes in a few hundred instructions.
        for src in [
            "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "{% set a = 'x' * 99999999 %}{% set b = a ~ 'b' %}{% set c = a ~ 'c' %}{% set d = a ~ 'd' %}{% set e = a ~ 'e' %}",
            "{% macro f(n, x) %}{% if n > 0 %}{{ f(n - 1, x ~ x ~ x ~ x) }}{% endif %}{% endmacro %}{{ f(12, 'x' * 1000) }}",
            // Made and dropped again, 2.4 GB in all: what is made counts, not what is kept.
            "{% for i in range(1000) %}{% set l = range(99999)|list %}{% endfor %}",
        ] {
            let err = render(src).expect_err(src);
            assert!(err.contains("out of fuel"), "{src}: {err}");
        }
        // Megabytes of text are far from the budget (5M fuel pays for 20 MB).
        let text = render("{% for i in range(1000) %}{{ 'word ' * 200 ~ i }}{% endfor %}").unwrap();
        assert_eq!(text.len(), 1000 * 1000 + 2890);
    }
}
