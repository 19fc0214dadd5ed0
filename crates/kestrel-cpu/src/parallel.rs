//! The rows of a product, split over rayon's pool natively; one thread in wasm.

/// The fewest rows a task takes: enough work to hide the pool's hand-off.
#[cfg(not(target_arch = "wasm32"))]
const ROWS_PER_TASK: usize = 64;

/// Calls `f(first_row, out)` for consecutive runs of rows, `out` holding `per_row` values for
/// each row of the run; every run but the last is a multiple of `align` rows (a matrix's
/// interleaved groups).
pub fn for_row_chunks(out: &mut [f32], per_row: usize, align: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if per_row == 0 {
        return;
    }
    #[cfg(not(target_arch = "wasm32"))]
    if rayon::current_num_threads() > 1 && out.len() / per_row > ROWS_PER_TASK {
        use rayon::prelude::*;
        let rows = out.len() / per_row;
        // About four tasks a thread, so that a thread slowed by another process does not hold
        // up the product, and no fewer rows a task than ROWS_PER_TASK.
        let task = rows.div_ceil(4 * rayon::current_num_threads()).max(ROWS_PER_TASK).next_multiple_of(align.max(1));
        out.par_chunks_mut(task * per_row).enumerate().for_each(|(i, run)| f(i * task, run));
        return;
    }
    // One thread: the whole run at once, without the pool's splitting (so no runs to align).
    let _ = align;
    f(0, out);
}

/// Calls `f(i, chunk)` for each `len`-value chunk of `out`, one task each.
pub(crate) fn for_each_chunk(out: &mut [f32], len: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if len == 0 {
        return;
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        out.par_chunks_mut(len).enumerate().for_each(|(i, chunk)| f(i, chunk));
    }
    #[cfg(target_arch = "wasm32")]
    for (i, chunk) in out.chunks_mut(len).enumerate() {
        f(i, chunk);
    }
}

/// The CPU backend's pool (`RAYON_NUM_THREADS` threads, default one per core). A step runs on
/// it as a whole (`on_pool`): its products then split rows among threads that are already awake,
/// where a product started from outside would hand its work over and sleep until it is done,
/// two context switches per product. None where the threads could not be started.
#[cfg(not(target_arch = "wasm32"))]
fn pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: std::sync::OnceLock<Option<rayon::ThreadPool>> = std::sync::OnceLock::new();
    POOL.get_or_init(|| rayon::ThreadPoolBuilder::new().thread_name(|i| format!("kestrel-cpu-{i}")).build().ok()).as_ref()
}

/// Runs `f` on the CPU backend's thread pool (on the caller's thread in wasm, or where the pool
/// could not start).
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    #[cfg(not(target_arch = "wasm32"))]
    if let Some(pool) = pool() {
        return pool.install(f);
    }
    f()
}

/// Calls `f` on each task, over the CPU backend's pool natively (one task a thread at a time,
/// in any order), one after another in wasm; the first error is returned.
pub(crate) fn try_each_on_pool<T: Send, E: Send>(tasks: Vec<T>, f: impl Fn(T) -> Result<(), E> + Sync + Send) -> Result<(), E> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        use rayon::prelude::*;
        on_pool(|| tasks.into_par_iter().try_for_each(f))
    }
    #[cfg(target_arch = "wasm32")]
    tasks.into_iter().try_for_each(f)
}

pub(crate) fn threads() -> usize {
    #[cfg(not(target_arch = "wasm32"))]
    return pool().map_or(1, rayon::ThreadPool::current_num_threads);
    #[cfg(target_arch = "wasm32")]
    return 1;
}

/// The pool's copy bandwidth in GB/s (bytes read plus bytes written, a second), over two buffers
/// of `bytes` copied by all its threads, the best of 5 after a warm-up: the bench's roofline of a
/// decode step, which streams every weight once, as the GPU's copy kernel is the GPU's.
#[cfg(not(target_arch = "wasm32"))]
pub fn copy_bandwidth(bytes: usize) -> f64 {
    use rayon::prelude::*;
    let source = vec![1u8; bytes];
    let mut target = vec![0u8; bytes];
    let chunk = bytes.div_ceil(4 * threads()).max(1);
    let mut copy = || {
        let start = std::time::Instant::now();
        on_pool(|| target.par_chunks_mut(chunk).zip(source.par_chunks(chunk)).for_each(|(t, s)| t.copy_from_slice(s)));
        start.elapsed().as_secs_f64()
    };
    copy();
    let best = (0..5).map(|_| copy()).fold(f64::INFINITY, f64::min);
    2.0 * bytes as f64 / best.max(1e-9) / 1e9
}
